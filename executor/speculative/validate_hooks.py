"""The validation matrix's hooks (analysis/validate/modes.py): run a speculative workload for
real, read back what the run measured, and turn it into the simulator's `speculation:` data.

- `execute`: `sim exec` of a workload with a `speculation:` section (engine.py); a pipelined
  run also gets speculation_drafting.parquet (the drafting thread's rounds), which the
  validation needs to price the SSM engine;
- `recorded_statistics(run_dir)`: the acceptance the run measured — the histogram of accepted
  tokens per round by drafted length s, its positional probabilities, per-SSM agreement and
  voting for Minions, the trajectory of s — read from speculation_rounds.parquet,
  acceptance.yaml, speculation_ssm.parquet and summary.json;
- `simulator_updates(stats)`: those measurements as `speculation.drafts[*].acceptance`
  (`empirical` when every round drafted one s, else `positional`), so the simulator samples the
  acceptance the real drafts achieved instead of the catalog's.

Minions: the executor records the acceptance of the *voted* draft (what the target verified);
each SSM's own agreement with the target is censored by the verification (it is only seen up
to the voted draft's first rejection + 1), so it is reported, not fitted. The simulator then
gets the voted draft's acceptance for every SSM with `voting.correlation: 1` (all SSMs share
one draw): its simulated acceptance per verification is the measured one, and its vote among
identical lengths does not change what is accepted."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from simulator.errors import InfersimError

# fields of an acceptance-table entry that an inline AcceptanceSpec carries too
_SPEC_FIELDS = ("kind", "alpha", "probs", "recorded_s", "counts", "measured_mode", "measured_temperature", "source")


DRAFTING_COLUMNS = ("t_start_s", "t_end_s", "sequences", "s", "pool_depth", "waited_s")


def execute(spec, requests, model, out, *, device="cpu", dtype=None, realtime=False, plots=False, quiet=True):
    """`sim exec` of the workload; a pipelined run also gets speculation_drafting.parquet: one
    row per drafting round of the drafting thread (start, end, sequences, s, pool depth after,
    time it waited), which the run directory does not otherwise keep and the validation needs
    to price the SSM engine. The pipelined decoder the engine builds is observed through a
    subclass put in its place for the duration of the call (engine.py looks it up when called)."""
    from . import pipeline
    from .engine import execute_speculative

    built = []
    original = pipeline.PipelinedDecoder

    class _Observed(original):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            built.append(self)

    pipeline.PipelinedDecoder = _Observed
    try:
        summary = execute_speculative(spec, requests, model, Path(out), device=device, dtype=dtype,
                                      realtime=realtime, plots=plots, quiet=quiet)
    finally:
        pipeline.PipelinedDecoder = original
    if built:
        from simulator.metrics.rundir import write_table
        from simulator.yamlio import atomic_path

        rows = np.array(built[-1].draft_rounds, dtype=np.float64).reshape(-1, len(DRAFTING_COLUMNS))
        with atomic_path(Path(out) / "speculation_drafting.parquet") as tmp:
            write_table(tmp, {c: (rows[:, i] if c.endswith("_s") else rows[:, i].astype(np.int64))
                              for i, c in enumerate(DRAFTING_COLUMNS)})
    return summary


def recorded_statistics(run_dir) -> dict:
    import json

    import pyarrow.parquet as pq
    import yaml

    run_dir = Path(run_dir)
    acc_path = run_dir / "acceptance.yaml"
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise InfersimError(f"{run_dir}: missing summary.json (not a speculative `sim exec` run directory)")
    spec_x = json.loads(summary_path.read_text()).get("speculation")
    if not spec_x:
        raise InfersimError(f"{run_dir}/summary.json: no 'speculation' entry (not a speculative run)")
    stats: dict = {"method": spec_x.get("method"), "pipelined": bool(spec_x.get("pipelined")),
                   "acceptance_rate": spec_x.get("acceptance_rate"),
                   "tokens_per_step": spec_x.get("acceleration_rate"),
                   "acceptance_by_position": spec_x.get("acceptance_by_position", []),
                   "s_final": spec_x.get("s", {}).get("final"), "s_changes": spec_x.get("s", {}).get("changes")}
    cfg_path = run_dir / "config.yaml"
    if cfg_path.is_file():
        w = (yaml.safe_load(cfg_path.read_text()) or {}).get("workload", {})
        stats["drafts"] = [{k: v for k, v in d.items() if k in ("model", "name", "weight") and v is not None}
                           for d in (w.get("speculation") or {}).get("drafts", [])]
    if acc_path.is_file():
        table = yaml.safe_load(acc_path.read_text()) or {}
        entries = table.get("entries") or []
        if entries:
            e = entries[0]
            stats["acceptance"] = {k: e[k] for k in _SPEC_FIELDS if k in e}
            stats["acceptance_label"] = e.get("draft")
    rounds_path = run_dir / "speculation_rounds.parquet"
    if rounds_path.is_file():
        t = pq.read_table(str(rounds_path)).to_pydict()
        s = np.asarray(t["s"], dtype=np.int64)
        stats["rounds"] = int(s.size)
        # the s trajectory: (round, s) where it changed
        change = np.flatnonzero(np.r_[True, s[1:] != s[:-1]]) if s.size else np.zeros(0, dtype=np.int64)
        stats["s_trajectory"] = [[int(i), int(s[i])] for i in change]
        stats["draft_steps"] = int(np.sum(t["draft_steps"]))
    ssm_path = run_dir / "speculation_ssm.parquet"
    if ssm_path.is_file():
        t = pq.read_table(str(ssm_path)).to_pydict()
        names = list(dict.fromkeys(t["ssm"]))
        ar = np.asarray(t["agreement_rate"], dtype=np.float64)
        voted = np.asarray(t["voted"], dtype=np.int64)
        ssm = np.asarray(t["ssm"])
        stats["per_ssm"] = {n: {"mean_agreement_rate": float(np.nanmean(ar[ssm == n])),
                                "voted": int(voted[ssm == n].sum()),
                                "final_weight": float(np.asarray(t["weight"])[ssm == n][-1])} for n in names}
    return stats


def simulator_updates(stats: dict) -> dict:
    """{"speculation": {"drafts": [...], "voting": {...}}}: the drafts the executor ran, each
    with the measured acceptance (Minions: with correlation 1, see the module docstring)."""
    acc = stats.get("acceptance")
    if not acc:
        return {}
    from simulator.speculative.config import AcceptanceSpec

    spec = AcceptanceSpec.model_validate({**acc, "source": f"measured by the executor ({stats.get('acceptance_label')})"})
    a = spec.model_dump(mode="json", exclude_none=True)
    drafts = stats.get("drafts") or []
    if not drafts:
        raise InfersimError("recorded statistics name no drafts (config.yaml of the run lacks speculation.drafts)")
    out = {"speculation": {"drafts": [{**d, "acceptance": a} for d in drafts]}}
    if len(drafts) > 1:
        out["speculation"]["voting"] = {"correlation": 1.0}
    return out
