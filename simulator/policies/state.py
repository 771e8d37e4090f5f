"""What a policy sees and what it returns. No SimPy, no engine internals: the simulator and
the real executor both build a `SchedulerState` from their own sequences and carry out the
returned `Decision`.

A sequence, to a policy, is any object with these attributes (duck-typed):
  rid, arrival_s, first_enqueue_s, prompt_len, generated, num_tokens (prompt + generated),
  computed (tokens whose KV is cached), num_gpu_blocks, num_cpu_blocks."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Literal, Protocol

from ..costmodel.base import CostModel

PreemptMode = Literal["swap", "recompute"]  # what a decision carries out (stalls never get here)


class SeqLike(Protocol):
    rid: int
    arrival_s: float
    first_enqueue_s: float
    prompt_len: int
    generated: int
    computed: int
    num_gpu_blocks: int
    num_cpu_blocks: int

    @property
    def num_tokens(self) -> int: ...


class AllocStatus(Enum):
    """vLLM's answer to "can this sequence's KV be allocated now?"."""

    OK = "ok"
    LATER = "later"  # not now: wait for blocks to free up
    NEVER = "never"  # not even with the whole pool: abort the request


@dataclass(frozen=True)
class SchedulerLimits:
    max_batch_size: int = 256
    max_batched_tokens: int = 2048
    max_model_len: int = 2048
    chunked_prefill: bool = False

    def abort_reason(self, num_tokens: int) -> str:
        """Why the scheduler aborted a sequence of `num_tokens` (it can never run): longer than
        the context, or more KV blocks than the whole GPU pool holds (the only two causes)."""
        return "exceeds_context" if num_tokens > self.max_model_len else "exceeds_kv_pool"


@dataclass
class SchedulerState:
    now_s: float
    waiting: list  # in arrival order (recomputed sequences go to the front, as vLLM)
    running: list
    swapped: list
    free_gpu_blocks: int
    free_cpu_blocks: int
    total_gpu_blocks: int
    block_size: int
    watermark_blocks: int
    kv_bytes_per_block: float
    limits: SchedulerLimits
    cost_model: CostModel
    # separate host-link copies per swapped block (vLLM 0.2: one per layer for K and for V);
    # None: a sequence's KV moves as one contiguous copy
    kv_copies_per_block: int | None = None
    # GPU blocks preempting a sequence gives back; None: all it holds (with prefix caching,
    # blocks other sequences share stay)
    releasable_blocks: Callable[[Any], int] | None = None

    def freed_by_preempting(self, seq) -> int:
        return seq.num_gpu_blocks if self.releasable_blocks is None else self.releasable_blocks(seq)

    def swap_copies(self, blocks: int) -> int:
        return int(blocks) * self.kv_copies_per_block if self.kv_copies_per_block else 1

    def blocks_for_tokens(self, tokens: int) -> int:
        return -(-int(tokens) // self.block_size)

    def admission(self, tokens: int, free_blocks: int) -> AllocStatus:
        """vLLM's block-manager rule: keep `watermark_blocks` free after admitting, so that
        running sequences have room to grow without immediate preemption."""
        need = self.blocks_for_tokens(tokens)
        if self.total_gpu_blocks - need < self.watermark_blocks:
            return AllocStatus.NEVER
        return AllocStatus.OK if free_blocks - need >= self.watermark_blocks else AllocStatus.LATER

    def new_blocks_for_step(self, seq: Any, query_tokens: int) -> int:
        """Blocks a sequence must gain to write the KV of `query_tokens` more tokens."""
        return max(0, self.blocks_for_tokens(seq.computed + query_tokens) - seq.num_gpu_blocks)


@dataclass
class Decision:
    preempt: list[tuple[Any, PreemptMode]] = field(default_factory=list)
    swap_in: list = field(default_factory=list)
    admit: list = field(default_factory=list)  # from waiting: blocks allocated for the whole prompt
    abort: list = field(default_factory=list)  # can never fit (NEVER / over-long): from waiting or swapped
    batch: list[tuple[Any, int]] = field(default_factory=list)  # (sequence, query tokens) to run now

    @property
    def is_plain_decode(self) -> bool:
        """True when nothing moves between queues and every sequence decodes one token:
        the engine may then repeat this decision until the next event."""
        if self.preempt or self.swap_in or self.admit or self.abort:
            return False
        return all(n == 1 and seq.computed == seq.num_tokens - 1 for seq, n in self.batch)
