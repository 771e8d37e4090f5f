"""Batched attention for short multi-token queries (verification, a draft's catch-up step).

The runner's PagedAttention runs one scaled_dot_product_attention call per sequence whenever
a sequence brings more than one token; verifying s + 1 tokens for B sequences then costs B
calls per layer, which on small models is most of the step. Here every sequence's cached K/V
is gathered into one padded [B, kv_heads, L, head_dim] tensor (as the runner's decode path
does) and its q <= Q new tokens into [B, heads, Q, head_dim], with a [B, 1, Q, L] mask
(key position <= context + row, padding rows see key 0): one call per layer. Plans with a
prompt longer than `max_query` (padding would cost more than it saves), token trees or a
sliding window go to the runner's own path."""

from __future__ import annotations

import torch

from infersim.simulator.costmodel.speculative_fit import SHORT_QUERY_MAX

from ..runner import PagedAttention


class BatchedShortQueryAttention(PagedAttention):
    def __init__(self, base: PagedAttention, max_query: int = SHORT_QUERY_MAX):
        super().__init__(base.num_heads, base.num_kv_heads, base.head_dim, base.scale, base.window)
        self.max_query = int(max_query)

    def _prepare(self, plan, cache, device):
        """Index tensors shared by every layer, cached on the plan (built with few tensor ops:
        on small models this bookkeeping is a visible part of a step)."""
        prep = getattr(plan, "_short_q", None)
        if prep is not None:
            return prep
        bs = cache.block_size
        B = len(plan.q_lens)
        Q = max(plan.q_lens)
        if B == 1:
            blocks = plan.seq_blocks[0][None]
        else:
            blocks = torch.nn.utils.rnn.pad_sequence(plan.seq_blocks, batch_first=True)
        L = blocks.size(1) * bs
        ctx = torch.tensor(plan.ctx_lens, dtype=torch.long, device=device)
        rows = torch.arange(Q, device=device)
        kpos = torch.arange(L, device=device)
        mask = kpos[None, None, :] <= (ctx[:, None, None] + rows[None, :, None])  # [B, Q, L]
        if min(plan.q_lens) == Q:
            flat = None  # every sequence brings Q tokens: the flat batch is the [B, Q] grid
        else:
            ql = torch.tensor(plan.q_lens, dtype=torch.long, device=device)
            real = rows[None, :] < ql[:, None]  # [B, Q]
            mask |= (~real)[:, :, None] & (kpos == 0)[None, None, :]  # padding rows see key 0 (no NaN)
            flat = real.reshape(-1).nonzero().squeeze(1)
        prep = (blocks, mask[:, None], flat, B, Q, L)
        plan._short_q = prep
        return prep

    def __call__(self, q, k, v, cache, layer, plan):
        if (
            plan.decode_only
            or plan.tree_masks is not None
            or self.window is not None
            or max(plan.q_lens) > self.max_query
        ):
            return super().__call__(q, k, v, cache, layer, plan)
        kf, vf = cache.flat(layer)
        kf.index_copy_(0, plan.write_slots, k.to(kf.dtype))
        vf.index_copy_(0, plan.write_slots, v.to(vf.dtype))
        blocks, mask, flat, B, Q, L = self._prepare(plan, cache, q.device)
        kb, vb = cache.k[layer], cache.v[layer]
        keys = kb[blocks].view(B, L, self.num_kv_heads, self.head_dim).transpose(1, 2)
        vals = vb[blocks].view(B, L, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if flat is None:
            qp = q.view(B, Q, self.num_heads, self.head_dim)
        else:
            qp = q.new_zeros(B * Q, self.num_heads, self.head_dim)
            qp[flat] = q
            qp = qp.view(B, Q, self.num_heads, self.head_dim)
        out = self._sdpa(qp.transpose(1, 2), keys, vals, mask=mask)  # [B, H, Q, D]
        out = out.transpose(1, 2).reshape(B * Q, self.num_heads * self.head_dim)
        return out if flat is None else out[flat]


def install(runner, max_query: int = SHORT_QUERY_MAX):
    """Give a runner (LlamaRunner / OPTRunner) the batched short-query attention."""
    if not isinstance(runner.attn, BatchedShortQueryAttention):
        runner.attn = BatchedShortQueryAttention(runner.attn, max_query)
    return runner
