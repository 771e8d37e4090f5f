"""A draft model (SSM) with its own paged KV cache, drafting s tokens for a batch of sequences.

Each drafting step is one forward pass over every sequence still drafting (the draft's decode
steps are batched across sequences). The first step of a round feeds what the draft has not
cached yet: the tokens committed since its last round (1, or 2 when every drafted token was
accepted, or the whole prompt the first time); the next s - 1 steps feed one drafted token
each. The last drafted token is never fed: if it is accepted, it is fed with the next round's
first step. Before drafting, the draft rolls its cache back to the longest prefix of what it
cached that the target committed (`PagedKVCache.truncate`): its rejected tokens' K/V go."""

from __future__ import annotations

import torch

from ..kvcache import KVCacheConfig, runner_cache
from ..runner import build_runner, plan_batch
from .attention import install
from .fused import draft_runner


def pick_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None):
    """(tokens [B], probabilities [B, V] or None): argmax at temperature 0, else a sample from
    softmax(logits / temperature) together with that distribution (rejection sampling needs it)."""
    if temperature <= 0:
        return logits.argmax(dim=-1), None
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1), probs


class DraftModel:
    """lm: a LoadedModel; index: which of a SpecSequence's draft Tracks is this model's."""

    def __init__(
        self, lm, *, index: int = 0, gpu_blocks: int, block_size: int = 16, name: str | None = None, fused: bool = True
    ):
        self.lm = lm
        self.name = name or lm.name
        self.index = index
        # fewer calls per step (fused.py) and one attention call per layer for short queries
        self.runner = install(draft_runner(lm) if fused else build_runner(lm))
        self.device = lm.device
        self.cache = runner_cache(self.runner, KVCacheConfig(gpu_blocks, block_size, dtype=lm.dtype), lm.device)
        self.steps = 0  # forward passes
        self.released_blocks = 0  # blocks given back on rollback

    def _reconcile(self, seq) -> None:
        """Keep the cached prefix the target committed, drop the rest, catch up on tokens."""
        tr = seq.drafts[self.index]
        # at most all but the last committed token count as cached: the first step must feed
        # something to get logits (another SSM's draft may have been verified while this one
        # had already cached the target's tokens: its K/V of the last one is simply rewritten)
        lim = min(tr.computed, len(seq.tokens) - 1)
        c = min(tr.base, lim)
        while c < lim and tr.tokens[c] == seq.tokens[c]:
            c += 1
        if c < tr.computed:
            tr.computed = c
            self.released_blocks += self.cache.truncate(tr, c)
        del tr.tokens[c:]
        tr.tokens.extend(seq.tokens[c:])
        tr.base = len(tr.tokens)

    def propose(self, seqs, s_list, temperature: float = 0.0, generator: torch.Generator | None = None):
        """Draft s_list[i] tokens for seqs[i] (0: none). Returns (tokens per sequence, and per
        sequence a [s_i, V] tensor of the draft's distributions when sampling, else None)."""
        out: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] | None = [[] for _ in seqs] if temperature > 0 else None
        active = [i for i, s in enumerate(s_list) if s > 0]
        batch = []
        for i in active:
            tr = seqs[i].drafts[self.index]
            self._reconcile(seqs[i])
            batch.append((tr, len(tr.tokens) - tr.computed))
        step = 0
        cache = self.cache
        while batch:
            for tr, q in batch:
                cache.grow_to(tr, tr.computed + q)
            logits = self.runner.forward(plan_batch(cache, batch, self.device), cache)
            self.steps += 1
            tok, p = pick_tokens(logits, temperature, generator)
            step += 1
            nb, na = [], []
            for row, ((tr, q), i, t) in enumerate(zip(batch, active, tok.tolist())):
                tr.computed += q
                tr.tokens.append(t)
                out[i].append(t)
                if probs is not None:
                    probs[i].append(p[row])
                if step < s_list[i]:
                    nb.append((tr, 1))
                    na.append(i)
            batch, active = nb, na
        if probs is None:
            return out, None
        return out, [torch.stack(x) if x else None for x in probs]

    def release(self, seq) -> None:
        self.cache.free(seq.drafts[self.index])
