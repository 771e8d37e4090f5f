"""Predicted against measured for the speculative cases (spec-draft, Minions).

Levels as compare.py, per *round* (drafting s steps + one verification; pipelined: one
verification) instead of per iteration:
1. the round cost model alone: the fit's time for each round the executor ran (its batch
   rebuilt from the run: spec_rounds.py) against the measured round period — the per-round
   latency target; split into the drafts' part and the target's;
2. rounds: executed against simulated (count, mean batch, share of rounds with the same
   batch and prefill tokens at the same index: where the schedules agree);
3. requests and totals: TTFT / TPOT / end-to-end per request, throughput, tokens per step and
   acceptance (compare.request_level / totals_level).

The targets and their attribution are compare.check_targets' (timing noise, acceptance model,
scheduling mismatch, cost model), plus acceptance and tokens per step within 5%, a miss of
which is the acceptance model's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from infersim.simulator.speculative.config import SpeculationSection
from infersim.simulator.speculative.selector import AdaptiveLengthSelector

from .compare import COMPONENTS, Comparison, check_targets, request_level, totals_level, within_run_speed
from .measured import load_run
from .metrics import mape, median_ape, rel_error, signed_bias, total_bias
from .spec_costmodel import contended, overlap_fraction, predict_drafting, predict_rounds_as_run
from .spec_rounds import drafting_rounds, handoffs_s, rebuild_rounds

ACCEPTANCE_TARGET = 0.05
STALL_FACTOR = 2.0


def round_stalls(y: np.ndarray, t: dict, window: int = 3) -> np.ndarray:
    """Rounds that took >= 2x the median of up to `window` like rounds either side (same batch
    size, same number of prefills, same s): the process lost its core."""
    y = np.asarray(y, dtype=np.float64)
    kind = list(zip(t["batch_size"].tolist(), t["prefill_seqs"].tolist(), t["s"].tolist()))
    out = np.zeros(y.size, dtype=bool)
    for i in range(y.size):
        if not np.isfinite(y[i]):
            continue
        lo, hi = max(0, i - window), min(y.size, i + window + 1)
        ref = [y[j] for j in range(lo, hi) if j != i and np.isfinite(y[j]) and kind[j] == kind[i]]
        if len(ref) >= 2:
            out[i] = y[i] >= STALL_FACTOR * float(np.median(ref))
    return out


def _contended(solo: np.ndarray, overlap: np.ndarray, share, fit=None) -> np.ndarray:
    """As the simulator's SharedDevice prices a pass that ran alongside the other thread for
    `overlap` of its time: the fit's contention model (processor sharing for fits made before
    whole_pass existed)."""
    return contended(
        solo, overlap, share, ((fit.meta or {}) if fit is not None else {}).get("pipeline_contention", "sharing")
    )


def round_level(t: dict, fit, drafting: dict | None = None) -> dict:
    y = np.asarray(t["fit_y_s"], dtype=np.float64)

    # pipelined: each pass priced as the simulator prices it (its overlap with the other thread)
    pred = predict_rounds_as_run(fit, t, drafting)
    draft_p, target_p = fit.predict_parts(t)
    ok = np.isfinite(y)
    stalled = round_stalls(y, t)
    keep = ok & ~stalled
    d_meas = np.asarray(t["draft_s"], dtype=np.float64)
    has_d = ok & (np.asarray(t["draft_steps"]) > 0) & (d_meas > 0)
    return {
        "rounds": int(y.size),
        "compared": int(ok.sum()),
        "mape": mape(pred[ok], y[ok]),
        "bias": signed_bias(pred[ok], y[ok]),
        "median_ape": median_ape(pred[ok], y[ok]),
        "total_bias": total_bias(pred[ok], y[ok]),
        "mape_unstalled": mape(pred[keep], y[keep]),
        "noise": {"stalls": float(stalled[ok].mean()) if ok.any() else float("nan"), "jitter": float("nan")},
        # the drafts' share: the fit's draft terms against the measured drafting time
        "draft_total_bias": total_bias(draft_p[has_d], d_meas[has_d]) if has_d.any() else None,
        "draft_share_measured": float(d_meas[ok].sum() / y[ok].sum()) if ok.any() else None,
        "predicted_s": pred.tolist(),
        "measured_s": y.tolist(),
        "batch_size": t["batch_size"].tolist(),
        "drafting": _drafting_level(drafting, fit, t),
    }


def _drafting_level(d: dict | None, fit, t_verify: dict | None = None) -> dict | None:
    """Pipelined: the drafting thread's rounds, predicted against measured busy time."""
    if d is None or not len(d["busy_s"]):
        return None

    p, m = predict_drafting(fit, d), np.asarray(d["busy_s"], dtype=np.float64)
    shares = (fit.meta or {}).get("pipeline_shares")
    if shares and t_verify is not None:
        p = _contended(
            p,
            overlap_fraction(d["t_start_s"], d["t_end_s"], t_verify["t_start_s"], t_verify["t_end_s"]),
            shares["ssm"],
            fit,
        )
    ok = np.isfinite(m)
    p, m = p[ok], m[ok]
    return {"rounds": int(m.size), "mape": mape(p, m), "bias": signed_bias(p, m), "total_bias": total_bias(p, m)}


def tokens_per_round_per_request(run) -> np.ndarray:
    """Per request: tokens per verification round (coupled runs: every running sequence is
    verified in every round) — the output after the first token over the rounds that ended
    after its first token and no later than its finish. NaN for a request with no such round."""
    r, se = run.requests, run.series
    start = np.asarray(se["t_start_s"], dtype=np.float64)
    end = np.asarray(se["t_end_s"], dtype=np.float64)
    first = np.asarray(r["first_token_s"], dtype=np.float64)
    fin = np.asarray(r["finish_s"], dtype=np.float64)
    out = np.asarray(r["output_tokens"], dtype=np.float64)
    eps = 1e-9
    rounds = np.array([np.count_nonzero((start >= a - eps) & (end <= b + eps)) for a, b in zip(first, fin)])
    return np.where(rounds > 0, (out - 1.0) / np.maximum(rounds, 1), np.nan)


def _acceptance_why(sim_run, medusa: bool) -> str:
    """What the simulation assumed about acceptance, for a miss's attribution."""
    sp = (sim_run.config.get("workload") or {}).get("speculation") or {}
    if medusa:
        acc = (sp.get("medusa") or {}).get("acceptance")
        if acc:
            return (
                "the run's accepted-depth histogram on its tree"
                + (", per request" if acc.get("components") else "")
                + ": levels are assigned to requests by id, not by how hard their prompts are"
            )
        return "the simulator's token-tree model from the recorded top-k accuracies of each head, heads taken as independent"
    if any((d.get("acceptance") or {}).get("kind") == "mixture" for d in sp.get("drafts") or []):
        return (
            "the measured acceptance per request (a mixture fitted from the run): levels are assigned to "
            "requests by id, not by how hard their prompts are, so which requests are slow differs"
        )
    return "the measured positional acceptance sampled i.i.d. per round, while real acceptance is correlated within a request"


def spread(x: np.ndarray) -> dict:
    x = x[np.isfinite(x)]
    if not x.size:
        return {}
    return {
        "p10": float(np.percentile(x, 10)),
        "p50": float(np.median(x)),
        "p90": float(np.percentile(x, 90)),
        "cv": float(x.std() / x.mean()),
    }


def schedule_level(exec_run, sim_run) -> dict:
    es, ss = exec_run.series, sim_run.series
    n = min(len(es["t_start_s"]), len(ss["t_start_s"]))
    same = np.ones(n, dtype=bool)
    for c in ("batch_size", "prefill_tokens"):
        same &= np.asarray(es[c][:n]) == np.asarray(ss[c][:n])
    return {
        "executed": int(len(es["t_start_s"])),
        "simulated": int(len(ss["t_start_s"])),
        "rounds_error": rel_error(float(len(ss["t_start_s"])), float(len(es["t_start_s"]))),
        "mean_batch_executed": float(np.mean(es["batch_size"])),
        "mean_batch_simulated": float(np.mean(ss["batch_size"])),
        "aligned": int(same.sum()),
        "aligned_fraction": float(same.sum() / max(1, n)),
        "first_divergence": int(np.argmin(same)) if not same.all() else int(n),
    }


def selector_replay(exec_run, t: dict) -> dict:
    """The simulator's AdaptiveLengthSelector fed the executor's own observations, in order: t =
    the round's drafting + verification time (decoder.py: t2 - t0) and vl = the mean tokens of
    the sequences that drafted the full s (verified_length), for every round that drafted. The
    policy is one object on both sides, so it must take the executed s trajectory exactly."""
    sec = SpeculationSection.model_validate(exec_run.config["workload"]["speculation"])
    sel = AdaptiveLengthSelector.from_section(sec)
    path = Path(exec_run.path) / "speculation_sequences.parquet"
    if not path.is_file() or sec.pipeline_on:
        return {"same": None, "why": "not a coupled run with speculation_sequences.parquet"}

    q = pq.read_table(str(path)).to_pydict()
    q_round, q_s, q_acc = (np.asarray(q[k], dtype=np.int64) for k in ("round", "s", "accepted"))
    s_exec = np.asarray(t["s"], dtype=np.int64)
    chosen = np.empty_like(s_exec)
    for i in range(s_exec.size):
        chosen[i] = sel.s  # what the selector says before round i
        if int(t["drafted_tokens"][i]) <= 0:
            continue
        m = q_round == int(t["round"][i])
        full = m & (q_s == s_exec[i])
        pool = full if full.any() else m
        vl = float((q_acc[pool] + 1).mean())
        sel.observe(float(t["draft_s"][i]) + float(t["verify_s"][i]), vl)
    same = bool(np.array_equal(chosen, s_exec))
    change = np.flatnonzero(np.r_[True, chosen[1:] != chosen[:-1]]) if chosen.size else chosen
    change_e = np.flatnonzero(np.r_[True, s_exec[1:] != s_exec[:-1]]) if s_exec.size else s_exec
    return {
        "same": same,
        "agreement": float(np.mean(chosen == s_exec)) if s_exec.size else float("nan"),
        "trajectory": [[int(i), int(chosen[i])] for i in change],
        "executed": [[int(i), int(s_exec[i])] for i in change_e],
    }


def s_share(s) -> dict:
    """{s: share of rounds}."""
    s = np.asarray(s, dtype=np.int64)
    return {int(v): float(np.mean(s == v)) for v in np.unique(s)} if s.size else {}


def s_share_series(series: dict) -> dict:
    """{s: share of rounds} from a simulated summary's `series.rounds` (t, batch, tokens, step, s)."""
    rows = (series.get("rounds") or {}).get("rows") or []
    return s_share([r[-1] for r in rows])


def pipeline_busy(t: dict, drafting: dict | None, sim_summary: dict) -> dict:
    """Busy seconds of the two engines, executed (the verifying thread's passes, the drafting
    thread's rounds and how long both were busy at once) and simulated (the SSM and LLM engines)."""
    vs, ve = np.asarray(t["t_start_s"], dtype=np.float64), np.asarray(t["t_end_s"], dtype=np.float64)
    out = {"verify_busy_s": float((ve - vs).sum())}
    if drafting is not None:
        ds, de = np.asarray(drafting["t_start_s"], dtype=np.float64), np.asarray(drafting["t_end_s"], dtype=np.float64)
        out["draft_busy_s"] = float((de - ds).sum())
        out["both_busy_s"] = float(
            sum(np.clip(np.minimum(de, b) - np.maximum(ds, a), 0.0, None).sum() for a, b in zip(vs, ve))
        )
    eng = (sim_summary.get("speculation") or {}).get("engines") or {}
    out["simulated_llm_busy_s"] = (eng.get("llm") or {}).get("busy_s")
    out["simulated_ssm_busy_s"] = (eng.get("ssm") or {}).get("busy_s")
    return out


def pipeline_source(b: dict, noise: str, cost_bias: float | None = None, metric: str = "") -> str:
    """Where a pipelined end-to-end miss comes from, from the engines' busy times: the cost model
    when either engine's simulated busy time is more than 10% off the measured one, or when the
    fit's total bias on the executed passes is more than 5% (the passes themselves were priced
    off: the validated run ran at another speed than the calibration runs around it); otherwise
    the scheduling (which passes new requests join, the pool's hand-overs)."""
    v, vp = b["verify_busy_s"], b.get("simulated_llm_busy_s")
    d, dp = b.get("draft_busy_s"), b.get("simulated_ssm_busy_s")
    txt = (
        f"verifying passes {v:.2f} s measured against {vp:.2f} s simulated, drafting {d:.2f} s against {dp:.2f} s; "
        f"both engines busy at once {b.get('both_busy_s', float('nan')):.2f} s"
        if None not in (vp, d, dp)
        else ""
    )
    hm, hf = b.get("handoff_measured_s"), b.get("handoff_fitted_s")
    if txt and None not in (hm, hf):
        txt += f"; hand-over after a pass {hm * 1e3:.2f} ms measured (median), {hf * 1e3:.2f} ms fitted"
    off = [(x, y) for x, y in ((vp, v), (dp, d)) if None not in (x, y) and y > 0 and abs(x / y - 1.0) > 0.10]
    bias = cost_bias if cost_bias is not None and np.isfinite(cost_bias) else 0.0
    if metric == "TTFT p99" and not off and 0.02 < abs(bias) <= 0.05:
        # near the batch cap the TTFT tail is the last arrivals' wait for a free slot: the finish
        # times before it, a few percent off, move a wait a tenth their size (docs/validation.md)
        return (
            f"cost model, magnified by the queue (the passes priced {cost_bias:+.1%} in total; the TTFT tail is "
            f"the last arrivals' wait for a free slot, set by finish times hundreds of milliseconds into the "
            f"run; pipeline: {txt}; also {noise})"
        )
    if off or abs(bias) > 0.05:
        return (
            f"cost model (pipeline: {txt}; the two engines' speed while both run is priced as a shared device "
            f"at slowdowns fitted on the held-out runs around the case, while a pipelined run on a shared CPU "
            f"can run at another speed than the runs around it; also {noise})"
        )
    return f"scheduling mismatch (pipeline: {txt}; also {noise})"


@dataclass(frozen=True)
class ExecutedSpec:
    """What the executor ran in one speculative case: its run folder and the rounds rebuilt
    from it (spec_rounds.py)."""

    run: Any = field(metadata={"help": "the executor's run (measured.load_run)"})
    rounds: dict = field(metadata={"help": "the verification rounds (spec_rounds.rebuild_rounds)"})
    drafting: dict | None = field(
        default=None, metadata={"help": "a pipelined run's drafting rounds (spec_rounds.drafting_rounds)"}
    )
    pipelined: bool = field(default=False, metadata={"help": "drafts ran in their own process beside the target"})

    @classmethod
    def load(cls, run_dir: Path, pipelined: bool = False) -> ExecutedSpec:
        return cls(load_run(run_dir), rebuild_rounds(run_dir), drafting_rounds(run_dir), pipelined)


@dataclass(frozen=True)
class _JudgedRuns:
    """The simulations a speculative case is compared with."""

    sim_run: Any  # the one the targets are judged on
    free_run: Any  # adaptive s with an s-replay: the free-running selector's simulation, reported beside; else None
    s_replay_run: Any  # the simulation that follows the executed s trajectory (None: none ran)
    selector_on: bool  # the executed run chose s adaptively


def compare_spec(
    case: str,
    executed: ExecutedSpec,
    sim_run,
    fit,
    compare: tuple[str, ...],
    s_replay_run=None,
) -> Comparison:
    exec_run, t = executed.run, executed.rounds
    c = Comparison(case)
    _cost_model_level(c, executed, fit)
    runs = _judged_runs(exec_run, sim_run, s_replay_run)
    if runs.free_run is not None:
        c.info["selector_on_executed_inputs"] = selector_replay(exec_run, t)
    c.iterations = schedule_level(exec_run, runs.sim_run)
    c.requests = request_level(exec_run, runs.sim_run)
    c.totals = totals_level(exec_run, runs.sim_run)
    checks = check_targets(c, compare)
    for ch in checks:  # a round, not an iteration
        if ch["metric"] == "per-iteration latency MAPE":
            ch["metric_detail"] = "per round (draft s steps + verification)"
    if "acceptance" in compare:
        checks.extend(_acceptance_checks(c, exec_run, runs.sim_run))
    if not executed.pipelined:
        _blame_per_request_acceptance(c, checks, exec_run, runs.sim_run)
    _blame_narrow_simulated_spread(c, checks)
    _adaptive_s_level(c, checks, executed, runs)
    if executed.pipelined:
        _blame_pipeline(c, checks, executed, runs.sim_run, fit)
    c.checks = checks
    return c


def _judged_runs(exec_run, sim_run, s_replay_run) -> _JudgedRuns:
    """Adaptive s with an s-replay: the targets are judged on the s-replay. The selector is
    the same policy object on both sides, and fed the executor's own observations it decides
    exactly as the executor did (selector_on_executed_inputs, checked); but each decision is
    the sign of a slope fitted through 40 noisy t / vl samples that mostly follow the load (the
    batch filling up and draining), often within noise of zero, so a simulation that samples
    acceptance and predicts times flips some of them. The simulation that follows the executed
    s trajectory (sim-s-replay/: the cost, acceptance and scheduling given s) is therefore the
    judged one; the free-running selector's run (sim/) is reported beside it: its s
    distribution and its errors."""
    selector_on = _selector_on(exec_run)
    if selector_on and s_replay_run is not None:
        return _JudgedRuns(s_replay_run, sim_run, s_replay_run, selector_on)
    return _JudgedRuns(sim_run, None, s_replay_run, selector_on)


def _cost_model_level(c: Comparison, executed: ExecutedSpec, fit) -> None:
    """Level 1: the fit's round times against the measured ones, and the calibration's state."""
    t = executed.rounds
    meta = fit.meta or {}
    c.info["calibration_stalls"] = float(meta.get("calibration_stalls", float("nan")))
    c.info["speed_shift"] = float(meta.get("speed_shift", float("nan")))
    c.cost_model = round_level(t, fit, executed.drafting)
    # the verifying engine's ticks (a pipelined run's drafting process ticks on the other core)
    c.cost_model["within_run"] = within_run_speed(
        executed.run.path,
        np.asarray(t["t_start_s"], dtype=np.float64),
        np.asarray(c.cost_model["predicted_s"]),
        np.asarray(c.cost_model["measured_s"]),
    )


def _selector_on(exec_run) -> bool:
    """Whether the executed run chose s adaptively (on by default for Minions)."""
    sp = exec_run.config["workload"].get("speculation") or {}
    selector_on = (sp.get("selector") or {}).get("enabled")
    return sp.get("method") == "minions" if selector_on is None else bool(selector_on)


def _acceptance_checks(c: Comparison, exec_run, sim_run) -> list[dict]:
    """Acceptance rate and tokens per step within ACCEPTANCE_TARGET; a miss is the acceptance
    model's, with what the simulation assumed about acceptance."""
    medusa = (exec_run.config["workload"].get("speculation") or {}).get("method") == "medusa"
    checks = []
    for name, label in (("acceptance_rate", "acceptance rate"), ("tokens_per_step", "tokens per step")):
        e = (c.totals.get(name) or {}).get("error")
        ok = e is not None and np.isfinite(e) and abs(e) <= ACCEPTANCE_TARGET
        why = _acceptance_why(sim_run, medusa)
        comp = (
            ""
            if ok
            else (
                f"acceptance model (simulated {label} {e:+.1%} off the measured: {why})"
                if e is not None
                else "acceptance model (missing)"
            )
        )
        checks.append(
            {
                "metric": label,
                "value": e,
                "target": ACCEPTANCE_TARGET,
                "ok": bool(ok),
                "component": comp,
                "kind": "" if ok else "acceptance model",
            }
        )
    return checks


def _blame_per_request_acceptance(c: Comparison, checks: list, exec_run, sim_run) -> None:
    """Coupled runs: the executor's requests differ in tokens per round (repetitive code runs
    long), the simulator's draw every round i.i.d.: requests finish at other times, slots free
    at other times, and the queue (TTFT) and tails follow. A much narrower simulated spread
    names the acceptance model in the latency and throughput misses."""
    tm, tp = spread(tokens_per_round_per_request(exec_run)), spread(tokens_per_round_per_request(sim_run))
    c.info["tokens_per_round_per_request"] = {"measured": tm, "simulated": tp}
    if not (tm and tp and tp["cv"] < 0.7 * tm["cv"]):
        return
    note = (
        f"acceptance model (per-request acceptance: tokens per round per request p10-p90 "
        f"{tm['p10']:.2f}-{tm['p90']:.2f} measured against {tp['p10']:.2f}-{tp['p90']:.2f} simulated, "
        f"coefficient of variation {tm['cv']:.2f} against {tp['cv']:.2f}: the simulator draws every round's "
        f"acceptance i.i.d., so requests finish and free their slots at other times"
    )
    latency = ("mean end-to-end latency", "TTFT p99", "TPOT p99", "end-to-end p99", "throughput (output tok/s)")
    for ch in checks:
        if not ch["ok"] and ch["metric"] in latency and ch["kind"] in ("scheduling mismatch", "cost model"):
            ch["component"] = note + f"; also {ch['component']})"
            ch["kind"] = "acceptance model"


def _blame_narrow_simulated_spread(c: Comparison, checks: list) -> None:
    """A p99 miss with the mean right and a narrower simulated spread: the acceptance varies
    from request to request in the executor (some code repeats, some does not) while the
    simulator draws every round's acceptance i.i.d. from the pooled histogram."""
    for ch in checks:
        col = {"TPOT p99": "tpot_s", "end-to-end p99": "e2e_s"}.get(ch["metric"])
        if ch["ok"] or col is None or ch["kind"] == "acceptance model":
            continue
        m = np.asarray(c.requests[col]["measured_values"], dtype=np.float64)
        p = np.asarray(c.requests[col]["predicted_values"], dtype=np.float64)
        cv_m, cv_p = np.nanstd(m) / np.nanmean(m), np.nanstd(p) / np.nanmean(p)
        mean_err = c.requests[col]["mean_error"]
        if mean_err is not None and abs(mean_err) <= 0.05 and cv_p < 0.9 * cv_m:
            ch["component"] = (
                f"acceptance model (per-request acceptance: the mean is {mean_err:+.1%} off but the "
                f"simulated spread is narrower, coefficient of variation {cv_p:.2f} against {cv_m:.2f} "
                f"measured: the simulator draws each round's acceptance i.i.d., the real one varies by "
                f"request; also {ch['component']})"
            )
            ch["kind"] = "acceptance model"


def _adaptive_s_level(c: Comparison, checks: list, executed: ExecutedSpec, runs: _JudgedRuns) -> None:
    """Mean s executed and simulated; with adaptive s, the free-running selector's simulation,
    the s-replay, and the misses that the s trajectory explains."""
    exec_run, t = executed.run, executed.rounds
    s_exec = float(np.mean(t["s"])) if len(t["s"]) else float("nan")
    s_sim = ((runs.sim_run.summary.get("speculation") or {}).get("s") or {}).get("mean_per_round")
    c.info["s_mean_executed"], c.info["s_mean_simulated"] = s_exec, s_sim
    if runs.free_run is not None:
        c.info["free_selector"] = _free_selector(exec_run, runs.free_run, t)
        checks.append(_selector_check(c.info["selector_on_executed_inputs"]))
    if runs.s_replay_run is not None:
        c.replay = _s_replay(exec_run, runs.s_replay_run)
    if c.replay.get("kind") == "s-replay":
        _blame_s_choice(checks, c.replay, s_exec, s_sim)
    if runs.free_run is None and runs.selector_on and _s_apart(s_exec, s_sim):
        _blame_s_trajectory(checks, c.replay, s_exec, s_sim)


def _s_apart(s_exec: float, s_sim) -> bool:
    """The mean s per round simulated more than 5% off the executed one."""
    return s_sim is not None and bool(np.isfinite(s_exec)) and abs(s_sim / s_exec - 1.0) > 0.05


def _errors_against(exec_run, other) -> tuple[dict, dict]:
    """A simulation's errors: (throughput, tokens per step and acceptance; per-request latencies)."""
    rq = request_level(exec_run, other)
    tot = totals_level(exec_run, other)
    totals = {
        "throughput_error": (tot.get("throughput_output_tokens_per_s") or {}).get("error"),
        "tokens_per_step_error": (tot.get("tokens_per_step") or {}).get("error"),
        "acceptance_rate_error": (tot.get("acceptance_rate") or {}).get("error"),
    }
    return totals, {col: {k: rq[col][k] for k in ("mean_error", "p99_error")} for col in ("ttft_s", "tpot_s", "e2e_s")}


def _free_selector(exec_run, free_run, t: dict) -> dict:
    """The free-running selector's simulation: its s distribution and its errors."""
    totals, latencies = _errors_against(exec_run, free_run)
    fs = (free_run.summary.get("speculation") or {}).get("s") or {}
    return {
        "s_mean_simulated": fs.get("mean_per_round"),
        "s_changes_simulated": fs.get("changes"),
        "s_final_simulated": fs.get("final"),
        "s_rounds_executed": s_share(t["s"]),
        "s_rounds_simulated": s_share_series((free_run.summary.get("speculation") or {}).get("series", {})),
        **totals,
        **latencies,
    }


def _selector_check(sel: dict) -> dict:
    """The simulator's selector fed the executor's observations must take the executed s."""
    ok = bool(sel.get("same"))
    return {
        "metric": "selector decisions on the executed inputs",
        "value": sel.get("agreement"),
        "target": 1.0,
        "ok": ok,
        "kind": "" if ok else "scheduling mismatch",
        "component": ""
        if ok
        else (
            f"scheduling mismatch (the simulator's selector fed the executor's "
            f"own observations took s {sel.get('trajectory')} against "
            f"{sel.get('executed')} executed)"
        ),
    }


def _s_replay(exec_run, s_replay_run) -> dict:
    """The simulation with the executed s trajectory: what is left without the selector's decisions."""
    totals, latencies = _errors_against(exec_run, s_replay_run)
    s_mean = ((s_replay_run.summary.get("speculation") or {}).get("s") or {}).get("mean_per_round")
    return {"kind": "s-replay", **totals, "s_mean_simulated": s_mean, **latencies}


def _blame_s_choice(checks: list, rp: dict, s_exec: float, s_sim) -> None:
    """Acceptance and tokens per step right with the executed s, off with the simulated
    selector's: the s choice."""
    for ch in checks:
        key = {"acceptance rate": "acceptance_rate_error", "tokens per step": "tokens_per_step_error"}.get(ch["metric"])
        e = rp.get(key) if key else None
        if not ch["ok"] and e is not None and abs(e) <= ACCEPTANCE_TARGET:
            ch["component"] = (
                f"scheduling mismatch (adaptive s: with the executed s trajectory the simulated "
                f"{ch['metric']} is {e:+.1%} off; mean s per round {s_exec:.2f} executed, "
                f"{s_sim:.2f} simulated)"
            )
            ch["kind"] = "scheduling mismatch"


def _blame_s_trajectory(checks: list, rp: dict, s_exec: float, s_sim: float) -> None:
    """Adaptive s: the selector reacts to the round times it sees (measured, noisy; or
    predicted), so the two runs can take different s trajectories, and tokens per step,
    acceptance and latency follow s: named before the acceptance model or the cost model."""
    with_s = (
        f"; with the executed s trajectory the simulation is {rp['throughput_error']:+.1%} off in throughput, "
        f"{rp['e2e_s']['mean_error']:+.1%} in mean end-to-end, {rp['tokens_per_step_error']:+.1%} in tokens "
        f"per step"
        if rp.get("kind") == "s-replay"
        else ""
    )
    note = (
        f"scheduling mismatch (adaptive s: the selector took another trajectory, mean s per round "
        f"{s_exec:.2f} executed against {s_sim:.2f} simulated; it decides on round times, measured and noisy "
        f"in the executor, predicted in the simulator{with_s})"
    )
    for ch in checks:
        if not ch["ok"] and ch["metric"] != "per-iteration latency MAPE":
            ch["component"] = note + ("; also " + ch["component"] if ch["kind"] == "timing noise" else "")
            ch["kind"] = "scheduling mismatch"


def _blame_pipeline(c: Comparison, checks: list, executed: ExecutedSpec, sim_run, fit) -> None:
    """Pipelined: the engines' busy times (and the hand-overs) decide whether a latency or
    throughput miss is the cost model's or the scheduling's."""
    t, drafting = executed.rounds, executed.drafting
    b = c.info["pipeline"] = pipeline_busy(t, drafting, sim_run.summary)
    if drafting is not None:
        hand = handoffs_s(t, drafting)
        b["handoff_measured_s"] = float(np.median(hand)) if hand.size else None
        b["handoff_fitted_s"] = (fit.meta or {}).get("pipeline_handoff_s")
    for ch in checks:
        if not ch["ok"] and ch["metric"] not in ("acceptance rate", "tokens per step", "per-iteration latency MAPE"):
            ch["component"] = pipeline_source(b, ch["component"], c.cost_model.get("total_bias"), ch["metric"])
            ch["kind"] = next((k for k in COMPONENTS if ch["component"].startswith(k)), "")
