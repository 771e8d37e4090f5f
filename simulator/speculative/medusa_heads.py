"""Medusa head accuracy tables and the tree math built on them (Medusa section 2.3.3).

A table (simulator/catalog/medusa/NAME.yaml, or any YAML/JSON file) gives each head's top-1
and top-5 accuracy (or its accuracy at every rank) and a sparse tree. From the rank accuracies
`acc[k, i]` (the probability that head k's rank-i guess is right, heads assumed independent):
the probability that a tree node's whole path is right is the product of the accuracies along
it; the expected accepted length of a tree is 1 (the base model's own token) plus the sum of
those over its nodes; and `grow_tree` extends a table's tree greedily by the most probable
child of any node."""

from __future__ import annotations

import heapq
from pathlib import Path
from typing import Literal, Sequence, Union

import numpy as np
from pydantic import BaseModel, Field, model_validator

from ..errors import InfersimError, UnknownNameError
from ..paths import catalog_dir
from ..validation import STRICT_CONFIG
from ..yamlio import load_mapping, validate


class HeadTop(BaseModel):
    model_config = STRICT_CONFIG
    top1: float = Field(ge=0, le=1)
    top5: float = Field(ge=0, le=1)

    @model_validator(mode="after")
    def _order(self):
        if self.top5 < self.top1:
            raise ValueError(f"top5 ({self.top5}) is below top1 ({self.top1})")
        return self


class HeadAccuracies(BaseModel):
    """Medusa head accuracies and a sparse tree (simulator/catalog/medusa/*.yaml)."""

    model_config = STRICT_CONFIG
    name: str
    model: str = ""
    source: str
    top_k: int = Field(10, ge=1)
    heads: list[HeadTop] = []
    per_rank: Union[Literal["geometric"], list[list[float]]] = "geometric"
    tree_name: str = ""
    tree_source: str = ""
    tree: list[list[int]]

    @model_validator(mode="after")
    def _check(self):
        if isinstance(self.per_rank, list):
            if any(not 0 <= a <= 1 for row in self.per_rank for a in row) or any(
                sum(r) > 1 + 1e-9 for r in self.per_rank
            ):
                raise ValueError("per_rank accuracies must lie in [0, 1] and add up to at most 1 per head")
        elif not self.heads:
            raise ValueError("per_rank 'geometric' needs heads with top1/top5")
        depth = self.num_heads
        seen = {()}
        for choice in self.tree:
            path = tuple(choice)
            if not path or len(path) > depth or min(path) < 0 or max(path) >= self.top_k:
                raise ValueError(f"tree node {choice}: needs 1..{depth} indices, each below top_k {self.top_k}")
            if path[:-1] not in seen:
                raise ValueError(f"tree node {choice} comes before its parent {list(path[:-1])}")
            if path in seen:
                raise ValueError(f"tree node {choice} is listed twice")
            seen.add(path)
        return self

    @property
    def num_heads(self) -> int:
        return len(self.per_rank) if isinstance(self.per_rank, list) else len(self.heads)

    def rank_accuracies(self) -> np.ndarray:
        """(heads x top_k): probability that head k's rank-i guess is the right token."""
        if isinstance(self.per_rank, list):
            out = np.zeros((len(self.per_rank), self.top_k))
            for k, row in enumerate(self.per_rank):
                out[k, : min(len(row), self.top_k)] = row[: self.top_k]
            return out
        return np.array([_geometric_ranks(h.top1, h.top5, self.top_k) for h in self.heads])


def _geometric_ranks(top1: float, top5: float, top_k: int) -> np.ndarray:
    """a(i) = top1 * r**i with sum_{i<5} a(i) = top5 (bisection on r; the sum rises with r)."""
    if top1 <= 0:
        return np.zeros(top_k)
    target = top5 / top1
    lo, hi = 0.0, 10.0
    for _ in range(200):
        r = 0.5 * (lo + hi)
        if sum(r**i for i in range(5)) < target:
            lo = r
        else:
            hi = r
    acc = top1 * r ** np.arange(top_k)
    total = acc.sum()
    return acc / total if total > 1 else acc  # never more than certainty over the top_k guesses


def list_accuracy_tables() -> list[str]:
    folder = catalog_dir() / "medusa"
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def load_accuracies(name_or_path: str) -> HeadAccuracies:
    """A built-in table by name (simulator/catalog/medusa/NAME.yaml) or a YAML/JSON file."""
    path = Path(str(name_or_path)).expanduser()
    if path.suffix not in (".yaml", ".yml", ".json"):
        path = catalog_dir() / "medusa" / f"{str(name_or_path).strip().lower()}.yaml"
        if not path.is_file():
            raise UnknownNameError("Medusa accuracy table", str(name_or_path), list_accuracy_tables())
    return validate(HeadAccuracies, load_mapping(path), str(path))


def path_accuracy(path: Sequence[int], acc: np.ndarray) -> float:
    """Probability that a node's whole path is right: product over depth of rank accuracies."""
    return float(np.prod([acc[depth, idx] for depth, idx in enumerate(path)]))


def expected_accept_length(tree: Sequence[Sequence[int]], acc: np.ndarray) -> float:
    """1 (the base model's own token) + sum over non-root nodes of their path accuracy."""
    return 1.0 + sum(path_accuracy(p, acc) for p in tree)


def grow_tree(table: HeadAccuracies, nodes: int) -> list[tuple[int, ...]]:
    """A tree of `nodes` tokens (the root included): a prefix of the table's tree, extended
    past its end greedily by the most probable child of any node (Medusa section 2.3.3)."""
    if nodes < 1:
        raise InfersimError(f"candidates must be >= 1, got {nodes}")
    return grow_greedy([tuple(c) for c in table.tree[: nodes - 1]], nodes, table.rank_accuracies())


def grow_greedy(
    tree: list[tuple[int, ...]], nodes: int, acc: np.ndarray, probability=path_accuracy
) -> list[tuple[int, ...]]:
    """`tree` (its non-root paths) extended to `nodes` tokens, the root included, one node at a
    time: the child of any node with the highest `probability(path, acc)`. Optimal at every size
    when a child is never more probable than its parent (Medusa section 2.3.3)."""
    tree = list(tree)
    have = set(tree) | {()}
    heap: list[tuple[float, tuple[int, ...]]] = []

    def push_children(parent: tuple[int, ...]) -> None:
        if len(parent) >= acc.shape[0]:
            return
        for i in range(acc.shape[1]):
            child = parent + (i,)
            if child not in have:
                heapq.heappush(heap, (-probability(child, acc), child))

    for parent in list(have):
        push_children(parent)
    while len(tree) < nodes - 1 and heap:
        _, node = heapq.heappop(heap)
        if node in have:
            continue
        tree.append(node)
        have.add(node)
        push_children(node)
    return tree
