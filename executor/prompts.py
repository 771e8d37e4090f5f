"""Real prompts for workloads that only give lengths: slices of held-out text.

A workload says "request i has a 600-token prompt"; the executor needs the tokens. They are
cut from the zoo corpus's held-out files (stdlib source the models did not train on),
tokenized with the model's own tokenizer, at offsets drawn from the workload seed, so the same
workload gives the same prompts. A model without a tokenizer gets seeded random token ids."""

from __future__ import annotations

import numpy as np


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


def make_prompts(lengths, *, tokenizer=None, vocab_size: int, seed: int = 0) -> list[list[int]]:
    """One prompt per length: a slice of the held-out token stream at a seeded offset (the
    stream is repeated when a prompt is longer than it), or seeded random ids."""
    rng = np.random.default_rng([int(seed), 7])
    lengths = [int(x) for x in lengths]
    stream = token_stream(tokenizer, vocab_size)
    out = []
    for n in lengths:
        if stream is None:
            out.append(rng.integers(1, vocab_size, size=n).tolist())
            continue
        start = int(rng.integers(0, stream.size))
        reps = -(-(start + n) // stream.size)
        out.append(
            np.tile(stream, reps)[start : start + n].tolist() if reps > 1 else stream[start : start + n].tolist()
        )
    return out
