"""A Medusa candidate tree laid out for one verification pass.

The tree objects are the simulator's own (`simulator/speculative/medusa_tree.py`: a list of
paths of top-i indices, parents first, the root implicit). Node 0 is the root: the token the
target itself chose last step, already committed but not yet in the KV cache. Node j >= 1 is
path p_j: head len(p_j) guessed it with rank p_j[-1], under its parent p_j[:-1].

Everything that does not depend on the tokens is computed once here: depths (position ids =
context + depth), the ancestor mask (tree attention), each node's parent, head and rank (to
gather candidate tokens from the heads' top-k with one indexing op), and the path of node
indices from the root to every node (the KV entries keep_path compacts)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from infersim.simulator.errors import InfersimError
from infersim.simulator.speculative.medusa_tree import Tree, cartesian_tree, choices_tree, greedy_tree, restrict

TREE_KINDS = ("choices", "cartesian", "greedy")


@dataclass
class TreeLayout:
    name: str
    paths: Tree  # the simulator's tree (root excluded)
    depths: list[int]  # per node, root included
    parent: torch.Tensor  # [n+1] long, parent[0] = 0
    head: torch.Tensor  # [n] long: node j+1 was guessed by head[j] (0-based)
    rank: torch.Tensor  # [n] long: ... as its rank[j]-th guess (0-based)
    ancestors: torch.Tensor  # [n+1, n+1] bool: node i sees node j (j an ancestor of i, or i itself)
    node_paths: list[list[int]]  # node indices from the root to each node, inclusive
    by_depth: list[torch.Tensor]  # node indices at depth 1, 2, ... (for acceptance, level by level)
    depth_t: torch.Tensor  # [n+1] long: depths as a tensor
    parent_list: list[int]  # parent as a list (the Python walk of greedy acceptance)

    def on(self, device) -> "TreeLayout":
        """The same tree with its tensors on `device` (moved once per decode, not per step)."""
        mv = lambda t: t.to(device)
        return replace(
            self,
            parent=mv(self.parent),
            head=mv(self.head),
            rank=mv(self.rank),
            ancestors=mv(self.ancestors),
            by_depth=[mv(t) for t in self.by_depth],
            depth_t=mv(self.depth_t),
        )

    @property
    def nodes(self) -> int:
        """Tokens verified per sequence (root included)."""
        return len(self.depths)

    @property
    def depth(self) -> int:
        return max(self.depths)

    @property
    def top_k(self) -> int:
        """Guesses the heads must propose for this tree."""
        return int(self.rank.max()) + 1 if len(self.paths) else 1

    @property
    def heads_used(self) -> int:
        return self.depth


def layout(paths: Tree, name: str = "tree") -> TreeLayout:
    paths = choices_tree(paths)  # checks: no duplicates, parents listed; parents first
    if not paths:
        raise InfersimError(f"Medusa tree '{name}' has no candidates")
    index = {(): 0}
    for j, p in enumerate(paths, start=1):
        index[tuple(p)] = j
    n = len(paths) + 1
    parent = [0] * n
    anc = np.eye(n, dtype=bool)
    node_paths = [[0]]
    for j, p in enumerate(paths, start=1):
        parent[j] = index[tuple(p[:-1])]
        anc[j] = anc[parent[j]]
        anc[j, j] = True
        node_paths.append(node_paths[parent[j]] + [j])
    depths = [0] + [len(p) for p in paths]
    by_depth = [
        torch.tensor([j for j in range(n) if depths[j] == d], dtype=torch.long) for d in range(1, max(depths) + 1)
    ]
    return TreeLayout(
        name,
        [tuple(p) for p in paths],
        depths,
        torch.tensor(parent, dtype=torch.long),
        torch.tensor([len(p) - 1 for p in paths], dtype=torch.long),
        torch.tensor([p[-1] for p in paths], dtype=torch.long),
        torch.from_numpy(anc),
        node_paths,
        by_depth,
        torch.tensor(depths, dtype=torch.long),
        parent,
    )


def build_tree(
    kind: str,
    *,
    heads: int,
    top_k: int = 10,
    choices=None,
    sizes=None,
    nodes: int | None = None,
    accuracies: np.ndarray | None = None,
) -> TreeLayout:
    """A tree of one of the three kinds, cut to what `heads` heads with `top_k` guesses can
    build (simulator.speculative.medusa_tree.restrict):
    choices: an explicit list of paths; cartesian: every path through the top-sizes[k] guesses
    of head k; greedy: the `nodes`-node tree (root included) maximising the expected accepted
    length under per-rank accuracies (heads x ranks, e.g. the measured ones)."""
    if kind == "choices":
        if not choices:
            raise InfersimError("tree kind 'choices' needs a list of paths")
        paths, name = choices_tree(choices), f"choices ({len(choices)})"
    elif kind == "cartesian":
        if not sizes:
            raise InfersimError("tree kind 'cartesian' needs sizes (top-s_k per head)")
        paths, name = cartesian_tree(sizes), "cartesian " + "x".join(str(int(s)) for s in sizes)
    elif kind == "greedy":
        if accuracies is None or nodes is None:
            raise InfersimError("tree kind 'greedy' needs accuracies and a node budget")
        if int(nodes) < 2:
            raise InfersimError(f"greedy tree budget must be at least 2 nodes (root included), got {nodes}")
        acc = np.asarray(accuracies, dtype=np.float64)[:heads, :top_k]
        paths, name = greedy_tree(acc, int(nodes)), f"greedy {int(nodes)}"
    else:
        raise InfersimError(f"unknown Medusa tree kind '{kind}': use one of {', '.join(TREE_KINDS)}")
    cut = restrict(paths, heads, top_k)
    return layout(cut, name)
