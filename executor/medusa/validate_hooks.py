"""The validation matrix's hooks for Medusa (analysis/validate/modes.py): run a Medusa workload
for real, read back what the run measured, and turn it into the simulator's `speculation.medusa`
section.

- `execute`: `sim exec` of a workload with `speculation: {method: medusa}` (the speculative
  engine with the Medusa decoder, serve.py);
- `recorded_statistics(run_dir)`: the heads' top-i accuracies measured in the run (every
  proposal scored against the tokens its sequence committed), tokens per step and the accepted
  length histogram, the executed tree; read from summary.json, medusa_accuracies.yaml and
  speculation_rounds.parquet;
- `simulator_updates(stats)`: {"speculation": {"medusa": {"accuracies": <the run's
  medusa_accuracies.yaml>, "heads": <heads used>, "tree": {"type": "choices", "choices":
  <the executed tree>}}}}. The simulator's `medusa.accuracies` is a table name or a file (no
  inline form), hence the file; the tree is pinned because a `choices` tree without choices
  means "the table's tree", and the run's table must not change which tree is simulated.

Nothing heavy is imported at module level (the matrix imports this to check availability)."""
from __future__ import annotations

from pathlib import Path

from simulator.errors import InfersimError

ACCURACIES_FILE = "medusa_accuracies.yaml"  # as serve.ACCURACIES_FILE (serve imports torch)


def execute(spec, requests, model, out, *, device="cpu", dtype=None, realtime=False, plots=False, quiet=True):
    if spec.speculation is None or spec.speculation.method != "medusa":
        raise InfersimError(f"workload '{spec.name}': the Medusa executor needs speculation.method: medusa")
    from ..speculative.engine import execute_speculative

    return execute_speculative(spec, requests, model, Path(out), device=device, dtype=dtype, realtime=realtime,
                               plots=plots, quiet=quiet)


def recorded_statistics(run_dir) -> dict:
    import json

    import numpy as np

    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise InfersimError(f"{run_dir}: missing summary.json (not a `sim exec` run directory)")
    sx = json.loads(summary_path.read_text()).get("speculation") or {}
    m = sx.get("medusa")
    if sx.get("method") != "medusa" or not m:
        raise InfersimError(f"{summary_path}: no Medusa entry in 'speculation' (not a Medusa `sim exec` run)")
    acc_path = run_dir / m.get("accuracies_file", ACCURACIES_FILE)
    if not acc_path.is_file():
        raise InfersimError(f"{run_dir}: missing {acc_path.name} (the head accuracies the run measured)")
    from analysis.medusa_study import expected_accept_length, load_accuracies

    table = load_accuracies(str(acc_path))
    per_rank = np.asarray(table.per_rank, dtype=np.float64)
    tree = [tuple(p) for p in m["tree_paths"]]
    hist = {int(k): int(v) for k, v in (m.get("accepted_hist") or {}).items()}
    steps = sum(hist.values())
    stats = {"method": "medusa", "mode": sx.get("mode"), "accuracies_file": str(acc_path.resolve()),
             "per_rank": per_rank.tolist(), "top_i": np.cumsum(per_rank, axis=1).tolist(),
             "positions_scored": m.get("head_positions_scored"),
             "heads": int(m["tree_depth"]), "tree_name": m.get("tree"), "tree": [list(p) for p in tree],
             "tree_nodes": int(m["tree_nodes"]),
             # tokens per sequence-step over every step (root-only steps of a request's last token included)
             "tokens_per_step": sx.get("acceleration_rate"),
             # over the steps that verified a whole tree: 1 + accepted candidates
             "tokens_per_tree_step": (sum((k + 1) * c for k, c in hist.items()) / steps) if steps else float("nan"),
             "accepted_hist": hist,
             # what the simulator's independence model predicts from these accuracies for this tree
             "predicted_tokens_per_tree_step": expected_accept_length(tree, per_rank),
             "rounds": sx.get("rounds"), "sequence_rounds": sx.get("sequence_rounds")}
    return stats


def simulator_updates(stats: dict) -> dict:
    if not stats or not stats.get("accuracies_file"):
        return {}
    return {"speculation": {"medusa": {"accuracies": stats["accuracies_file"], "heads": int(stats["heads"]),
                                       "tree": {"type": "choices", "choices": stats["tree"]}}}}
