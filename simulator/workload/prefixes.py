"""Token identity of requests, for prefix caching: the keys of each request's full KV blocks
(engine/prefix_cache.py), equal keys meaning equal tokens and equal everything before them.

Two sources: a trace's prefix-block hash ids (`TraceBlockKeys`, e.g. Mooncake's hash_ids, one id
per 512 prompt tokens) and the synthetic conversation model (`ConversationKeys`, from
requests.sharing). Keys are plain ints, so runs are reproducible."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InfersimError
from .schema import SharingModel

# conversation c's own blocks get keys (c + 1) * _CONVERSATION_STRIDE + block index; shared
# system-prompt blocks keep their index, below the stride (no prompt has 2^40 blocks)
_CONVERSATION_STRIDE = 1 << 40


@dataclass
class TraceBlockKeys:
    """Keys from a trace's hash ids. One hash id covers `block_tokens` prompt tokens and names
    them and every token before them, so engine block j (block_size tokens, block_size dividing
    block_tokens) is sub-block j mod m of hash id ids[j // m], m = block_tokens / block_size, and
    gets the key id * m + j mod m: engine blocks are equal exactly when their trace blocks are.
    Only prompt blocks have keys (a trace names no output tokens)."""

    hash_ids: list  # per request, a sequence of non-negative ints
    block_tokens: int

    def keys(self, i: int, num_tokens: int, block_size: int) -> list[int]:
        m = self.block_tokens // block_size
        ids = np.asarray(self.hash_ids[i], dtype=np.int64)
        n = min(int(num_tokens) // block_size, len(ids) * m)
        j = np.arange(n, dtype=np.int64)
        return (ids[j // m] * m + j % m).tolist()

    def check_block_size(self, block_size: int, source: str) -> None:
        if self.block_tokens % block_size:
            raise InfersimError(
                f"{source}: serving.block_size {block_size} does not divide requests.trace.hash_block_tokens "
                f"{self.block_tokens}: prefix caching maps each hash id onto whole KV blocks"
            )


@dataclass
class ConversationKeys:
    """Keys of the synthetic conversation model: request i belongs to conversation
    `conversation[i]`, whose token stream is the system prompt followed by its turns (every
    prompt and every reply, in order), so block j of a conversation is the same block in each of
    its turns; a block wholly inside the system prompt is the same in every conversation."""

    conversation: np.ndarray  # int64 per request
    system_prompt_tokens: int

    def keys(self, i: int, num_tokens: int, block_size: int) -> list[int]:
        j = np.arange(int(num_tokens) // block_size, dtype=np.int64)
        own = (int(self.conversation[i]) + 1) * _CONVERSATION_STRIDE + j
        return np.where((j + 1) * block_size <= self.system_prompt_tokens, j, own).tolist()

    def check_block_size(self, block_size: int, source: str) -> None:
        pass


def conversation_turns(
    sharing: SharingModel, user_tokens: np.ndarray, output_tokens: np.ndarray, max_prompt_tokens: int | None
) -> tuple[np.ndarray, ConversationKeys]:
    """Prompt lengths and keys of `requests.sharing`: request i continues conversation slot
    i mod conversations with a new user message of user_tokens[i] tokens (SharingModel)."""
    n = len(user_tokens)
    slots = sharing.conversations
    history = [0] * slots  # tokens of the slot's conversation so far (0: none yet)
    turns = [0] * slots
    conv_of_slot = list(range(slots))
    next_conv = slots
    prompt = np.empty(n, dtype=np.int64)
    conversation = np.empty(n, dtype=np.int64)
    sys_tokens = sharing.system_prompt_tokens
    for i in range(n):
        s = i % slots
        p = history[s] + int(user_tokens[i]) if turns[s] else sys_tokens + int(user_tokens[i])
        if turns[s] and (turns[s] >= sharing.max_turns or (max_prompt_tokens is not None and p > max_prompt_tokens)):
            conv_of_slot[s], next_conv, turns[s] = next_conv, next_conv + 1, 0
            p = sys_tokens + int(user_tokens[i])
        prompt[i] = p
        conversation[i] = conv_of_slot[s]
        history[s] = p + int(output_tokens[i])
        turns[s] += 1
    return prompt, ConversationKeys(conversation, sys_tokens)
