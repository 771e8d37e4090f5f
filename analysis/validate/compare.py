"""Predicted (simulator) against measured (executor), on the same requests.

Four levels, so a miss can be traced to its source:
1. **cost model alone**: the cost model's time for each iteration the executor actually ran
   (its exact batch shape from iteration_batches.parquet) against the measured engine
   iteration time; swaps: the predicted copy time of the exact bytes each iteration swapped
   against the measured copy time; recomputes: the iterations that prefilled an evicted
   sequence again. No scheduling is involved: this is the cost model's own error.
2. **simulation, per iteration**: the simulated run's iterations (step mode: one series row
   each) aligned with the executor's by index, kept where both ran the same batch (sequences,
   tokens and prefill tokens equal); the fraction aligned says how far the schedules agree.
3. **scheduling alone** (replay.py): the simulation driven by the executor's own measured
   times; what differs then is the simulator's scheduling, not its cost model.
4. **simulation, end to end**: per-request latencies aligned by request id (TTFT, TPOT,
   end-to-end: MAPE, bias, p50/p99 errors), throughput, preemptions by mode, bytes swapped,
   and, for speculative cases, acceptance and tokens per step.

`check_targets` turns these into pass/miss lines against the targets, naming for each miss the
component it comes from: timing noise (the machine was busy: iterations stalled), the
acceptance model (the simulated acceptance differs), a scheduling mismatch (even the replay is
off), or the cost model (the replay is close, so the predicted times are what differs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from infersim.simulator.metrics.summary import derived_columns

from .execute import local_speed
from .measured import jitter, priced_swaps, stalls, swap_events
from .metrics import mape, median_ape, percentile, rel_error, signed_bias, total_bias

TARGETS = {
    "iteration_mape": 0.10,  # per-iteration latency MAPE
    "throughput": 0.10,  # output tokens per second
    "e2e_mean": 0.10,  # mean end-to-end latency
    "p99": 0.20,  # TTFT, TPOT and end-to-end p99
    "swap_cost": 0.05,  # predicted vs measured KV copy time (total over the run)
    "recompute_cost": 0.05,  # predicted vs measured time of the iterations that recompute
}
LATENCIES = ("ttft_s", "tpot_s", "e2e_s")
COMPONENTS = ("timing noise", "acceptance model", "cost model", "scheduling mismatch")
# more executed iterations than this fraction taking >= 2x their usual time: the machine was busy
STALL_LIMIT = 0.02
# the machine's speed moving by more than this between the calibrations around the run: busy too
SHIFT_LIMIT = 0.05


@dataclass
class Comparison:
    case: str
    cost_model: dict = field(default_factory=dict)  # level 1
    iterations: dict = field(default_factory=dict)  # level 2
    requests: dict = field(default_factory=dict)  # level 3: per-request latencies
    totals: dict = field(default_factory=dict)  # level 3: throughput, preemptions, bytes, acceptance
    replay: dict = field(default_factory=dict)  # the simulation with the executor's measured times
    checks: list = field(default_factory=list)  # [{metric, value, target, ok, component}]
    info: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(c["ok"] for c in self.checks)

    def to_json(self) -> dict:
        return {
            "case": self.case,
            "passed": self.passed,
            "cost_model": self.cost_model,
            "iterations": self.iterations,
            "requests": self.requests,
            "totals": self.totals,
            "replay": self.replay,
            "checks": self.checks,
            "info": self.info,
        }


# ---- level 1: the cost model on the executor's own batches ------------------------------------
def recompute_iterations(batches: dict[str, np.ndarray], prompt_tokens: np.ndarray) -> np.ndarray:
    """Iterations that prefill a sequence again after a recompute preemption: a sequence
    shows up with no cached context after it had been computed before (its first prefill
    may itself be chunked, so only a return to context 0 after progress counts)."""
    it = np.asarray(batches["iteration"], dtype=np.int64)
    rid = np.asarray(batches["rid"], dtype=np.int64)
    ctx = np.asarray(batches["context_tokens"], dtype=np.int64)
    q = np.asarray(batches["query_tokens"], dtype=np.int64)
    seen: dict[int, int] = {}
    hits = set()
    for i in np.argsort(it, kind="stable"):
        r = int(rid[i])
        if ctx[i] == 0 and seen.get(r, 0) > 0:
            hits.add(int(it[i]))
        seen[r] = int(ctx[i] + q[i])
    return np.array(sorted(hits), dtype=np.int64)


def cost_model_level(run, cost_model) -> dict:
    shapes = run.shapes
    pred = np.array([cost_model.iteration_time_s(s) for s in shapes])
    noise = timing_noise(run)
    stalled = noise.pop("_mask")
    meas = run.iteration_period_s
    decode = np.array([bool(np.all(s.query_tokens == 1)) for s in shapes])
    ok = np.isfinite(meas)
    out = {
        "iterations": int(len(shapes)),
        "compared": int(ok.sum()),
        "mape": mape(pred, meas),
        "bias": signed_bias(pred, meas),
        "median_ape": median_ape(pred, meas),
        "total_bias": total_bias(pred, meas),
        "decode_mape": mape(pred[decode], meas[decode]),
        "mixed_mape": mape(pred[~decode], meas[~decode]),
        "decode_bias": total_bias(pred[decode], meas[decode]),
        "mixed_bias": total_bias(pred[~decode], meas[~decode]),
        "noise": noise,
        "mape_unstalled": mape(pred[~stalled], meas[~stalled]),
        "predicted_s": pred.tolist(),
        "measured_s": meas.tolist(),
        "batch_size": [int(s.num_seqs) for s in shapes],
    }
    it = run.iterations
    out["within_run"] = within_run_speed(run.path, np.asarray(it["t_start_s"], dtype=np.float64), pred, meas)
    ev = swap_events(run)
    if ev["swap_s"].size:
        swap_meas = ev["swap_s"]
        swap_pred = priced_swaps(cost_model, ev)
        ratio = swap_meas / np.maximum(swap_pred, 1e-12)
        out["swap"] = {
            "events": int(swap_meas.size),
            "measured_s": float(swap_meas.sum()),
            "predicted_s": float(swap_pred.sum()),
            "error": rel_error(swap_pred.sum(), swap_meas.sum()),
            "mape": mape(swap_pred, swap_meas),
            "copies_recorded": bool((ev["out_copies"] + ev["in_copies"]).sum() > 0),
            # measured / predicted per copy: a narrow band away from 1 is the copy speed of
            # this run differing from calibration's, a wide one is noise
            "ratio_p10_p50_p90": [float(x) for x in np.percentile(ratio, [10, 50, 90])],
        }
    rec = recompute_iterations(run.batches, run.requests["prompt_tokens"])
    if rec.size:
        idx = np.searchsorted(np.asarray(it["iteration"], dtype=np.int64), rec)
        m = meas[idx]
        keep = np.isfinite(m)
        out["recompute"] = {
            "iterations": int(rec.size),
            "measured_s": float(m[keep].sum()),
            "predicted_s": float(pred[idx][keep].sum()),
            "error": rel_error(pred[idx][keep].sum(), m[keep].sum()),
            "mape": mape(pred[idx], m),
        }
    return out


def within_run_speed(run_dir, start_s: np.ndarray, pred: np.ndarray, meas: np.ndarray) -> dict:
    """How far the machine's speed moving inside the run explains the per-iteration errors: the
    run's speed ticks around each iteration (execute.local_speed) against measured/predicted,
    their correlation in log space, and the MAPE of the predictions at that local speed. On a
    2-core CPU whose speed moves ±30% over about a second inside a run, with no iteration stalling,
    the ticks track it (a plain-load run: per-iteration MAPE 20.0%, 11.4% at the ticks' local
    speed, correlation 0.85; CHANGELOG.md, validation); in a steady run they are noise
    (correlation 0.1). Empty without ticks."""
    f = local_speed(run_dir, start_s)
    ok = np.isfinite(meas) & np.isfinite(pred) & (pred > 0) & (meas > 0)
    if f is None or ok.sum() < 10:
        return {}
    r = np.log(meas[ok] / pred[ok])
    lf = np.log(f[ok])
    corr = float(np.corrcoef(r, lf)[0, 1]) if np.std(r) > 0 and np.std(lf) > 0 else float("nan")
    return {
        "correlation": corr,
        "mape_at_local_speed": mape(pred * f, meas),
        "tick_range": [float(np.percentile(f, 10)), float(np.percentile(f, 90))],
    }


# the ticks explain the per-iteration errors when they correlate at least this well and pricing
# at the local speed takes at least a tenth off the MAPE
WITHIN_RUN_CORRELATION = 0.5
WITHIN_RUN_MAPE_RATIO = 0.9


def timing_noise(run) -> dict:
    """How noisy the measurements are, whatever the model (measured.stalls): the fraction of
    iterations that stalled, and the iteration-to-iteration jitter of like decode steps."""
    st, judged = stalls(run.iteration_period_s, run.shapes)
    return {
        "stalls": float(st[judged].mean()) if judged.any() else float("nan"),
        "jitter": jitter(run.iteration_period_s, run.shapes, st),
        "_mask": st,
    }


# ---- level 2: simulated iterations aligned with executed ones -------------------------------------
def iteration_level(exec_run, sim_run) -> dict:
    es, ss = exec_run.series, sim_run.series
    n = min(len(es["t_start_s"]), len(ss["t_start_s"]))
    same = np.ones(n, dtype=bool)
    for c in ("batch_size", "batch_tokens", "prefill_tokens"):
        same &= np.asarray(es[c][:n]) == np.asarray(ss[c][:n])
    sim_dur = (np.asarray(ss["t_end_s"]) - np.asarray(ss["t_start_s"]))[:n]
    meas = exec_run.iteration_period_s[:n]
    return {
        "executed": int(len(es["t_start_s"])),
        "simulated": int(len(ss["t_start_s"])),
        "aligned": int(same.sum()),
        "aligned_fraction": float(same.sum() / max(1, n)),
        "first_divergence": int(np.argmin(same)) if not same.all() else int(n),
        "mape_aligned": mape(sim_dur[same], meas[same]),
        "bias_aligned": signed_bias(sim_dur[same], meas[same]),
    }


# ---- level 3: requests and totals --------------------------------------------------------------------
def _aligned(exec_run, sim_run, col: str) -> tuple[np.ndarray, np.ndarray]:
    """(simulated, measured) values of a per-request column by request id; NaN where
    either run aborted the request."""
    e, s = exec_run.requests, sim_run.requests
    n = min(len(e[col]), len(s[col]))
    ok = (np.asarray(e["aborted"][:n]) == 0) & (np.asarray(s["aborted"][:n]) == 0)
    return np.where(ok, np.asarray(s[col][:n], dtype=np.float64), np.nan), np.where(
        ok, np.asarray(e[col][:n], dtype=np.float64), np.nan
    )


def request_level(exec_run, sim_run) -> dict:
    e = dict(exec_run.requests)
    s = dict(sim_run.requests)
    for table in (e, s):
        if "ttft_s" not in table:
            table.update(derived_columns(table))
    mismatch = [
        c
        for c in ("prompt_tokens", "output_tokens", "arrival_s")
        if not np.allclose(np.asarray(e[c])[: len(s[c])], np.asarray(s[c])[: len(e[c])])
    ]
    out = {"requests": int(len(e["arrival_s"])), "input_mismatch": mismatch}
    if "cached_tokens" in e and "cached_tokens" in s:  # prefix caching: requests whose hits differ
        n = min(len(e["cached_tokens"]), len(s["cached_tokens"]))
        out["cached_tokens_mismatch"] = np.flatnonzero(
            np.asarray(e["cached_tokens"][:n]) != np.asarray(s["cached_tokens"][:n])
        ).tolist()

    class _R:  # the derived tables in the shape _aligned expects
        def __init__(self, r):
            self.requests = r

    for col in LATENCIES:
        p, m = _aligned(_R(e), _R(s), col)  # p: simulated, m: measured
        out[col] = {
            "mape": mape(p, m),
            "bias": signed_bias(p, m),
            "measured": {"mean": float(np.nanmean(m)), "p50": percentile(m, 50), "p99": percentile(m, 99)},
            "predicted": {"mean": float(np.nanmean(p)), "p50": percentile(p, 50), "p99": percentile(p, 99)},
        }
        for k in ("mean", "p50", "p99"):
            out[col][f"{k}_error"] = rel_error(out[col]["predicted"][k], out[col]["measured"][k])
        out[col]["measured_values"] = m.tolist()
        out[col]["predicted_values"] = p.tolist()
    return out


def totals_level(exec_run, sim_run) -> dict:
    es, ss = exec_run.summary, sim_run.summary
    keys = {
        "throughput_output_tokens_per_s": ("throughput_output_tokens_per_s",),
        "throughput_req_per_s": ("throughput_req_per_s",),
        "makespan_s": ("makespan_s",),
        "iterations": ("iterations",),
        "preempt_recompute": ("preemptions", "recompute"),
        "preempt_swap": ("preemptions", "swap"),
        "swap_out_bytes": ("swap_out_bytes",),
        "swap_in_bytes": ("swap_in_bytes",),
        "batch_size_mean": ("batch_size", "mean_busy"),
        "kv_utilization_mean": ("kv_utilization", "mean_busy"),
        "acceptance_rate": ("speculation", "acceptance_rate"),
        "tokens_per_step": ("speculation", "acceleration_rate"),
        "prefix_hit_rate_tokens": ("prefix_cache", "hit_rate_tokens"),
        "prefix_hit_rate_blocks": ("prefix_cache", "hit_rate_blocks"),
        "prefix_evictions": ("prefix_cache", "evictions"),
    }
    out = {}
    for name, path in keys.items():
        m, p = _get(es, path), _get(ss, path)
        if m is None and p is None:
            continue
        out[name] = {"measured": m, "predicted": p, "error": rel_error(p, m)}
    return out


def aggregate_errors(exec_run, sim_run, cost_model=None) -> dict[str, float]:
    """One executed run's errors on the aggregate targets against a simulation of the same
    requests, by check_targets' metric names: what the pass rule takes the median of over the
    repeats (rule.py). With `cost_model`, also the swap and recompute costs on the run's own
    batches."""
    rq, tot = request_level(exec_run, sim_run), totals_level(exec_run, sim_run)
    out = {
        "throughput (output tok/s)": (tot.get("throughput_output_tokens_per_s") or {}).get("error"),
        "mean end-to-end latency": rq["e2e_s"]["mean_error"],
        "TTFT p99": rq["ttft_s"]["p99_error"],
        "TPOT p99": rq["tpot_s"]["p99_error"],
        "end-to-end p99": rq["e2e_s"]["p99_error"],
        "acceptance rate": (tot.get("acceptance_rate") or {}).get("error"),
        "tokens per step": (tot.get("tokens_per_step") or {}).get("error"),
    }
    if cost_model is not None:
        cm = cost_model_level(exec_run, cost_model)
        out["swap cost (total copy time)"] = (cm.get("swap") or {}).get("error")
        out["recompute cost (re-prefill time)"] = (cm.get("recompute") or {}).get("error")
    return {k: float(v) for k, v in out.items() if v is not None}


def _get(d: dict, path: tuple[str, ...]):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


# ---- targets and attribution ---------------------------------------------------------------------
@dataclass(frozen=True)
class _Attribution:
    """What a miss is blamed on: the machine's noise around the run first (when it is large
    enough to explain the miss, `explains`), then the acceptance model, the scheduling and the
    cost model."""

    cm: dict  # the cost model level (Comparison.cost_model)
    replay: dict  # the simulation with the executor's measured times (Comparison.replay)
    cm_bias: float  # the cost model's total bias on the executed batches
    acceptance_error: float | None  # simulated against measured acceptance rate
    aligned: float  # fraction of simulated iterations that ran the executor's batch
    split: str  # the bias per executor code path, '' when not measured
    stalls: float  # fraction of executed iterations that stalled
    jitter: float  # timing jitter of the executed iterations
    calibration_stalls: float  # fraction of calibration iterations that stalled
    shift: float  # the machine's speed change between the calibrations before and after the run

    @classmethod
    def of(cls, c: Comparison) -> "_Attribution":
        cm = c.cost_model
        noise = cm.get("noise", {})
        return cls(
            cm=cm,
            replay=c.replay,
            cm_bias=cm.get("total_bias", float("nan")),
            acceptance_error=(c.totals.get("acceptance_rate") or {}).get("error"),
            aligned=c.iterations.get("aligned_fraction", float("nan")),
            # both code paths off alike with little jitter and no stalls means every iteration ran
            # at another speed than at calibration (the machine's speed moved)
            split=(
                f": decode-only {pct_signed(cm.get('decode_bias'))}, with prefills {pct_signed(cm.get('mixed_bias'))}"
                if "decode_bias" in cm
                else ""
            ),
            stalls=noise.get("stalls", float("nan")),
            jitter=noise.get("jitter", float("nan")),
            calibration_stalls=c.info.get("calibration_stalls", float("nan")),
            shift=c.info.get("speed_shift", float("nan")),
        )

    @property
    def moved(self) -> bool:
        return bool(np.isfinite(self.shift) and abs(self.shift) > SHIFT_LIMIT)

    @property
    def busy(self) -> bool:
        """The machine was busy around the run: its speed moved between the calibrations, or iterations stalled."""
        return self.moved or any(np.isfinite(x) and x > STALL_LIMIT for x in (self.stalls, self.calibration_stalls))

    def explains(self, err: float | None) -> bool:
        """The busy machine explains an error `err` (a fraction): its speed moved between the
        calibrations and its iterations stalled (each stall at least doubles an iteration) by
        at least half the error, the share a replay must reach to be blamed. A +58% cost-model
        bias is not explained by a machine whose speed moved 8%."""
        if not self.busy:
            return False
        if err is None or not np.isfinite(err):
            return True
        stalls = max((x for x in (self.stalls, self.calibration_stalls) if np.isfinite(x)), default=0.0)
        return (abs(self.shift) if np.isfinite(self.shift) else 0.0) + stalls >= 0.5 * abs(err)

    def _busy_note(self) -> str:
        """Past a miss blamed elsewhere: how busy the machine was, too little to explain it."""
        if not self.busy:
            return ""
        moved = f"speed moved {self.shift:+.1%}, " if np.isfinite(self.shift) else ""
        return f"; the machine was busy ({moved}{pct(self.stalls)} of iterations stalled), too little to explain it"

    def end_to_end(self, err: float | None, replay_err: float | None = None) -> str:
        """The component an end-to-end error comes from."""
        if self.explains(err):
            return self._end_to_end_noise()
        if self.acceptance_error is not None and abs(self.acceptance_error) > 0.05:
            return f"acceptance model (simulated acceptance {self.acceptance_error:+.1%} off)"
        if replay_err is not None and err is not None and abs(replay_err) >= 0.5 * abs(err):
            return (
                f"scheduling mismatch (with the executor's own measured times the simulation is still "
                f"{replay_err:+.1%} off; {self.replay.get('aligned_fraction', float('nan')):.0%} of its iterations ran "
                f"the executor's batch)"
            )
        return self._end_to_end_model(err, replay_err) + self._busy_note()

    def _end_to_end_noise(self) -> str:
        """An end-to-end miss on a busy machine: its speed moved, or iterations stalled."""
        if self.moved:
            return (
                f"timing noise (the machine's speed moved {self.shift:+.1%} between the calibration runs before and "
                f"after the validated run; cost-model total bias {self.cm_bias:+.1%})"
            )
        return (
            f"timing noise (a busy machine: {pct(self.stalls)} of executed and {pct(self.calibration_stalls)} of "
            f"calibration iterations stalled; cost-model total bias {self.cm_bias:+.1%})"
        )

    def _end_to_end_model(self, err: float | None, replay_err: float | None) -> str:
        """Past noise, acceptance and a replay that is off too: the cost model or the schedule."""
        bias = self.cm_bias
        if err is not None and np.isfinite(bias) and abs(bias) >= 0.5 * abs(err) and np.sign(bias) == np.sign(err):
            return f"cost model (total bias {bias:+.1%} on the executed batches{self.split})"
        if replay_err is not None:
            return (
                f"cost model (per-iteration errors that do not cancel; with the measured times the simulation "
                f"is {replay_err:+.1%} off, total bias {bias:+.1%})"
            )
        return f"scheduling mismatch ({self.aligned:.0%} of iterations ran the same batch; cost-model total bias {bias:+.1%})"

    def noise(self) -> str:
        """A swap or recompute cost missed on a busy machine: how busy it was."""
        if self.moved:
            return f"timing noise (the machine's speed moved {self.shift:+.1%} between the calibrations around the run)"
        return f"timing noise ({pct(self.stalls)} of executed and {pct(self.calibration_stalls)} of calibration iterations stalled)"

    def iteration(self) -> str:
        """The component a per-iteration latency miss comes from."""
        cm = self.cm
        if not self.explains(cm.get("mape")):
            source = within_run_source(cm) or (
                f"cost model (bias {cm.get('bias', float('nan')):+.1%}, timing jitter {pct(self.jitter)})"
            )
            return source + self._busy_note()
        if self.moved:
            return (
                f"timing noise: the machine's speed moved {self.shift:+.1%} between the calibration runs before and "
                f"after the validated run (cost-model bias {cm.get('bias', float('nan')):+.1%})"
            )
        return (
            f"timing noise: {pct(self.stalls)} of iterations stalled (took >= 2x their like neighbours: the "
            f"process lost its core), {pct(self.calibration_stalls)} while calibrating, jitter {pct(self.jitter)}; "
            f"cost model on the unstalled iterations {pct(cm.get('mape_unstalled'))}"
        )


class _Checks(list):
    """The pass/miss lines; a miss's component is worked out only when it misses."""

    def add(self, metric: str, value, target: float, source) -> None:
        ok = value is not None and np.isfinite(value) and abs(value) <= target
        comp = "" if ok else (source() if callable(source) else source)
        self.append(
            {
                "metric": metric,
                "value": value,
                "target": target,
                "ok": bool(ok),
                "component": comp,
                "kind": next((k for k in COMPONENTS if comp.startswith(k)), ""),
            }
        )


def _neg(x):
    return -x if x is not None else None


def check_targets(c: Comparison, compare: tuple[str, ...], targets: dict | None = None) -> list[dict]:
    t = {**TARGETS, **(targets or {})}
    why = _Attribution.of(c)
    checks = _Checks()
    checks.add("per-iteration latency MAPE", c.cost_model.get("mape"), t["iteration_mape"], why.iteration)
    _end_to_end_checks(c, t, why, checks)
    if "swap" in compare and "swap" in c.cost_model:
        _swap_cost_check(c.cost_model["swap"], t, why, checks)
    if "prefix" in compare:
        _prefix_checks(c, checks.add)
    if "recompute" in compare and "recompute" in c.cost_model:
        checks.add(
            "recompute cost (re-prefill time)",
            c.cost_model["recompute"]["error"],
            t["recompute_cost"],
            lambda: why.noise()
            if why.explains(c.cost_model["recompute"]["error"])
            else "cost model (prefill iterations)",
        )
    return list(checks)


def _end_to_end_checks(c: Comparison, t: dict, why: _Attribution, checks: _Checks) -> None:
    """Throughput, mean end-to-end latency and the p99s, each blamed with the replay's error beside it."""
    rq, rp = c.requests, c.replay
    thr = (c.totals.get("throughput_output_tokens_per_s") or {}).get("error")
    # a throughput above the measured is a latency below it: the sign follows the latencies'
    checks.add(
        "throughput (output tok/s)",
        thr,
        t["throughput"],
        lambda: why.end_to_end(_neg(thr), _neg(rp.get("throughput_error"))),
    )
    e2e = rq.get("e2e_s", {}).get("mean_error")
    checks.add(
        "mean end-to-end latency",
        e2e,
        t["e2e_mean"],
        lambda: why.end_to_end(e2e, rp.get("e2e_s", {}).get("mean_error")),
    )
    for col, label in (("ttft_s", "TTFT p99"), ("tpot_s", "TPOT p99"), ("e2e_s", "end-to-end p99")):
        v = rq.get(col, {}).get("p99_error")
        checks.add(label, v, t["p99"], lambda v=v, col=col: why.end_to_end(v, rp.get(col, {}).get("p99_error")))


def _swap_cost_check(swap: dict, t: dict, why: _Attribution, checks: _Checks) -> None:
    r = swap["ratio_p10_p50_p90"]
    band = f"measured/predicted per copy p10 {r[0]:.2f}, median {r[1]:.2f}, p90 {r[2]:.2f} over {swap['events']} copies"
    checks.add(
        "swap cost (total copy time)",
        swap["error"],
        t["swap_cost"],
        lambda: (why.noise() + f"; {band}") if why.explains(swap["error"]) else f"cost model (host-copy fit; {band})",
    )


def _prefix_checks(c: Comparison, add) -> None:
    """Prefix-cache hit rates by tokens and by blocks: the simulated minus the executed, which
    must be exactly 0 (both engines key the same tokens and share blocks by one accounting;
    a difference is a request that found a different prefix cached: the schedules differ)."""
    tot, mism = c.totals, c.requests.get("cached_tokens_mismatch", [])
    for name, metric in (
        ("prefix_hit_rate_tokens", "prefix-cache hit rate (tokens)"),
        ("prefix_hit_rate_blocks", "prefix-cache hit rate (blocks)"),
    ):
        row = tot.get(name) or {}
        m, p = row.get("measured"), row.get("predicted")
        diff = None if m is None or p is None else float(p) - float(m)
        add(
            metric,
            diff,
            0.0,
            f"scheduling mismatch ({len(mism)} requests found another number of prompt tokens cached, first "
            f"request ids {mism[:5]}: a turn met its previous turn's blocks in one engine and not the other)",
        )


def replay_level(exec_run, replay_run) -> dict:
    """The simulation with the executor's measured times against the executor: what is left
    is the scheduling's."""
    out = iteration_level(exec_run, replay_run)
    rq = request_level(exec_run, replay_run)
    for col in LATENCIES:
        out[col] = {k: rq[col][k] for k in ("mean_error", "p50_error", "p99_error", "mape")}
    tot = totals_level(exec_run, replay_run)
    out["throughput_error"] = (tot.get("throughput_output_tokens_per_s") or {}).get("error")
    out["preemptions"] = {k: tot[k]["predicted"] for k in ("preempt_recompute", "preempt_swap") if k in tot}
    return out


def compare_runs(
    case: str,
    exec_run,
    sim_run,
    cost_model,
    compare: tuple[str, ...] = ("latency",),
    targets: dict | None = None,
    replay_run=None,
) -> Comparison:
    c = Comparison(case)
    if replay_run is not None:
        c.replay = replay_level(exec_run, replay_run)
    meta = getattr(cost_model, "meta", {}) or {}
    c.info["calibration_stalls"] = float(meta.get("iteration_fit", {}).get("stalls", float("nan")))
    c.info["speed_shift"] = float(meta.get("speed_shift", float("nan")))
    c.cost_model = cost_model_level(exec_run, cost_model)
    c.iterations = iteration_level(exec_run, sim_run)
    c.requests = request_level(exec_run, sim_run)
    c.totals = totals_level(exec_run, sim_run)
    c.checks = check_targets(c, compare, targets)
    return c


def within_run_source(cm: dict) -> str:
    """A per-iteration miss whose errors follow the machine's speed inside the run (its speed
    ticks, `within_run_speed`) is timing noise; '' when they do not."""
    w = cm.get("within_run") or {}
    corr, local = w.get("correlation", float("nan")), w.get("mape_at_local_speed", float("nan"))
    if not (
        np.isfinite(corr)
        and corr >= WITHIN_RUN_CORRELATION
        and np.isfinite(local)
        and local <= WITHIN_RUN_MAPE_RATIO * cm.get("mape", 0)
    ):
        return ""
    lo, hi = w["tick_range"]
    return (
        f"timing noise: the machine's speed moved inside the run (its speed ticks ran {lo:.2f}-{hi:.2f}x their "
        f"median, p10-p90, and follow the per-iteration errors: correlation {corr:.2f}); at that local speed the "
        f"MAPE is {pct(local)} (cost-model bias {cm.get('bias', float('nan')):+.1%})"
    )


def pct(x) -> str:
    return f"{x:.1%}" if x is not None and np.isfinite(x) else "n/a"


def pct_signed(x) -> str:
    return f"{x:+.1%}" if x is not None and np.isfinite(x) else "n/a"


def brief(d: dict) -> dict:
    """The comparison without per-iteration and per-request arrays (those are in the run dirs)."""
    d = json.loads(json.dumps(d, default=float))
    for k in ("predicted_s", "measured_s", "batch_size"):
        d["cost_model"].pop(k, None)
    for col in ("ttft_s", "tpot_s", "e2e_s"):
        for k in ("measured_values", "predicted_values"):
            d["requests"].get(col, {}).pop(k, None)
    return d
