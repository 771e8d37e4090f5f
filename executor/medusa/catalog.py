"""The heads' measured accuracies as a simulator catalog entry
(`simulator/catalog/medusa/<name>.yaml`, read by simulator.speculative.medusa_heads.load_accuracies and the
simulator's `speculation: {method: medusa, medusa: {accuracies: <name>}}`).

per_rank is the `greedy` reading (the target's own continuation: what greedy verification
accepts); the teacher-forced `text` reading is written as a comment, since the table format has
no field for it. The entry's tree is the greedy tree built from these accuracies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from infersim.simulator.speculative.medusa_tree import greedy_tree
from infersim.simulator.yamlio import write_atomic

from .accuracy import top_i

DEFAULT_TREE_NODES = 16


def _floor4(x: float) -> float:
    # rounded down so that a head's ranks never add up past 1 after rounding
    return float(np.floor(float(x) * 1e4) / 1e4)


def catalog_entry(meta: dict, name: str, tree_nodes: int = DEFAULT_TREE_NODES) -> dict:
    acc = meta["accuracies"]
    per_rank = [[_floor4(a) for a in row] for row in acc["greedy"]["per_rank"]]
    tree = greedy_tree(np.array(per_rank), tree_nodes)
    return {
        "name": name,
        "model": meta.get("target", name),
        "source": (
            f"measured by infersim executor/medusa on {meta.get('target')} (weights "
            f"{str(meta.get('target_sha256'))[:12]}, heads {meta.get('key')}): top-i accuracies of "
            f"{meta['num_heads']} Medusa-1 heads on the target's greedy continuations of held-out prompts"
        ),
        "top_k": int(acc["top_k"]),
        "per_rank": per_rank,
        "tree_name": f"greedy-{tree_nodes}",
        "tree_source": "infersim.executor.medusa: greedy tree (Medusa 2.3.3) from these accuracies, "
        f"{tree_nodes} nodes with the root",
        "tree": [list(p) for p in tree],
    }


def render(meta: dict, name: str, tree_nodes: int = DEFAULT_TREE_NODES) -> str:
    entry = catalog_entry(meta, name, tree_nodes)
    acc = meta["accuracies"]
    g, t = top_i(acc["greedy"]["per_rank"]), top_i(acc["text"]["per_rank"])
    lines = [
        f"# Medusa head accuracies of {meta.get('target')}, measured (not from a paper): written by",
        "#   sim medusa-train --catalog-out <this file>",
        "# per_rank[k][i]: probability that head k+1's rank-i guess (0 = best) is the token the target",
        f"# itself produces k+2 positions ahead, on its greedy continuation ({acc['greedy']['gen_len']} tokens) of",
        f"# {acc['greedy']['prompts']} held-out prompts of {acc['greedy']['prompt_len']} tokens "
        f"({int(sum(acc['greedy']['positions']))} head-positions scored).",
        "# top-1 / top-5 / top-10 per head, greedy reading:",
        *[f"#   head {k + 1}: {row[0]:.3f} / {row[4]:.3f} / {row[-1]:.3f}" for k, row in enumerate(g)],
        "# teacher-forced on held-out text (the text's own tokens; not used by the simulator):",
        *[f"#   head {k + 1}: {row[0]:.3f} / {row[4]:.3f} / {row[-1]:.3f}" for k, row in enumerate(t)],
    ]
    return "\n".join(lines) + "\n" + yaml.safe_dump(entry, sort_keys=False, default_flow_style=None, width=120)


def write_catalog(path: Path, meta: dict, name: str, tree_nodes: int = DEFAULT_TREE_NODES) -> Path:
    """Write the entry atomically (a temporary file renamed into place)."""
    write_atomic(path, render(meta, name, tree_nodes))
    return Path(path)
