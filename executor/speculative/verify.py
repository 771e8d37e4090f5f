"""Verification: the target scores every drafted token in one forward pass and accepts a prefix.

A sequence under verification feeds its last committed token (not cached yet) and its s
drafted tokens: q = s + 1 rows, row i holding the target's distribution for the token after
position i, so row 0 judges draft token 1 and row s gives the bonus token.

- greedy: accept the longest prefix of drafted tokens equal to the target's argmax, then add
  the target's argmax at the first mismatch (correction) or after the last draft (bonus): the
  output is token for token the target's own greedy output.
- sampling (Leviathan et al. 2023, Chen et al. 2023): accept draft token x with probability
  min(1, p(x) / q(x)); at the first rejection sample from norm(max(0, p - q)); when all s are
  accepted sample the bonus token from p. Every committed token is then distributed as the
  target's p at temperature T (p and q both taken at T).

The functions work on padded batches: lens[b] <= S drafted tokens per row, draft/q padded with
zeros past lens[b] (a zero q row makes the residual at k = lens[b] equal to p: the bonus)."""

from __future__ import annotations

import torch


def greedy_accept(target_argmax: torch.Tensor, draft: torch.Tensor, lens: torch.Tensor):
    """target_argmax [B, S+1], draft [B, S], lens [B] -> (accepted k [B], next token [B])."""
    S = draft.size(1)
    pos = torch.arange(S, device=draft.device)
    ok = (draft == target_argmax[:, :S]) & (pos[None, :] < lens[:, None])
    k = ok.to(torch.int64).cumprod(dim=1).sum(dim=1)
    nxt = target_argmax.gather(1, k[:, None]).squeeze(1)
    return k, nxt


def rejection_accept(
    p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, lens: torch.Tensor, generator: torch.Generator | None = None
):
    """p [B, S+1, V] target probabilities, q [B, S, V] draft probabilities (zero rows past
    lens), draft [B, S] drafted tokens (sampled from q) -> (accepted k [B], next token [B])."""
    B, S = draft.shape
    pos = torch.arange(S, device=draft.device)
    if S:
        pd = p[:, :S].gather(2, draft[:, :, None]).squeeze(2)
        qd = q.gather(2, draft[:, :, None]).squeeze(2)
        u = torch.rand(B, S, generator=generator, device=p.device)
        # accept with probability min(1, p/q): u < p/q  <=>  u * q < p  (q(x) > 0: x was drawn from q)
        ok = (u * qd < pd) & (pos[None, :] < lens[:, None])
        k = ok.to(torch.int64).cumprod(dim=1).sum(dim=1)
    else:
        k = torch.zeros(B, dtype=torch.int64, device=p.device)
    ar = torch.arange(B, device=p.device)
    pk = p[ar, k]
    qfull = torch.cat([q, q.new_zeros(B, 1, q.size(2))], dim=1) if S else q.new_zeros(B, 1, p.size(2))
    qk = qfull[ar, k]  # zero where k == lens: the bonus token comes from p itself
    resid = (pk - qk).clamp_min(0)
    mass = resid.sum(dim=1, keepdim=True)
    # p == q exactly leaves no residual mass (and then a rejection cannot happen): fall back to p
    resid = torch.where(mass > 0, resid / mass.clamp_min(1e-30), pk)
    nxt = torch.multinomial(resid, 1, generator=generator).squeeze(1)
    return k, nxt


def pad_rows(rows: list[torch.Tensor], width: int, fill: float = 0.0) -> torch.Tensor:
    """Stack [n_i, ...] tensors into [B, width, ...], padding with `fill`."""
    if all(r.size(0) == width for r in rows):
        return torch.stack(rows)
    out = rows[0].new_full((len(rows), width) + tuple(rows[0].shape[1:]), fill)
    for b, r in enumerate(rows):
        out[b, : r.size(0)] = r
    return out
