"""What one engine iteration computes, as the cost model sees it.

Every sequence in a batch contributes `query_tokens` new tokens (a prefill chunk, 1 for a
decode, q for a speculative or Medusa verification) attending over `context_tokens` cached
tokens plus its own new ones. The roofline only needs four totals of these, all of which
every operator's FLOPs and bytes are affine in; that is what lets the simulator cost many
decode steps in one vectorised call."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BatchShape:
    query_tokens: np.ndarray  # per sequence, new tokens this iteration (>= 1)
    context_tokens: np.ndarray  # per sequence, tokens already in the KV cache
    logit_tokens: np.ndarray  # per sequence, positions whose logits are computed
    # sequences in the same forward pass whose own tokens are priced apart (a draft's first step
    # that prefills prompts while it decodes these): only pass-wide costs see them
    alongside: int = 0

    @classmethod
    def of(cls, query_tokens, context_tokens, logit_tokens=None) -> "BatchShape":
        q = np.asarray(query_tokens, dtype=np.int64).reshape(-1)
        c = np.asarray(context_tokens, dtype=np.int64).reshape(-1)
        if c.shape != q.shape:
            c = np.broadcast_to(c, q.shape).copy()
        lg = (
            q.copy()
            if logit_tokens is None
            else np.broadcast_to(np.asarray(logit_tokens, dtype=np.int64), q.shape).copy()
        )
        return cls(q, c, lg)

    @classmethod
    def prefill(cls, prompt_tokens) -> "BatchShape":
        """Whole prompts, no cache; logits only at each prompt's last position (as vLLM)."""
        q = np.atleast_1d(np.asarray(prompt_tokens, dtype=np.int64))
        return cls(q, np.zeros_like(q), np.ones_like(q))

    @classmethod
    def decode(cls, context_tokens) -> "BatchShape":
        c = np.atleast_1d(np.asarray(context_tokens, dtype=np.int64))
        return cls(np.ones_like(c), c, np.ones_like(c))

    @classmethod
    def verify(cls, context_tokens, candidates: int) -> "BatchShape":
        """q candidate tokens per sequence checked in one pass (speculation, Medusa trees)."""
        c = np.atleast_1d(np.asarray(context_tokens, dtype=np.int64))
        q = np.full_like(c, int(candidates))
        return cls(q, c, q.copy())

    @property
    def num_seqs(self) -> int:
        return int(self.query_tokens.size)

    def totals(self) -> "BatchTotals":
        q, c = self.query_tokens, self.context_tokens
        keys = c + q
        return BatchTotals(
            tokens=float(q.sum()),
            score_pairs=float((q * keys).sum()),
            keys=float(keys.sum()),
            logits=float(self.logit_tokens.sum()),
        )


@dataclass(frozen=True)
class BatchTotals:
    """tokens T = sum q; score_pairs P = sum q(c+q) (query-key pairs per head);
    keys K = sum (c+q) (cached keys read per KV head); logits L. Fields may be arrays."""

    tokens: float | np.ndarray
    score_pairs: float | np.ndarray
    keys: float | np.ndarray
    logits: float | np.ndarray
