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
  <the executed tree>}, "acceptance": {"kind": "empirical", "counts": <accepted depths>,
  "tree": <the executed tree>}}}}. The simulator's `medusa.accuracies` is a table name or a file (no
  inline form), hence the file; the tree is pinned because a `choices` tree without choices
  means "the table's tree", and the run's table must not change which tree is simulated.

Nothing heavy is imported at module level (the matrix imports this to check availability)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from infersim.simulator.errors import InfersimError
from infersim.simulator.speculative.medusa_heads import expected_accept_length, load_accuracies

from ..options import VALIDATION, ExecOptions
from ..speculative.engine import execute_speculative

ACCURACIES_FILE = "medusa_accuracies.yaml"  # as serve.ACCURACIES_FILE (serve imports torch)


def execute(spec, requests, model, out, opts: ExecOptions = VALIDATION):
    if spec.speculation is None or spec.speculation.method != "medusa":
        raise InfersimError(f"workload '{spec.name}': the Medusa executor needs speculation.method: medusa")

    return execute_speculative(spec, requests, model, Path(out), opts)


def recorded_statistics(run_dir) -> dict:
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

    table = load_accuracies(str(acc_path))
    per_rank = np.asarray(table.per_rank, dtype=np.float64)
    tree = [tuple(p) for p in m["tree_paths"]]
    hist = {int(k): int(v) for k, v in (m.get("accepted_hist") or {}).items()}
    steps = sum(hist.values())
    stats = {
        "method": "medusa",
        "mode": sx.get("mode"),
        "accuracies_file": str(acc_path.resolve()),
        "per_rank": per_rank.tolist(),
        "top_i": np.cumsum(per_rank, axis=1).tolist(),
        "positions_scored": m.get("head_positions_scored"),
        "heads": int(m["tree_depth"]),
        "tree_name": m.get("tree"),
        "tree": [list(p) for p in tree],
        "tree_nodes": int(m["tree_nodes"]),
        # tokens per sequence-step over every step (root-only steps of a request's last token included)
        "tokens_per_step": sx.get("acceleration_rate"),
        # over the steps that verified a whole tree: 1 + accepted candidates
        "tokens_per_tree_step": (sum((k + 1) * c for k, c in hist.items()) / steps) if steps else float("nan"),
        "accepted_hist": hist,
        # what the simulator's independence model predicts from these accuracies for this tree
        "predicted_tokens_per_tree_step": expected_accept_length(tree, per_rank),
        "rounds": sx.get("rounds"),
        "sequence_rounds": sx.get("sequence_rounds"),
    }
    seq_path = run_dir / "speculation_sequences.parquet"
    if seq_path.is_file():
        t = pq.read_table(str(seq_path)).to_pydict()
        fit = fit_depth_mixture(t["rid"], t["s"], t["accepted"], int(m["tree_depth"]), groups=None)
        if fit is not None:
            stats["per_request"] = fit
    return stats


def fit_depth_mixture(rid, s, accepted, depth: int, *, groups: int | None = 4, min_requests_per_group: int = 8):
    """Per-request accepted depths: the whole-tree steps (drafted length = depth: the request had
    more than depth tokens to go, so nothing was cut) grouped into `groups` equal-count groups of
    requests by mean depth; each group's histogram, shrunk toward the pooled one
    (pmf'_g = lam pmf_g + (1 - lam) pmf_pool) by the same rule as the draft models'
    (executor/speculative/validate_hooks.fit_request_mixture: lam^2 = between-request variance
    less sampling noise, over the groups' variance). None with too few requests.

    groups=None: one component per request, as realized and unshrunk (what a replay of these very
    requests by id needs: with stratified draws each request then steps through its own
    histogram; shrunk groups plus stratified draws left the simulated spread of tokens per step
    narrower than the measured, cv 0.22 against 0.29, and TPOT p99 -21% to -25%)."""
    rid, s, accepted = (np.asarray(x, dtype=np.int64) for x in (rid, s, accepted))
    keep = (s == depth) & (accepted >= 0) & (accepted <= depth)
    rid, accepted = rid[keep], accepted[keep]
    ids = np.unique(rid)
    per_request = groups is None
    if per_request and ids.size < int(min_requests_per_group):
        return None  # too few requests for a spread to mean anything
    groups = ids.size if per_request else min(int(groups), ids.size // max(1, int(min_requests_per_group)))
    if groups < 2:
        return None
    d = accepted.astype(np.float64)
    n_r = np.array([np.count_nonzero(rid == r) for r in ids], dtype=np.float64)
    m_r = np.array([d[rid == r].mean() for r in ids])
    v_r = np.array([d[rid == r].var(ddof=1) if n > 1 else 0.0 for r, n in zip(ids, n_r)])
    between = max(0.0, float(m_r.var(ddof=1)) - float(np.mean(v_r / n_r)))
    parts = np.array_split(ids[np.argsort(m_r, kind="stable")], groups)
    hist = lambda sel: np.bincount(accepted[sel], minlength=depth + 1).astype(np.float64)
    pool = hist(np.ones(rid.size, dtype=bool))
    pool /= pool.sum()
    pmfs = [h / h.sum() for h in (hist(np.isin(rid, p)) for p in parts)]
    w = np.array([p.size for p in parts], dtype=np.float64) / ids.size
    means = np.array([np.arange(depth + 1) @ p for p in pmfs])
    spread = float(np.sum(w * (means - w @ means) ** 2))
    lam = 1.0 if per_request else (float(np.clip(np.sqrt(between / spread), 0.0, 1.0)) if spread > 0 else 0.0)
    comps = [lam * p + (1.0 - lam) * pool for p in pmfs]
    return {
        "components": [[round(float(x), 6) for x in c] for c in comps],
        "weights": w.tolist(),
        # which group each request was in: the validation replays these requests by id
        "assignment": {int(r): g for g, part in enumerate(parts) for r in part},
        "requests": int(ids.size),
        "shrink": lam,
        "between_request_var": between,
        "cv_tokens_per_step": float(np.std(m_r + 1) / np.mean(m_r + 1)),
        "group_mean_depth": [round(float(x), 4) for x in means],
    }


def empirical_acceptance(stats: dict, per_request: bool = True) -> dict | None:
    """The run's accepted-depth histogram on its tree as `speculation.medusa.acceptance`
    (config.MedusaAcceptance); None when the run verified no whole tree."""
    hist = {int(k): int(v) for k, v in (stats.get("accepted_hist") or {}).items()}
    depth = max((len(p) for p in stats.get("tree") or []), default=0)
    if depth == 0 or sum(hist.values()) <= 0:
        return None
    out = {
        "kind": "empirical",
        "counts": [hist.get(d, 0) for d in range(depth + 1)],
        "tree": [list(p) for p in stats["tree"]],
        "source": "accepted depths measured by the executor",
    }
    pr = stats.get("per_request")
    if pr and per_request:
        out.update(components=pr["components"], weights=pr["weights"])
        if pr.get("assignment"):
            # the simulation replays these requests: each at its own group, its tree steps drawn
            # along a low-discrepancy sequence (as the draft models' per-request acceptance)
            out.update(assignment={int(k): int(v) for k, v in pr["assignment"].items()}, draws="stratified")
        out["source"] += ", per request"
    return out


def simulator_updates(stats: dict, empirical: bool = True, per_request: bool = True) -> dict:
    """The run's accuracies and tree, and (`empirical`, the default) its accepted-depth
    distribution: the simulator then draws tree steps from what the run measured instead of
    from independent heads, which read 15% low on acceptance (real heads are right together
    more often); per request (`per_request`: the groups fitted by fit_depth_mixture) when the
    run recorded enough requests. The accuracies then decide nothing here; they are kept so
    that a tree other than the recorded one can be simulated from them."""
    if not stats or not stats.get("accuracies_file"):
        return {}
    medusa = {
        "accuracies": stats["accuracies_file"],
        "heads": int(stats["heads"]),
        "tree": {"type": "choices", "choices": stats["tree"]},
    }
    emp = empirical_acceptance(stats, per_request) if empirical else None
    if emp is not None:
        medusa["acceptance"] = emp
    return {"speculation": {"medusa": medusa}}
