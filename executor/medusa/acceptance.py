"""Which candidates of a verified tree are accepted (Medusa section 2.3.1), for a whole batch.

Inputs per sequence: the tree's candidate tokens and the target's logits at every node. Node j
is *acceptable* when its token passes the test under its parent's logits, and *accepted* when
it and all its ancestors are acceptable; the accepted node of greatest depth (the first one in
tree order on a tie) ends the longest accepted prefix.

- greedy: the token is the argmax of the parent's logits. Children of one parent are distinct
  guesses, so at most one passes: the accepted path is exactly the target's greedy continuation
  as far as the tree holds it, and Medusa's output equals plain greedy decoding.
- typical: p = softmax(logits / temperature); the token passes when
  p(x) > min(epsilon, delta * exp(-H(p))) (H the entropy of p). The root is the target's own
  (greedy) choice, so the first token is always accepted, as the paper prescribes. As the
  temperature goes to 0, p becomes one-hot and typical acceptance becomes greedy.

The token that follows the accepted path (the next root, the "bonus" token) is the argmax of
the last accepted node's logits in both modes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infersim.simulator.errors import InfersimError

from .tree import TreeLayout


@dataclass(frozen=True)
class Acceptance:
    mode: str = "greedy"  # greedy | typical
    temperature: float = 0.7
    epsilon: float = 0.09  # Medusa's defaults (posterior threshold 0.09, alpha 0.3)
    delta: float = 0.3

    def __post_init__(self):
        if self.mode not in ("greedy", "typical"):
            raise InfersimError(f"unknown acceptance mode '{self.mode}': use greedy or typical")
        if self.mode == "typical" and (self.temperature < 0 or self.epsilon < 0 or self.delta < 0):
            raise InfersimError("typical acceptance needs temperature, epsilon and delta >= 0")


def typical_threshold(logits: torch.Tensor, acc: Acceptance) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, threshold) per row: p = softmax(logits / T) and min(epsilon, delta exp(-H(p)));
    temperature 0 means the one-hot argmax distribution (entropy 0)."""
    if acc.temperature == 0:
        p = torch.zeros_like(logits)
        p.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        ent = torch.zeros(logits.shape[:-1], dtype=logits.dtype, device=logits.device)
    else:
        logp = torch.log_softmax(logits.float() / acc.temperature, dim=-1)
        p = logp.exp()
        ent = -(p * logp).sum(-1)
    thr = torch.clamp(acc.delta * torch.exp(-ent), max=acc.epsilon)
    return p, thr


def accept_greedy_lists(tree: TreeLayout, tokens: list[list[int]], logits: torch.Tensor):
    """Greedy acceptance with one tensor op (the argmax of every node's logits) and the tree
    walked in Python: for the trees Medusa uses (tens of nodes) that is several times cheaper
    on a CPU than a dozen small tensor ops. Same result as `accept` in greedy mode.
    tokens: [B][n+1] lists; returns (best, accepted, bonus) as lists."""
    pred = logits.argmax(-1).tolist()  # [B][n+1]
    parent, depths = tree.parent_list, tree.depths
    out_best, out_n, out_bonus = [], [], []
    for tok, pr in zip(tokens, pred):
        ok = [True] + [False] * (len(tok) - 1)
        best = 0
        for j in range(1, len(tok)):
            p = parent[j]
            if ok[p] and tok[j] == pr[p]:
                ok[j] = True
                if depths[j] > depths[best]:
                    best = j
        out_best.append(best)
        out_n.append(depths[best])
        out_bonus.append(pr[best])
    return out_best, out_n, out_bonus


def accept(tree: TreeLayout, tokens: torch.Tensor, logits: torch.Tensor, acc: Acceptance):
    """tokens [B, n+1] (node 0 = root), logits [B, n+1, V] ->
    (best node [B], accepted candidates beyond the root [B], bonus token [B]).
    The tree's tensors must be on the tokens' device (TreeLayout.on)."""
    B, n1 = tokens.shape
    par = tree.parent[1:]
    cand = tokens[:, 1:]  # [B, n]
    if acc.mode == "greedy":
        pred = logits.argmax(-1)  # [B, n+1]
        ok = cand == pred[:, par]
    else:
        p, thr = typical_threshold(logits, acc)  # [B, n+1, V], [B, n+1]
        prob = p[:, par, :].gather(-1, cand[..., None])[..., 0]  # [B, n]: p_parent(candidate)
        ok = prob > thr[:, par]
    accepted = torch.ones(B, n1, dtype=torch.bool, device=tokens.device)
    accepted[:, 1:] = ok
    for nodes in tree.by_depth[1:]:  # depth 2 and deeper: the parent must be accepted too
        accepted[:, nodes] &= accepted[:, tree.parent[nodes]]
    # depth of each accepted node, -1 elsewhere; the root (depth 0) is always accepted
    score = torch.where(accepted, tree.depth_t[None, :], -1)
    best = score.argmax(-1)  # first maximum: ties go to the earlier node
    n_acc = tree.depth_t[best]
    bonus = logits[torch.arange(B, device=tokens.device), best].argmax(-1)
    return best, n_acc, bonus
