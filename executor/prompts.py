"""Real prompts for workloads that only give lengths: slices of held-out text.

A workload says "request i has a 600-token prompt"; the executor needs the tokens. They are
cut from the zoo corpus's held-out files (stdlib source the models did not train on),
tokenized with the model's own tokenizer, at offsets drawn from the workload seed, so the same
workload gives the same prompts. A model without a tokenizer gets seeded random token ids."""

from __future__ import annotations

import numpy as np

from infersim.simulator.workload.prefixes import ConversationKeys, TraceBlockKeys


def heldout_text(max_chars: int = 2_000_000) -> str:
    from .zoo.corpus import load_corpus

    c = load_corpus(check=False)
    _, held = c.split()
    text = "\n".join(c.texts(held))
    return text[:max_chars]


def token_stream(tokenizer, vocab_size: int) -> np.ndarray | None:
    if tokenizer is None:
        return None
    ids = tokenizer(heldout_text(), add_special_tokens=False)["input_ids"]
    ids = np.asarray([i for i in ids if 0 <= i < vocab_size], dtype=np.int64)
    return ids if ids.size else None


def make_prompts(
    lengths, *, tokenizer=None, vocab_size: int, seed: int = 0, prefix=None, outputs=None, reply=None
) -> list[list[int]]:
    """One prompt per length: a slice of the held-out token stream at a seeded offset (the
    stream is repeated when a prompt is longer than it), or seeded random ids. With `prefix`
    (a workload's token identity, `Requests.prefix`) the prompts share tokens where it says
    they do (shared_prompts; `outputs` and `reply` as there)."""
    rng = np.random.default_rng([int(seed), 7])
    lengths = [int(x) for x in lengths]
    stream = token_stream(tokenizer, vocab_size)
    if prefix is not None:
        return shared_prompts(prefix, lengths, _Tokens(stream, vocab_size, rng), outputs=outputs, reply=reply)
    out = []
    for n in lengths:
        if stream is None:
            out.append(rng.integers(1, vocab_size, size=n).tolist())
            continue
        start = int(rng.integers(0, stream.size))
        out.append(_cut(stream, start, n))
    return out


def _cut(stream: np.ndarray, start: int, n: int) -> list[int]:
    reps = -(-(start + n) // stream.size)
    return np.tile(stream, reps)[start : start + n].tolist() if reps > 1 else stream[start : start + n].tolist()


class _Tokens:
    """Consecutive, non-overlapping stretches of text from one seeded offset in the held-out
    token stream (seeded random ids without a tokenizer): distinct segments get distinct text."""

    def __init__(self, stream: np.ndarray | None, vocab_size: int, rng):
        self.stream, self.vocab_size, self.rng = stream, vocab_size, rng
        self.at = int(rng.integers(0, stream.size)) if stream is not None else 0

    def take(self, n: int) -> list[int]:
        if self.stream is None:
            return self.rng.integers(1, self.vocab_size, size=n).tolist()
        out = _cut(self.stream, self.at, n)
        self.at = (self.at + n) % self.stream.size
        return out


def shared_prompts(prefix, lengths: list[int], text: _Tokens, *, outputs=None, reply=None) -> list[list[int]]:
    """Real token ids for a workload whose prompts share prefixes (simulator/workload/prefixes.py):

    - the conversation model (`ConversationKeys`): conversation_prompts;
    - a trace's hash ids (`TraceBlockKeys`): each hash id is one stretch of block_tokens tokens,
      a prompt is its hash ids' stretches in order, and tokens past them are its own.

    Segments are laid out one after another in the held-out text, so different segments never
    share text by construction."""
    if isinstance(prefix, ConversationKeys):
        outs = [1] * len(lengths) if outputs is None else [int(o) for o in outputs]
        return conversation_prompts(prefix, lengths, outs, text, reply)
    if isinstance(prefix, TraceBlockKeys):
        seg: dict[int, list[int]] = {}
        out = []
        for ids, n in zip(prefix.hash_ids, lengths):
            toks: list[int] = []
            for h in ids:
                if h not in seg:
                    seg[h] = text.take(prefix.block_tokens)
                toks.extend(seg[h])
            out.append(toks[:n] + (text.take(n - len(toks)) if n > len(toks) else []))
        return out
    raise TypeError(f"no real tokens for token identity {type(prefix).__name__}")


def conversation_prompts(prefix, lengths: list[int], outputs: list[int], text: _Tokens, reply=None) -> list[list[int]]:
    """Multi-turn prompts of the conversation model: every conversation starts with the same
    system prompt; a turn's prompt is the previous turn's prompt, the reply to it (outputs[i]
    tokens) and a new user message (text), cut to the turn's length. `reply(prompts, outputs)`
    gives the replies (the served model's own greedy outputs, so a turn holds exactly the tokens
    its previous turn generates and shares its blocks, as the simulator's keys say; None for a
    prompt it does not serve); without it, or where it gives None, the reply is text. Turns are
    built in waves (every conversation's next turn at once), so `reply` sees batches."""
    system = text.take(int(prefix.system_prompt_tokens))
    conv = [int(c) for c in prefix.conversation]
    history: dict[int, list[int]] = {}  # the conversation so far: prompts and replies
    prompts: list[list[int] | None] = [None] * len(lengths)
    todo = list(range(len(lengths)))
    while todo:
        wave, later, seen = [], [], set()
        for i in todo:  # a conversation's next turn waits for the reply to its previous one
            (later if conv[i] in seen else wave).append(i)
            seen.add(conv[i])
        for i in wave:
            h = history.get(conv[i], system)
            prompts[i] = (h + text.take(max(0, lengths[i] - len(h))))[: lengths[i]]
        got = reply([prompts[i] for i in wave], [outputs[i] for i in wave]) if reply is not None else None
        for k, i in enumerate(wave):
            r = got[k] if got is not None and got[k] is not None else text.take(outputs[i])
            history[conv[i]] = prompts[i] + list(r)
        todo = later
    return prompts
