"""The target model: prefills new sequences and verifies drafted tokens, one forward pass per
round for the whole batch, then commits what it accepted and rolls back the rest of its KV."""

from __future__ import annotations

import torch

from ..kvcache import KVCacheConfig, runner_cache
from ..runner import build_runner, plan_batch
from .attention import install
from .draft import pick_tokens
from .verify import greedy_accept, pad_rows, rejection_accept


class TargetModel:
    def __init__(self, lm, *, gpu_blocks: int, block_size: int = 16):
        self.lm = lm
        self.name = lm.name
        self.runner = install(build_runner(lm))  # one attention call per layer for short queries
        self.device = lm.device
        self.cache = runner_cache(self.runner, KVCacheConfig(gpu_blocks, block_size, dtype=lm.dtype), lm.device)
        self.steps = 0
        self.released_blocks = 0  # blocks given back when drafted tokens were rejected

    def step(self, prefill, items, temperature: float = 0.0, generator: torch.Generator | None = None):
        """prefill: sequences whose prompt runs now (they get their first token); items:
        [(seq, drafted tokens, draft probabilities [s, V] or None)] to verify (no drafted
        tokens: a plain decode step). One forward pass for all. Returns (accepted k, token the
        target added) per item; the sequences' tokens, cached counts and blocks are updated."""
        cache, dev = self.cache, self.device
        batch, rows, n = [], [], 0
        for seq in prefill:
            q = seq.num_tokens - seq.computed
            cache.grow_to(seq, seq.num_tokens)
            batch.append((seq, q))
            rows.append(n + q - 1)
            n += q
        n0s, qs = [], []
        for seq, d, _ in items:
            n0 = len(seq.tokens)
            n0s.append(n0)
            seq.tokens.extend(d)
            q = len(seq.tokens) - seq.computed  # the last committed token + the drafts
            cache.grow_to(seq, len(seq.tokens))
            batch.append((seq, q))
            rows.extend(range(n, n + q))
            qs.append(q)
            n += q
        if not batch:
            return []
        plan = plan_batch(cache, batch, dev, all_logits=True)
        # logits only where needed: a prompt's last row, every row of a verified sequence
        plan.logit_rows = torch.tensor(rows, dtype=torch.long, device=dev)
        logits = self.runner.forward(plan, cache)
        self.steps += 1
        npf = len(prefill)
        if npf:
            first, _ = pick_tokens(logits[:npf], temperature, generator)
            for seq, t in zip(prefill, first.tolist()):
                seq.computed = seq.num_tokens
                seq.tokens.append(int(t))
        if not items:
            return []
        per = list(torch.split(logits[npf:], qs))
        width = max(qs)
        lens = torch.tensor([q - 1 for q in qs], dtype=torch.long, device=dev)
        draft = (
            pad_rows([torch.tensor(d, dtype=torch.long, device=dev) for _, d, _ in items], width - 1, 0)
            if width > 1
            else torch.zeros(len(items), 0, dtype=torch.long, device=dev)
        )
        if temperature <= 0:
            am = pad_rows([x.argmax(dim=-1) for x in per], width, 0)
            k, nxt = greedy_accept(am, draft, lens)
        else:
            p = pad_rows([torch.softmax(x.float() / temperature, dim=-1) for x in per], width, 0.0)
            V = p.size(2)
            qrows = [pr if pr is not None else torch.zeros(0, V, device=dev) for _, _, pr in items]
            qp = pad_rows(qrows, width - 1, 0.0) if width > 1 else torch.zeros(len(items), 0, V, device=dev)
            k, nxt = rejection_accept(p, qp, draft, lens, generator)
        out = []
        for (seq, _, _), n0, kk, t in zip(items, n0s, k.tolist(), nxt.tolist()):
            del seq.tokens[n0 + kk :]
            seq.tokens.append(int(t))
            seq.computed = n0 + kk  # the old last token and the accepted drafts are cached
            self.released_blocks += cache.truncate(seq, n0 + kk)
            out.append((kk, int(t)))
        return out

    def release(self, seq) -> None:
        self.cache.free(seq)
