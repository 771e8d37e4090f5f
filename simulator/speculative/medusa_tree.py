"""Medusa trees (sections 2.1.2 and 2.3.3) and their acceptance, as policy objects.

A tree is a list of paths (tuples of top-i indices, one per head), parents before children;
the root (the base model's own next token) is implicit, so a tree of n paths has n + 1 nodes,
and verification processes n + 1 tokens per sequence (q = nodes in BatchShape.verify).

Builders: `cartesian_tree` (every path through the top-s_k guesses of head k),
`choices_tree` (an explicit list, e.g. Medusa's mc_sim_7b_63 from the accuracy table) and
`greedy_tree` (section 2.3.3: add the most probable connected node until the budget is spent;
the construction itself is medusa_heads.grow_tree, reused here).

Acceptance (sampling.RankAcceptance): `acc[k, i]`, the probability that head k's rank-i guess is
the target's own token (at most one candidate per depth can be: greedy decoding and rejection
sampling), gives the expected accepted length 1 + sum over nodes of the product of accuracies
along the node's path (Medusa 2.3.3; `medusa_heads.expected_accept_length`). Typical
acceptance adds `extra[k, i]`: a candidate that is not the target's token still passes if the
target finds it likely enough. Such a token ends the accepted path: the heads guessed the
tokens after the target's own continuation, not after an alternative, so its children are not
counted (a conservative reading; the longest accepted prefix then gains at most one token over
the exact-match path, from the children of the node where that path stops).
`TreeSampler` draws a round's accepted depth for many sequences at once."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Optional, Sequence

import numpy as np

from ..errors import InfersimError
from ..models.dtypes import bytes_per_element, compute_dtype_for
from .medusa_heads import HeadAccuracies, expected_accept_length, grow_tree, path_accuracy

Tree = list[tuple[int, ...]]


# ---- builders --------------------------------------------------------------------------------
def cartesian_tree(sizes: Sequence[int]) -> Tree:
    """Every path (i_1..i_k), k <= len(sizes), i_j < sizes[j]: Medusa's dense tree (section
    2.1.2). Nodes (root excluded): s_1 + s_1 s_2 + ... + s_1...s_K."""
    if not sizes or min(sizes) < 1:
        raise InfersimError("cartesian tree sizes must be positive")
    tree: Tree = []
    for depth in range(1, len(sizes) + 1):
        tree.extend(tuple(p) for p in product(*[range(int(s)) for s in sizes[:depth]]))
    return tree


def cartesian_nodes(sizes: Sequence[int]) -> int:
    """Tree nodes, root included."""
    total, prod_ = 1, 1
    for s in sizes:
        prod_ *= int(s)
        total += prod_
    return total


def choices_tree(choices: Sequence[Sequence[int]]) -> Tree:
    """An explicit list of paths, checked to be a tree (every parent listed) and put in
    parent-first order."""
    paths = [tuple(int(i) for i in c) for c in choices]
    seen = set(paths)
    if len(seen) != len(paths):
        raise InfersimError("tree choices list a path twice")
    for p in paths:
        if not p or min(p) < 0:
            raise InfersimError(f"tree choice {list(p)}: needs non-negative indices")
        if len(p) > 1 and p[:-1] not in seen:
            raise InfersimError(f"tree choice {list(p)} has no parent {list(p[:-1])} in the list")
    return sorted(paths, key=len)  # stable: parents (shorter paths) first


def greedy_tree(acc: np.ndarray, nodes: int) -> Tree:
    """Medusa 2.3.3: the `nodes`-node tree (root included) that greedily maximises the expected
    acceptance length under accuracies acc (heads x ranks)."""
    acc = np.asarray(acc, dtype=np.float64)
    # model_construct: the table of a non-exclusive scheme (typical) may sum above 1 per head
    table = HeadAccuracies.model_construct(
        name="greedy",
        model="",
        source="",
        top_k=int(acc.shape[1]),
        heads=[],
        per_rank=acc.tolist(),
        tree_name="",
        tree_source="",
        tree=[],
    )
    return [tuple(p) for p in grow_tree(table, int(nodes))]


def restrict(tree: Tree, heads: int, top_k: int) -> Tree:
    """The part of a tree a model with `heads` heads of `top_k` guesses can build."""
    return [p for p in tree if len(p) <= heads and max(p) < top_k]


# ---- acceptance --------------------------------------------------------------------------------
def expected_length_exclusive(tree: Tree, acc: np.ndarray) -> float:
    """1 + sum over nodes of the product of accuracies along the path (Medusa 2.3.3)."""
    return float(expected_accept_length(tree, np.asarray(acc, dtype=np.float64)))


def expected_length(tree: Tree, acc: np.ndarray, extra: Optional[np.ndarray] = None) -> float:
    """Expected tokens per step. With `extra` (typical acceptance):
    P(D >= k) = P(the exact-match path reaches depth k)
              + sum over tree nodes v at depth k-1 of P(the exact-match path stops at v)
                * (1 - prod over v's children c of (1 - extra_c))."""
    acc = np.asarray(acc, dtype=np.float64)
    base = expected_length_exclusive(tree, acc)
    if extra is None:
        return base
    extra = np.asarray(extra, dtype=np.float64)
    children: dict[tuple, list[tuple]] = {(): []}
    for p in tree:
        children.setdefault(p, [])
        children.setdefault(p[:-1], []).append(p)
    gain = 0.0
    for v, kids in children.items():
        if not kids:
            continue
        reach = path_accuracy(v, acc) if v else 1.0
        d = len(v)  # the children are guesses of head d (0-based)
        stop = max(0.0, 1.0 - sum(acc[d, c[-1]] for c in kids))
        miss = float(np.prod([1.0 - extra[d, c[-1]] for c in kids]))
        gain += reach * stop * (1.0 - miss)
    return base + gain


@dataclass
class TreeSampler:
    """Draws accepted depths (candidates accepted beyond the root) for a fixed tree."""

    tree: Tree
    acc: np.ndarray
    extra: Optional[np.ndarray] = None

    def __post_init__(self):
        self.acc = np.asarray(self.acc, dtype=np.float64)
        self.depth = max((len(p) for p in self.tree), default=0)
        self.nodes = len(self.tree) + 1
        k = self.acc.shape[1]
        self._base = k + 1
        self._codes = [
            np.array(sorted(self._code(p) for p in self.tree if len(p) == d + 1), dtype=np.int64)
            for d in range(self.depth)
        ]
        self._cum = []
        for d in range(self.depth):
            p = np.clip(self.acc[d], 0, 1)
            rest = max(0.0, 1.0 - p.sum())
            self._cum.append(np.cumsum(np.concatenate((p, [rest]))))
        # typical: for every node (root = code 0), P(some child passes as a non-argmax token)
        self._typical: dict[int, float] = {}
        if self.extra is not None:
            ex = np.asarray(self.extra, dtype=np.float64)
            kids: dict[tuple, list] = {}
            for p in self.tree:
                kids.setdefault(p[:-1], []).append(p)
            for v, cs in kids.items():
                self._typical[self._code(v)] = 1.0 - float(np.prod([1.0 - ex[len(v), c[-1]] for c in cs]))

    def _code(self, path) -> int:
        c = 0
        for i in path:
            c = c * self._base + (int(i) + 1)
        return c

    def expected(self) -> float:
        return expected_length(self.tree, self.acc, self.extra)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Accepted candidates (0..depth) for n sequences."""
        if n == 0 or self.depth == 0:
            return np.zeros(n, dtype=np.int64)
        u = rng.random((n, self.depth))
        code = np.zeros(n, dtype=np.int64)
        stop_code = np.zeros(n, dtype=np.int64)
        alive = np.ones(n, dtype=bool)
        depth = np.zeros(n, dtype=np.int64)
        for d in range(self.depth):
            rank = np.searchsorted(self._cum[d], u[:, d], side="right")  # == k means "none of the top-k"
            code = code * self._base + (rank + 1)
            inside = (rank < self.acc.shape[1]) & np.isin(code, self._codes[d])
            alive &= inside
            depth += alive
            stop_code = np.where(alive, code, stop_code)
        if self._typical:
            p = np.array([self._typical.get(int(c), 0.0) for c in stop_code])
            depth = depth + (rng.random(n) < p)
        return depth


# ---- the heads' own cost ------------------------------------------------------------------------
def head_params(model) -> int:
    """One Medusa head: a residual block Linear(h, h) + bias with SiLU, then Linear(h, vocab)
    (Medusa 2.1.1; W2 starts as a copy of the LM head, so each head has its own)."""
    h, v = model.hidden_size, model.vocab_size
    return h * h + h + h * v


def heads_time_s(model, hardware, heads: int, tokens: int, dtype: str = "fp16", tensor_parallel: int = 1) -> float:
    """Roofline time of K heads over `tokens` hidden states: per head two GEMMs (weights read
    once, 2 FLOPs per weight per token), the logits written; split over the TP group like the
    LM head. Efficiencies and kernel overhead from the hardware profile's `linear` class."""
    if heads <= 0 or tokens <= 0:
        return 0.0

    wb = bytes_per_element(dtype)
    act_dtype = compute_dtype_for(dtype)
    ab = bytes_per_element(act_dtype)
    params = head_params(model) / tensor_parallel
    flops = 2.0 * params * tokens
    nbytes = params * wb + tokens * (2 * model.hidden_size + model.vocab_size / tensor_parallel) * ab
    eff = hardware.efficiency_for("linear")
    compute = flops / (hardware.peak_flops(act_dtype) * eff.compute)
    memory = nbytes / (hardware.memory_bandwidth_bytes_per_s() * eff.memory)
    launch = 2 * hardware.overheads.kernel_launch_us * 1e-6
    return heads * (max(compute, memory) + launch)


# ---- an empirical accepted-depth distribution (heads not independent) ---------------------------
@dataclass
class EmpiricalTreeSampler:
    """Accepted depths drawn from a histogram recorded on one tree (counts[d] = tree steps that
    accepted exactly d candidates), e.g. by the real executor. Real heads are right together
    more often than the independence model of TreeSampler assumes (an easy context is easy
    for every head), which that model cannot express; this one reproduces the run's own
    distribution on the tree it was recorded on, and nothing else (config.MedusaAcceptance).

    Per request (`components`, `weights`): a request at level u in [0, 1) draws its steps from
    the component j(u) (components ordered from hardest to easiest by mean depth); without a
    level, from the weighted mixture of the components."""

    counts: np.ndarray
    components: Optional[list] = None
    weights: Optional[Sequence[float]] = None
    assignment: Optional[dict] = None  # request id -> component index (as listed)

    def __post_init__(self):
        c = np.asarray(self.counts, dtype=np.float64)
        if c.ndim != 1 or c.size == 0 or np.any(c < 0) or c.sum() <= 0:
            raise ValueError("empirical Medusa acceptance needs non-negative counts, not all zero")
        self.depth = c.size - 1
        self.per_request = self.components is not None
        if self.per_request:
            pmfs = [np.asarray(x, dtype=np.float64) / np.sum(x) for x in self.components]
            w = np.asarray(self.weights if self.weights is not None else [1.0] * len(pmfs), dtype=np.float64)
            order = np.argsort([float(np.arange(p.size) @ p) for p in pmfs], kind="stable")
            self._pmfs = np.stack([pmfs[i] for i in order])
            self._w = w[order] / w.sum()
            self._wcum = np.cumsum(self._w)
            self._wcum[-1] = 1.0
            c = self._w @ self._pmfs  # without a level: the mixture
            # an assigned request sits at the middle of its component's window of levels
            pos = np.empty(len(order), dtype=np.int64)
            pos[order] = np.arange(len(order))
            lo = np.concatenate(([0.0], self._wcum[:-1]))
            self._assigned = {
                int(r): float((lo[pos[j]] + self._wcum[pos[j]]) / 2) for r, j in (self.assignment or {}).items()
            }
        self.counts = c
        self._cum = np.cumsum(c / c.sum())
        self._cum[-1] = 1.0

    def expected(self) -> float:
        """Expected tokens per tree step: 1 + mean accepted depth."""
        return 1.0 + float((np.arange(self.counts.size) * self.counts).sum() / self.counts.sum())

    def assigned_levels(self, rids, levels: np.ndarray) -> np.ndarray:
        """`levels` with each assigned request's replaced by its component's."""
        if not self.per_request or not self._assigned:
            return levels
        out = np.array(levels, dtype=np.float64, copy=True)
        for i, r in enumerate(rids):
            out[i] = self._assigned.get(int(r), out[i])
        return out

    def sample(
        self, rng: np.random.Generator, n: int, levels: Optional[np.ndarray] = None, u: Optional[np.ndarray] = None
    ) -> np.ndarray:
        """Accepted candidates (0..depth) for n sequences, by inverse CDF of one uniform each
        (`u`, e.g. stratified per request, or drawn from rng)."""
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        u = rng.random(n) if u is None else np.asarray(u, dtype=np.float64)
        if levels is None or not self.per_request:
            return np.searchsorted(self._cum, u, side="right").astype(np.int64)
        j = np.minimum(
            np.searchsorted(self._wcum, np.asarray(levels, dtype=np.float64), side="right"), len(self._w) - 1
        )
        cum = np.cumsum(self._pmfs[j], axis=1)
        cum[:, -1] = 1.0
        return (u[:, None] >= cum).sum(axis=1).astype(np.int64)
