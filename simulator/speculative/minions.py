"""Minions section 3.2 and 3.4 as policy objects (no SimPy): the majority-voted speculator,
the SSM weight update from each SSM's average acceptance rate (ACR), and the pool's
back-pressure rule. The simulator and the real executor both use them.

Majority vote (section 3.2): the SSMs' outputs for one request are merged into a token tree
(a trie rooted at the prompt); a node's weight is the sum of the weights of the SSMs whose
output passes through it; from the root the walk takes the heaviest child at every level down
to a leaf; the leaf's path is one SSM's output, and that SSM is the voted SSM. The paper does
not say how ties are broken (they are common while weights are still equal): here a child's key
is (its weight, the rank of its best member), an SSM's rank ordering by weight and then by a
priority (default: lower index first; the simulator draws a random priority per request, so no
SSM wins ties by its position in the list); a leaf shared by several SSMs (identical outputs)
names its best-ranked SSM.

Weights (section 3.2, Equation 1): after a verification, ACR_i = mean over the outputs whose
voted SSM was i of (accepted / speculated); weight_i *= reward_factor if ACR_i >
reward_threshold, *= punish_factor if ACR_i < punish_threshold (`update`). Read that way, an SSM
that is never voted is never scored, and a strong SSM that falls behind early can stay behind
for good (docs/findings/minions.md measures it). `update_all` is the weighted-majority reading
(Littlestone and Warmuth, which the paper cites): every SSM is scored on every output by how far
its draft agreed with what the verification revealed. Thresholds are absolute acceptance rates
(`absolute`) or multiples of a running mean of the ACRs (`relative`; the paper gives no values).
Weights are renormalised to sum to the number of SSMs after each update (only their ratios
matter to the vote; this keeps them from under/overflowing).

In the simulator an SSM's output is modelled by how long it agrees with the target: SSM j
proposes the target's own tokens for the first L_j positions and then a token of its own
(different from every other SSM's), with L_j drawn from SSM j's acceptance model, so votes,
ACRs and weights mean what they mean in the paper. `vote_agreement` is the vectorised walk for
such outputs; the tests check it against the tree walk."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np


# ---- the token tree -----------------------------------------------------------------------
class _Node:
    __slots__ = ("token", "children", "weight", "ssms")

    def __init__(self, token):
        self.token = token
        self.children: dict = {}
        self.weight = 0.0
        self.ssms: list[int] = []


class TokenTree:
    """The SSMs' outputs for one request merged into a weighted trie."""

    def __init__(
        self, outputs: Sequence[Sequence[int]], weights: Sequence[float], priority: Optional[Sequence[float]] = None
    ):
        if len(outputs) != len(weights):
            raise ValueError("one weight per SSM output")
        self.weights = [float(w) for w in weights]
        self.priority = [-j for j in range(len(outputs))] if priority is None else [float(p) for p in priority]
        self.root = _Node(None)
        for j, out in enumerate(outputs):
            node = self.root
            node.weight += self.weights[j]
            node.ssms.append(j)
            for tok in out:
                child = node.children.get(tok)
                if child is None:
                    child = node.children[tok] = _Node(tok)
                child.weight += self.weights[j]
                child.ssms.append(j)
                node = child

    def _rank(self, j: int):
        return (self.weights[j], self.priority[j])

    def _key(self, node: _Node):
        return (node.weight, max(self._rank(j) for j in node.ssms))

    def heaviest_path(self) -> tuple[list, int]:
        """(tokens of the majority-approved output, voted SSM index)."""
        node, path = self.root, []
        while node.children:
            node = max(node.children.values(), key=self._key)
            path.append(node.token)
        # the leaf may end several SSMs' outputs (identical outputs): the best-ranked one is voted
        return path, max(node.ssms, key=self._rank)


@dataclass
class VoteResult:
    tokens: list
    voted: int


class MajorityVoter:
    """Tree-based weighted majority decision over the SSMs' outputs for one request."""

    def __init__(self, weights: Sequence[float]):
        self.weights = np.asarray(weights, dtype=np.float64)

    def vote(self, outputs: Sequence[Sequence[int]], priority: Optional[Sequence[float]] = None) -> VoteResult:
        tokens, voted = TokenTree(outputs, self.weights, priority).heaviest_path()
        return VoteResult(tokens, voted)


# ---- the agreement model (simulator side) ---------------------------------------------------
def agreement_outputs(lengths: Sequence[int], s: int, correct: Optional[Sequence[int]] = None) -> list[list[int]]:
    """Token outputs for SSMs that agree with the target for lengths[j] tokens and then say
    something of their own: the target's token t at position p is correct[p] (default p), an
    SSM's own token is -(1 + j * (s + 1) + p), unique per SSM and position."""
    correct = list(range(s)) if correct is None else list(correct)
    outs = []
    for j, L in enumerate(lengths):
        outs.append([correct[p] if p < L else -(1 + j * (s + 1) + p) for p in range(s)])
    return outs


def vote_agreement(
    lengths: np.ndarray, weights: Sequence[float], s, priority: Optional[np.ndarray] = None
) -> np.ndarray:
    """Voted SSM per request for agreement-model outputs (requests x SSMs lengths, each <= its
    request's s), identical to TokenTree(agreement_outputs(L_r, s_r), weights, priority_r)
    .heaviest_path()[1] for every request r. `priority`: (requests x SSMs) tie-break priorities
    (default: lower index first)."""
    L = np.asarray(lengths, dtype=np.int64)
    if L.ndim != 2:
        raise ValueError("lengths must be (requests, SSMs)")
    n, m = L.shape
    w = np.asarray(weights, dtype=np.float64)
    s_arr = np.broadcast_to(np.asarray(s, dtype=np.int64), (n,))
    pr = (
        np.broadcast_to(-np.arange(m, dtype=np.float64), (n, m))
        if priority is None
        else np.asarray(priority, np.float64)
    )
    # rank of each SSM within its request by (weight, priority): 0 = worst
    order = np.lexsort((pr, np.broadcast_to(w, (n, m))), axis=1)
    rank = np.empty((n, m), dtype=np.int64)
    np.put_along_axis(rank, order, np.arange(m)[None, :].repeat(n, axis=0), axis=1)
    W = np.broadcast_to(w, (n, m))
    voted = np.full(n, -1, dtype=np.int64)
    active = np.ones((n, m), dtype=bool)
    smax = int(s_arr.max()) if n else 0
    for d in range(smax + 1):
        open_ = voted < 0
        at_end = open_ & (s_arr == d)
        if at_end.any():
            # identical full outputs: the best-ranked active SSM is voted
            voted[at_end] = np.argmax(np.where(active[at_end], rank[at_end], -1), axis=1)
        go = open_ & (s_arr > d)
        if not go.any():
            continue
        cont = active & (L > d) & go[:, None]
        div = active & (L == d) & go[:, None]
        c_weight = np.where(cont, W, 0.0).sum(axis=1)
        c_rank = np.where(cont, rank, -1).max(axis=1)
        d_rank = np.where(div, rank, -1)
        d_j = np.argmax(d_rank, axis=1)  # the best diverging SSM (alone on its own child)
        has_d = d_rank.max(axis=1) >= 0
        d_w = w[d_j]
        has_c = c_rank >= 0
        c_wins = has_c & (~has_d | (c_weight > d_w) | ((c_weight == d_w) & (c_rank > d_rank.max(axis=1))))
        lose = go & has_d & ~c_wins
        voted[lose] = d_j[lose]
        active = np.where(c_wins[:, None], cont, active)
    return voted


def draw_agreement_lengths(
    rng: np.random.Generator, models: Sequence, s, n: int, correlation: float = 0.0
) -> np.ndarray:
    """(n, SSMs) agreement lengths, SSM j's column from its own acceptance model. With
    probability `correlation` a request's SSMs share one uniform (the position is equally hard
    for all of them: comonotone lengths), otherwise each draws its own."""
    m = len(models)
    shared = rng.random(n)
    own = rng.random((n, m))
    same = rng.random(n) < correlation
    u = np.where(same[:, None], shared[:, None], own)
    return np.stack([models[j].from_uniform(u[:, j], s) for j in range(m)], axis=1) if m else np.zeros((n, 0), np.int64)


# ---- weights from ACR -------------------------------------------------------------------------
@dataclass
class SSMWeights:
    weights: np.ndarray
    reward_threshold: float = 1.05
    punish_threshold: float = 0.95
    reward_factor: float = 1.1
    punish_factor: float = 0.9
    threshold_mode: str = "relative"
    ema: float = 0.05
    normalize: bool = True
    mean_acr: Optional[float] = None
    updates: int = 0
    last_acr: dict = field(default_factory=dict)

    def __post_init__(self):
        self.weights = np.asarray(self.weights, dtype=np.float64).copy()

    @staticmethod
    def acr(voted: Sequence[int], rates: Sequence[float], m: int) -> dict[int, float]:
        """ACR_i = mean acceptance rate of the outputs whose voted SSM is i (Minions Eq. 1)."""
        v = np.asarray(voted, dtype=np.int64)
        r = np.asarray(rates, dtype=np.float64)
        out = {}
        for j in range(m):
            sel = v == j
            if sel.any():
                out[j] = float(r[sel].mean())
        return out

    def thresholds(self) -> tuple[float, float]:
        if self.threshold_mode == "absolute" or self.mean_acr is None:
            if self.threshold_mode == "absolute":
                return self.reward_threshold, self.punish_threshold
            return float("inf"), float("-inf")  # relative mode before the first mean: no change
        return self.reward_threshold * self.mean_acr, self.punish_threshold * self.mean_acr

    def update_all(self, rates: np.ndarray) -> dict[int, float]:
        """Weighted-majority reading: every SSM is scored on every output of the batch.
        rates[r, j] = how far SSM j's draft for request r agreed with the target, as far as the
        verification shows it (min(L_j, accepted + 1) / speculated), so an SSM that is never
        voted can still earn weight."""
        r = np.asarray(rates, dtype=np.float64)
        if r.size == 0:
            return {}
        acrs = {j: float(r[:, j].mean()) for j in range(r.shape[1])}
        return self._apply(acrs, float(r.mean()))

    def update(self, voted: Sequence[int], rates: Sequence[float]) -> dict[int, float]:
        """One verification's outputs (voted SSM, accepted / speculated each); returns the ACRs."""
        m = self.weights.size
        acrs = self.acr(voted, rates, m)
        if not acrs:
            return acrs
        return self._apply(acrs, float(np.mean(rates)))

    def _apply(self, acrs: dict[int, float], batch_mean: float) -> dict[int, float]:
        m = self.weights.size
        if self.threshold_mode == "relative" and self.mean_acr is None:
            self.mean_acr = batch_mean
        hi, lo = self.thresholds()
        for j, a in acrs.items():
            if a > hi:
                self.weights[j] *= self.reward_factor
            elif a < lo:
                self.weights[j] *= self.punish_factor
        if self.threshold_mode == "relative":
            self.mean_acr = (1 - self.ema) * self.mean_acr + self.ema * batch_mean
        if self.normalize:
            self.weights *= m / self.weights.sum()
        self.updates += 1
        self.last_acr = acrs
        return acrs


# ---- the pool's back-pressure rule (section 3.4) ------------------------------------------------
@dataclass(frozen=True)
class PoolBackPressure:
    """SSMs pause while the intermediate result pool holds at least the LLM's batch size and
    run again as soon as it drops below."""

    llm_batch_size: int
    enabled: bool = True

    def ssm_may_run(self, pool_depth: int) -> bool:
        return (not self.enabled) or pool_depth < self.llm_batch_size
