"""The validation matrix's hooks (analysis/validate/modes.py): run a speculative workload for
real, read back what the run measured, and turn it into the simulator's `speculation:` data.

- `execute`: `sim exec` of a workload with a `speculation:` section (engine.py; a pipelined
  run's directory has speculation_drafting.parquet, the drafting thread's rounds, which the
  validation needs to price the SSM engine);
- `recorded_statistics(run_dir)`: the acceptance the run measured — the histogram of accepted
  tokens per round by drafted length s, its positional probabilities, per-SSM agreement and
  voting for Minions, the trajectory of s — read from speculation_rounds.parquet,
  acceptance.yaml, speculation_ssm.parquet and summary.json;
- `simulator_updates(stats)`: those measurements as `speculation.drafts[*].acceptance`
  (`empirical` when every round drafted one s, else `positional`), so the simulator samples the
  acceptance the real drafts achieved instead of the catalog's; per request (a `mixture`, see
  fit_request_mixture) when speculation_sequences.parquet holds enough requests: real
  acceptance varies by request, and i.i.d. rounds understate the spread of TPOT. The mixture
  has one component per request as realized, `assignment` (request id -> component: the
  validation simulates the same requests by id) and `draws: stratified` (each request's rounds
  along a low-discrepancy sequence, so its simulated acceptance stays near its realized one).

Minions: the executor records the acceptance of the *voted* draft (what the target verified);
each SSM's own agreement with the target is censored by the verification (it is only seen up
to the voted draft's first rejection + 1), so it is reported, not fitted. The simulator then
gets the voted draft's acceptance for every SSM with `voting.correlation: 1` (all SSMs share
one draw): its simulated acceptance per verification is the measured one, and its vote among
identical lengths does not change what is accepted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import yaml

from infersim.simulator.errors import InfersimError
from infersim.simulator.speculative.config import AcceptanceSpec

from ..options import VALIDATION, ExecOptions
from .acceptance import AcceptanceRecorder
from .engine import execute_speculative

PER_REQUEST_MIN = 16  # requests with verified rounds a run needs for per-request acceptance

# fields of an acceptance-table entry that an inline AcceptanceSpec carries too
_SPEC_FIELDS = ("kind", "alpha", "probs", "recorded_s", "counts", "measured_mode", "measured_temperature", "source")


def execute(spec, requests, model, out, opts: ExecOptions = VALIDATION):
    """`sim exec` of the workload (engine.py writes speculation_drafting.parquet for a
    pipelined run and speculation_sequences.parquet for every run itself)."""
    return execute_speculative(spec, requests, model, Path(out), opts)


# ---- per-request acceptance ----------------------------------------------------------------
def fit_request_mixture(
    rid, s, accepted, *, groups: int | None = 4, min_requests_per_group: int = 8, shrink: bool = True
) -> dict | None:
    """A `mixture` acceptance spec from per-(round, sequence) rows: requests are split into
    `groups` equal-count groups by their mean tokens per round; each group's positional
    acceptance is one component (weight: its fraction of requests).

    A request's mean over few rounds is noisy, so groups formed on it spread further apart than
    the requests' true acceptance levels do (and the simulator adds its own round-to-round noise
    on top). The components are therefore shrunk toward the pooled model: survival
    S'_g = lam S_g + (1 - lam) S_pool, which moves each group's expected tokens per round toward
    the pooled value by the factor lam (linear in S), with lam^2 = (between-request variance
    less the part sampling noise explains: var(m_r) - mean(v_r / n_r)) / (the groups' variance
    of expected tokens). None when there are too few requests to tell anything.

    `groups=None`: one component per request. `assignment` maps each request id to its
    component, for a simulation of the same requests by id (the validation); `shrink=False`
    keeps the groups' realized acceptance (what the run did, which is what a simulation of that
    run by id should reproduce; shrinking is for drawing levels for unknown requests)."""
    rid, s, accepted = (np.asarray(x, dtype=np.int64) for x in (rid, s, accepted))
    keep = s > 0
    rid, s, accepted = rid[keep], s[keep], accepted[keep]
    ids = np.unique(rid)
    groups = min(ids.size if groups is None else int(groups), ids.size // max(1, int(min_requests_per_group)))
    if groups < 2:
        return None
    tok = (accepted + 1).astype(np.float64)
    n_r = np.array([np.count_nonzero(rid == r) for r in ids], dtype=np.float64)
    m_r = np.array([tok[rid == r].mean() for r in ids])
    v_r = np.array([tok[rid == r].var(ddof=1) if n > 1 else 0.0 for r, n in zip(ids, n_r)])
    noise = float(np.mean(v_r / n_r))
    between = max(0.0, float(m_r.var(ddof=1)) - noise)
    order = ids[np.argsort(m_r, kind="stable")]
    parts = np.array_split(order, groups)

    def recorder(sel):
        r = AcceptanceRecorder()
        for si, k in zip(s[sel], accepted[sel]):
            r.add(si, k)
        return r

    smax = int(s.max())
    s_ref = int(np.bincount(s).argmax())  # the modal drafted length: where means are compared
    pool_probs = recorder(np.ones(s.size, dtype=bool)).positional_probs()

    def survival(probs):
        p = np.asarray(probs, dtype=np.float64)
        p = np.concatenate((p, np.full(max(0, smax - p.size), p[-1] if p.size else 0.0)))[:smax]
        return np.cumprod(p)

    S_pool = survival(pool_probs)
    S_g = [survival(recorder(np.isin(rid, part)).positional_probs()) for part in parts]
    w = np.array([part.size for part in parts], dtype=np.float64) / ids.size
    e_g = np.array([1.0 + S[:s_ref].sum() for S in S_g])
    spread = float(np.sum(w * (e_g - np.sum(w * e_g)) ** 2))
    lam = float(np.clip(np.sqrt(between / spread), 0.0, 1.0)) if spread > 0 else 0.0
    if not shrink:
        lam = 1.0
    comps = [_positional(lam * S + (1.0 - lam) * S_pool) for S in S_g]
    assignment = {int(r): g for g, part in enumerate(parts) for r in part}
    return {
        "kind": "mixture",
        "components": comps,
        "weights": [round(float(x), 6) for x in w],
        "assignment": assignment,
        "fit": {
            "requests": int(ids.size),
            "shrink": lam,
            "between_request_var": between,
            "noise_var": noise,
            "cv_tokens_per_round": float(m_r.std() / m_r.mean()),
            "group_tokens_per_round": [round(float(x), 4) for x in e_g],
            "s_ref": s_ref,
        },
    }


def _positional(survival) -> dict:
    """A positional spec from survival probabilities P(A >= i)."""
    S = np.asarray(survival, dtype=np.float64)
    prev = np.concatenate(([1.0], S[:-1]))
    cond = np.divide(S, prev, out=np.zeros_like(S), where=prev > 0)
    return {"kind": "positional", "probs": [round(float(x), 6) for x in np.clip(cond, 0.0, 1.0)]}


def recorded_statistics(run_dir) -> dict:
    run_dir = Path(run_dir)
    acc_path = run_dir / "acceptance.yaml"
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise InfersimError(f"{run_dir}: missing summary.json (not a speculative `sim exec` run directory)")
    spec_x = json.loads(summary_path.read_text()).get("speculation")
    if not spec_x:
        raise InfersimError(f"{run_dir}/summary.json: no 'speculation' entry (not a speculative run)")
    stats: dict = {
        "method": spec_x.get("method"),
        "pipelined": bool(spec_x.get("pipelined")),
        "acceptance_rate": spec_x.get("acceptance_rate"),
        "tokens_per_step": spec_x.get("acceleration_rate"),
        "acceptance_by_position": spec_x.get("acceptance_by_position", []),
        "s_final": spec_x.get("s", {}).get("final"),
        "s_changes": spec_x.get("s", {}).get("changes"),
    }
    cfg_path = run_dir / "config.yaml"
    if cfg_path.is_file():
        w = (yaml.safe_load(cfg_path.read_text()) or {}).get("workload", {})
        stats["drafts"] = [
            {k: v for k, v in d.items() if k in ("model", "name", "weight") and v is not None}
            for d in (w.get("speculation") or {}).get("drafts", [])
        ]
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
        stats["s_trajectory_rounds"] = [[int(i), int(s[i])] for i in change]
        # ... keyed by the selector's observations before that round (rounds that drafted
        # something; a prefill-only round observes nothing), which is what a replayed selector
        # counts (analysis/validate/spec_simulate.ReplayedSelector)
        seen = np.concatenate(([0], np.cumsum(np.asarray(t["drafted_tokens"]) > 0)))[: s.size]
        stats["s_trajectory"] = [[int(seen[i]), int(s[i])] for i in change]
        stats["draft_steps"] = int(np.sum(t["draft_steps"]))
    seq_path = run_dir / "speculation_sequences.parquet"
    if seq_path.is_file():
        t = pq.read_table(str(seq_path)).to_pydict()
        # one component per request, as realized, and which request is which: the validation
        # simulates these requests by id, so it is told which were easy (as it is told their
        # output lengths); levels drawn by id instead put the easy ones elsewhere in the queue
        # (spec-draft: mean end-to-end +12% from queueing behind requests that were fast for real)
        # (at least PER_REQUEST_MIN requests with verified rounds, as before: fewer say little)
        rids = np.asarray(t["rid"])[np.asarray(t["s"]) > 0]
        mix = (
            fit_request_mixture(t["rid"], t["s"], t["accepted"], groups=None, min_requests_per_group=1, shrink=False)
            if np.unique(rids).size >= PER_REQUEST_MIN
            else None
        )
        if mix is not None:
            stats["per_request"] = mix.pop("fit")
            stats["acceptance_per_request"] = mix
    ssm_path = run_dir / "speculation_ssm.parquet"

    if ssm_path.is_file():
        t = pq.read_table(str(ssm_path)).to_pydict()
        names = list(dict.fromkeys(t["ssm"]))
        ar = np.asarray(t["agreement_rate"], dtype=np.float64)
        voted = np.asarray(t["voted"], dtype=np.int64)
        ssm = np.asarray(t["ssm"])
        stats["per_ssm"] = {
            n: {
                "mean_agreement_rate": float(np.nanmean(ar[ssm == n])),
                "voted": int(voted[ssm == n].sum()),
                "final_weight": float(np.asarray(t["weight"])[ssm == n][-1]),
            }
            for n in names
        }
    return stats


def simulator_updates(stats: dict, per_request: bool = True) -> dict:
    """{"speculation": {"drafts": [...], "voting": {...}}}: the drafts the executor ran, each
    with the measured acceptance (Minions: with correlation 1, see the module docstring) —
    per request (a `mixture` fitted by fit_request_mixture) when the run recorded
    speculation_sequences.parquet with enough requests and `per_request`, else the pooled
    histogram / positional probabilities."""
    acc = stats.get("acceptance")
    if not acc:
        return {}

    src = f"measured by the executor ({stats.get('acceptance_label')})"
    mix = stats.get("acceptance_per_request") if per_request else None
    if mix:
        # the components were measured as the pooled entry was (same mode / temperature)
        setting = {k: acc[k] for k in ("measured_mode", "measured_temperature") if k in acc}
        # stratified draws: each request's simulated rounds follow its realized acceptance closely
        # (the simulation replays these requests; independent draws scatter one run's acceptance
        # rate by +-5% around the measured, the size of the target)
        mix = {
            **mix,
            "components": [{**c, **setting} for c in mix["components"]],
            **setting,
            "source": src + ", per request",
            "draws": "stratified" if mix.get("assignment") else "random",
        }
        spec = AcceptanceSpec.model_validate(mix)
    else:
        spec = AcceptanceSpec.model_validate({**acc, "source": src})
    a = spec.model_dump(mode="json", exclude_none=True)
    drafts = stats.get("drafts") or []
    if not drafts:
        raise InfersimError("recorded statistics name no drafts (config.yaml of the run lacks speculation.drafts)")
    out = {"speculation": {"drafts": [{**d, "acceptance": a} for d in drafts]}}
    if len(drafts) > 1:
        out["speculation"]["voting"] = {"correlation": 1.0}
    return out
