"""InfiniGen's offline skewing and the partial query/key columns (paper section 4.2-4.3).

Skewing multiplies a layer's query and key by the same orthogonal matrix A, so that
Q~ K~^T = Q A A^T K^T = Q K^T exactly, while the energy of Q~ gathers in a few columns: A is
the right singular basis V of a sample query matrix (Q = U S V^T, so Q A = U S). A few
columns of Q~ and K~ then predict the attention scores well.

RoPE: the paper folds A into W_Q and W_K (OPT has no rotary embedding). For a Llama model the
rotation R_p applied after the projection depends on the position, and R_p A != A R_p for a
general A, so a pre-RoPE fold changes Q K^T (`fold_skew` is exact only for the pre-RoPE
product; the tests show both). We skew the post-RoPE query and key instead: q~ = R_p(x W_Q) A,
k~ = R_p(x W_K) A, which keeps q~ . k~ = q . k exactly for every pair of positions. The price:
the partial query can no longer be a slice of W_Q's columns (R_p mixes column pairs), so the
prediction computes the next layer's full query projection (hidden x q_dim) and keeps r of
its skewed columns; the partial key cache is the same r columns of K~ as in the paper.

GQA: the query heads of one KV head share its keys, so A is per KV head (the SVD of the
group's queries stacked) and so are the chosen columns (the partial keys are per KV head)."""

from __future__ import annotations

import torch

from .model import DenseLlama, full_forward


def partial_columns(head_dim: int, ratio: float) -> int:
    """Columns kept per head: ratio x head_dim, at least one (0.3 x 32 -> 10)."""
    return max(1, min(head_dim, int(round(ratio * head_dim))))


@torch.no_grad()
def skew_matrices(model: DenseLlama, sample_ids: torch.Tensor) -> torch.Tensor:
    """A [layers, kv_heads, d, d] from one forward pass over a sample input [B, T]: per layer
    and KV head, the right singular vectors of the post-RoPE queries of the group's heads."""
    s = model.shape
    _, trace = full_forward(model, sample_ids)
    out = torch.empty(s.layers, s.kv_heads, s.head_dim, s.head_dim, dtype=torch.float64)
    for i, t in enumerate(trace):
        q = t["q"].double()  # [B, H, T, d]
        for g in range(s.kv_heads):
            rows = q[:, g * s.group : (g + 1) * s.group].reshape(-1, s.head_dim)
            _, _, vh = torch.linalg.svd(rows, full_matrices=False)
            out[i, g] = vh.transpose(0, 1)  # A = V: columns in order of decreasing singular value
    return out.to(model.dtype)


def identity_skew(model: DenseLlama) -> torch.Tensor:
    """No skewing (the paper's 'w/o skewing' ablation): A = I."""
    s = model.shape
    eye = torch.eye(s.head_dim, dtype=model.dtype)
    return eye.expand(s.layers, s.kv_heads, s.head_dim, s.head_dim).clone()


def apply_skew(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, d] times the per-head A [heads, d, d]."""
    return torch.einsum("bhtd,hde->bhte", x, a)


def fold_skew(w_q: torch.Tensor, w_k: torch.Tensor, a: torch.Tensor, heads: int, kv_heads: int):
    """The paper's fold (Eq. 2) into nn.Linear weights [out, in]: each head's rows W_h become
    A^T W_h, so that x W~_h^T = (x W_h^T) A. Exact for Q K^T without a rotary embedding."""
    d = a.shape[-1]
    group = heads // kv_heads
    wq = w_q.view(heads, d, -1)
    wk = w_k.view(kv_heads, d, -1)
    aq = a.repeat_interleave(group, dim=0)
    wq2 = torch.einsum("hde,hdi->hei", aq, wq).reshape_as(w_q)
    wk2 = torch.einsum("hde,hdi->hei", a, wk).reshape_as(w_k)
    return wq2, wk2


def choose_columns(q_skewed: torch.Tensor, k_skewed: torch.Tensor, group: int, r: int) -> torch.Tensor:
    """The r columns per (sequence, KV head) with the largest column sums of |Q~| + |K~| over
    the prompt (paper 4.3: one top-k that catches the outlier columns of both); q_skewed
    [B, H, T, d], k_skewed [B, Hkv, T, d] -> indices [B, Hkv, r]."""
    B, H, T, d = q_skewed.shape
    colq = q_skewed.abs().sum(dim=2).view(B, H // group, group, d).sum(dim=2)
    colk = k_skewed.abs().sum(dim=2)
    return torch.topk(colq + colk, r, dim=-1).indices.sort(dim=-1).values


def gather_columns(x: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """x [B, h, T, d], cols [B, h, r] -> [B, h, T, r]."""
    return torch.gather(x, -1, cols[:, :, None, :].expand(*x.shape[:3], cols.shape[-1]))


__all__ = [
    "apply_skew",
    "choose_columns",
    "fold_skew",
    "gather_columns",
    "identity_skew",
    "partial_columns",
    "skew_matrices",
]
