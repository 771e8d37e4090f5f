"""A cost model fitted to the executor on this machine, from held-out executor runs.

The reference device profile's predictors are fitted to generic transformer kernels; a small
model on a CPU spends most of an iteration in per-call and per-sequence overheads that a
roofline does not see, so the validation can instead calibrate on a *separate* executor run
of the same model on different requests (its own seed and shapes: never the run being
validated) and fit:

- the engine iteration time (the forward pass plus the engine's own per-iteration work:
  scheduling, bookkeeping; what separates one iteration's start from the next's) as a
  non-negative combination of the features in `executor_features.py`, each code path on its own
  iterations (PATH_FITS: decode-only steps in relative error, batches with a prefill in absolute
  error);
- each host copy direction as latency + bytes / bandwidth, from the swaps of a run under
  memory pressure.

The fit is stored as JSON (`FittedCostModel.to_json`) with what it was fitted on, so a report
can say what was calibrated on what."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from infersim.simulator.costmodel.executor_features import PATH_COLUMNS, decode_rows, feature_matrix
from infersim.simulator.costmodel.fitted import FittedCostModel
from infersim.simulator.errors import InfersimError
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import WorkloadSpec

from .execute import LOO_MIN_RUNS, CaseOptions, run_executor, speed_from_ticks, speed_tick_s
from .measured import ExecRun, load_exec_run, priced_swaps, stalls, swap_events
from .sentinel import sentinel_s

# Calibration workloads: other seeds and wider shapes than any validation case, so the fit
# interpolates rather than memorises; two swap runs, because the copy time of the same swap
# varies by about 10% from one run to the next on a CPU. {seed} and {model} are filled in.
CALIBRATION_WORKLOADS = (
    {
        "name": "calib-load",
        "serving": {"max_batch_size": 32, "gpu_blocks": 2048, "cpu_blocks": 0},
        "requests": {
            "count": 120,
            "arrival": {"type": "poisson", "rate": 400.0},
            "prompt_tokens": {"type": "uniform", "low": 4, "high": 480},
            "output_tokens": {"type": "uniform", "low": 4, "high": 160},
        },
    },
    {
        "name": "calib-pressure",
        "serving": {"max_batch_size": 24, "gpu_blocks": 96, "cpu_blocks": 256, "preemption": "swap"},
        "requests": {
            "count": 60,
            "arrival": {"type": "burst"},
            "prompt_tokens": {"type": "uniform", "low": 16, "high": 256},
            "output_tokens": {"type": "uniform", "low": 16, "high": 160},
        },
    },
    {
        "name": "calib-swap-small",
        "serving": {"max_batch_size": 12, "gpu_blocks": 64, "cpu_blocks": 256, "preemption": "swap"},
        "requests": {
            "count": 40,
            "arrival": {"type": "poisson", "rate": 400.0},
            "prompt_tokens": {"type": "uniform", "low": 8, "high": 200},
            "output_tokens": {"type": "uniform", "low": 16, "high": 160},
        },
    },
    {
        "name": "calib-recompute",
        "serving": {"max_batch_size": 24, "gpu_blocks": 96, "cpu_blocks": 0, "preemption": "recompute"},
        "requests": {
            "count": 40,
            "arrival": {"type": "burst"},
            "prompt_tokens": {"type": "uniform", "low": 16, "high": 256},
            "output_tokens": {"type": "uniform", "low": 16, "high": 160},
        },
    },
)
# Matched calibration: the validated deployment's own serving section (pools, limits,
# preemption) on other requests, so what the pool size does to the caches is calibrated too.
MATCHED_REQUESTS = (
    (
        "calib-matched-load",
        {
            "count": 100,
            "arrival": {"type": "poisson", "rate": 400.0},
            "prompt_tokens": {"type": "uniform", "low": 4, "high": 400},
            "output_tokens": {"type": "uniform", "low": 4, "high": 160},
        },
    ),
    (
        "calib-matched-burst",
        {
            "count": 48,
            "arrival": {"type": "burst"},
            "prompt_tokens": {"type": "uniform", "low": 8, "high": 240},
            "output_tokens": {"type": "uniform", "low": 8, "high": 160},
        },
    ),
)
CALIBRATION_SEED = 9001  # validation cases use small seeds; these (9001..) are the calibration's alone
STALL_RATIO = 1.8  # a measurement this many times the fit's prediction is a stall, left out of the next round


def require_held_out_seed(seed: int) -> None:
    """Refuse a validated workload whose seed a calibration run uses (9001-9016): the fit must
    never see the run it is judged on."""
    if seed in range(CALIBRATION_SEED, CALIBRATION_SEED + 16):
        raise InfersimError(f"workload seed {seed} is one the calibration uses: pick another so the fit stays held out")


# ---- fitting ---------------------------------------------------------------------------------
def nnls_rounds(
    X: np.ndarray, y: np.ndarray, *, relative: bool = True, rounds: int = 3, trim: float = 0.02
) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative least squares of X c ~ y, in relative error (rows scaled by 1/y) or in
    absolute error, refitted a few times without the stalls (points at STALL_RATIO x the fit or
    more) and the worst `trim` fraction of points by relative error (timing spikes from other
    processes). Columns that are all zero keep a zero coefficient. Returns (coefficients, kept)."""
    keep = np.isfinite(y) & (y > 0)
    coef = np.zeros(X.shape[1])
    if not keep.any():
        return coef, keep
    scale = np.maximum(X[keep].max(axis=0), 1e-30)  # conditioning: columns to unit range
    for _ in range(rounds):
        A = X[keep] / scale
        b = y[keep]
        if relative:
            A, b = A / b[:, None], np.ones(b.size)
        coef_s, _ = nnls(A, b, maxiter=50 * X.shape[1])
        coef = coef_s / scale
        pred = X @ coef
        rel = np.abs(pred - y) / y
        if trim > 0:
            keep = keep & (rel <= np.quantile(rel[keep], 1.0 - trim))
        # stalls (the process lost its core for a time slice) are not the model's to fit
        keep = keep & (y < STALL_RATIO * np.maximum(pred, 1e-12))
    return coef, keep


def nnls_relative(X: np.ndarray, y: np.ndarray, rounds: int = 3, trim: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """nnls_rounds in relative error."""
    return nnls_rounds(X, y, relative=True, rounds=rounds, trim=trim)


def iteration_targets(run: ExecRun) -> np.ndarray:
    """Measured engine iteration times: from one iteration's start to the next's, less the
    next iteration's swap copies (the simulator times those separately) — NaN where the engine
    sat idle waiting for an arrival in between, and for the last iteration."""
    return run.iteration_period_s


# How each code path is fitted. Decode-only steps are many and alike (like steps 2% apart):
# relative error and a 2% trim give every step its weight and shed timing spikes. Batches with
# a prefill are few (3-15% of a run's iterations) and heavy-tailed on a GPU: on an H200 7-14% of
# them took 1.35x or more the decode steps around them, mostly the large ones (400+ prompt
# tokens, 3+ prompts), so a fit in relative error priced them by their fast majority, the trim
# and the stall cut left out 12-21% of them, and their measured total came to 1.10-1.22x the
# fit's (decode steps' median 0.96-1.01; docs/validation.md "What is fitted").
# The simulation sums iteration times (end-to-end latency, recompute cost), so that path is
# fitted to its total: absolute error, no trim; only points at STALL_RATIO x the fit go.
PATH_FITS = {"decode": {"relative": True, "trim": 0.02}, "mixed": {"relative": False, "trim": 0.0}}


def fit_iteration_model(runs: list[ExecRun]) -> tuple[np.ndarray, dict]:
    X = np.vstack([feature_matrix(r.shapes, r.block_size) for r in runs])
    y = np.concatenate([iteration_targets(r) for r in runs])
    coef = np.zeros(X.shape[1])
    kept = np.zeros(y.size, dtype=bool)
    ok = np.isfinite(y)
    paths = {}
    for path, rows in (("decode", decode_rows(X)), ("mixed", ~decode_rows(X))):
        cols = PATH_COLUMNS[path]
        coef[cols], kept[rows] = nnls_rounds(X[rows][:, cols], y[rows], **PATH_FITS[path])
        m = rows & ok
        if m.any():
            paths[path] = {
                "points": int(m.sum()),
                "kept": int((kept & m).sum()),
                # measured over fitted time: the total and the median iteration
                "total_ratio_in_sample": float(y[m].sum() / (X[m] @ coef).sum()),
                "median_ratio_in_sample": float(np.median(y[m] / (X[m] @ coef))),
            }
    stalled = np.concatenate([stalls(r.iteration_period_s, r.shapes)[0] for r in runs])
    pred = X[ok] @ coef
    rel = np.abs(pred - y[ok]) / y[ok]
    return coef, {
        "points": int(ok.sum()),
        "kept": int(kept.sum()),
        "mape_in_sample": float(rel.mean()),
        "median_ape_in_sample": float(np.median(rel)),
        # iterations that took twice their like neighbours: the machine was busy while calibrating
        "stalls": float(np.mean(stalled[ok])),
        "paths": paths,
    }


def fit_transfer_model(runs: list[ExecRun], fallback_s_per_byte: float = 1.0 / 5e9) -> tuple[dict, dict]:
    """latency + bytes x s_per_byte + copy calls x s_per_copy per direction, from the
    iterations that swapped, in absolute error: what validation checks is the total copy time,
    and a fit in relative error prices the large (slow) copies low. A direction never observed
    keeps a bandwidth-only fallback."""
    ev = [swap_events(r) for r in runs]
    cat = {
        k: np.concatenate([e[k] for e in ev]) if ev else np.zeros(0)
        for k in ("out_bytes", "in_bytes", "out_copies", "in_copies", "swap_s")
    }
    X = np.column_stack(
        [
            cat["out_bytes"] > 0,
            cat["out_bytes"],
            cat["out_copies"],
            cat["in_bytes"] > 0,
            cat["in_bytes"],
            cat["in_copies"],
        ]
    ).astype(np.float64)
    y = cat["swap_s"]
    out = {
        d: {"latency_s": 0.0, "s_per_byte": fallback_s_per_byte, "s_per_copy": 0.0, "copies_per_byte": 0.0}
        for d in ("d2h", "h2d")
    }
    info = {"points": int(y.size)}
    if y.size >= 6 and (y > 0).all():
        keep = np.ones(y.size, dtype=bool)
        scale = np.maximum(X.max(axis=0), 1e-30)
        for _ in range(3):
            coef_s, _ = nnls(X[keep] / scale, y[keep], maxiter=50 * X.shape[1])
            coef = coef_s / scale
            pred = X @ coef
            # a copy that took STALL_RATIO times its prediction lost its core for a while
            keep = y < STALL_RATIO * np.maximum(pred, 1e-12)
        for d, sl, b, c in (
            ("d2h", slice(0, 3), cat["out_bytes"], cat["out_copies"]),
            ("h2d", slice(3, 6), cat["in_bytes"], cat["in_copies"]),
        ):
            a, sb, sc = coef[sl]
            if sb > 0 or a > 0 or sc > 0:
                out[d] = {
                    "latency_s": float(a),
                    "s_per_byte": float(sb),
                    "s_per_copy": float(sc),
                    "copies_per_byte": float(c.sum() / b.sum()) if b.sum() > 0 else 0.0,
                }
        pred = X @ coef
        info.update(
            {
                "mape_in_sample": float(np.mean(np.abs(pred - y) / y)),
                "total_error_in_sample": float(pred.sum() / y.sum() - 1.0),
                "kept": int(keep.sum()),
            }
        )
    return out, info


def swap_ratio(fit: FittedCostModel, run: ExecRun) -> float:
    """Total measured over total priced copy time of a run's swaps (NaN without swaps)."""
    ev = swap_events(run)
    if not len(ev["swap_s"]):
        return float("nan")
    priced = float(priced_swaps(fit, ev).sum())
    return float(ev["swap_s"].sum() / priced) if priced > 0 else float("nan")


def fit_from_runs(run_dirs: list[Path], meta: dict | None = None, root: Path | None = None) -> FittedCostModel:
    """The cost model fitted to executor runs; their folders recorded relative to `root` (the
    fit file's folder, which a finished validation moves into place with them)."""
    runs = [load_exec_run(Path(d)) for d in run_dirs]
    if not runs:
        raise InfersimError("calibration: no executor runs to fit")
    sizes = {r.block_size for r in runs}
    if len(sizes) != 1:
        raise InfersimError(f"calibration runs use different block sizes {sorted(sizes)}")
    coef, it_info = fit_iteration_model(runs)
    transfer, tr_info = fit_transfer_model(runs)
    info = dict(meta or {})
    info.update(
        {
            "calibrated_on": [Path(d).relative_to(root).as_posix() if root else str(d) for d in run_dirs],
            "iteration_fit": it_info,
            "transfer_fit": tr_info,
            "model": runs[0].model,
            "device": runs[0].device,
            "threads": runs[0].threads,
        }
    )
    return FittedCostModel(coef, sizes.pop(), transfer, info)


def calibration_specs(
    model: str,
    seed: int = CALIBRATION_SEED,
    block_size: int = 16,
    serving: dict | None = None,
    requests: dict | None = None,
) -> list:
    """The calibration workloads as WorkloadSpecs (fp32, the executor's model): the generic set,
    or with `serving` (a workload's serving section) the matched set on that deployment, and
    with `requests` (its requests section) one more run of that request mix drawn with a
    calibration seed: other requests, the same kind of load."""
    specs = []
    if serving is not None:
        sv = {**serving, "block_size": block_size, "dtype": "fp32"}
        mixes = list(MATCHED_REQUESTS) + ([("calib-matched-mix", requests)] if requests is not None else [])
        for k, (name, req) in enumerate(mixes):
            specs.append(
                WorkloadSpec.model_validate(
                    {
                        "name": name,
                        "model": model,
                        "seed": seed + 8 + k,
                        "serving": sv,
                        "requests": json.loads(json.dumps(req)),
                    }
                )
            )
        return specs
    for k, w in enumerate(CALIBRATION_WORKLOADS):
        d = json.loads(json.dumps(w))
        d["serving"].update(block_size=block_size, dtype="fp32")
        d.update(model=model, seed=seed + k)
        specs.append(WorkloadSpec.model_validate(d))
    return specs


def calibrate(
    model: str,
    out_dir: Path,
    opts: CaseOptions = CaseOptions(),
    *,
    seed: int = CALIBRATION_SEED,
    block_size: int = 16,
    serving: dict | None = None,
) -> FittedCostModel:
    """Run the calibration workloads on the executor and fit; writes the runs under out_dir
    and the fit to out_dir/executor-fit.json."""
    out_dir = Path(out_dir)
    dirs = []
    sentinels = []
    specs = calibration_specs(model, seed, block_size, serving)
    for spec in specs:
        d = out_dir / spec.name
        if opts.log:
            opts.log(f"calibration run {spec.name} ({len(build_requests(spec))} requests)")
        sentinels.append(sentinel_s(model, device=opts.device, dtype=opts.dtype, threads=opts.threads))
        run_executor(spec, build_requests(spec), model, d, opts)
        dirs.append(d)
    sentinels.append(sentinel_s(model, device=opts.device, dtype=opts.dtype, threads=opts.threads))
    fit = fit_from_runs(
        dirs,
        {
            "seed": seed,
            "seeds": [s.seed for s in specs],
            "workloads": [s.name for s in specs],
            "matched": serving is not None,
            "sentinel_s": float(np.median(sentinels)),
            "sentinels_s": sentinels,
        },
        root=out_dir,
    )
    fit.save(out_dir / "executor-fit.json")
    return fit


@dataclass(frozen=True)
class CalibrationSet:
    """Which calibration workloads run (calibration_specs): the generic set, or with `serving`
    the matched set on that deployment."""

    seed: int = field(default=CALIBRATION_SEED, metadata={"help": "seed of the first calibration workload"})
    block_size: int = field(default=16, metadata={"help": "KV block size of every calibration run"})
    serving: dict | None = field(
        default=None, metadata={"help": "the validated workload's serving section; None: the generic set"}
    )
    requests: dict | None = field(
        default=None, metadata={"help": "its requests section, run once more with a calibration seed"}
    )

    def specs(self, model: str) -> list:
        return calibration_specs(model, self.seed, self.block_size, self.serving, self.requests)


def validated_tick_s(validated_dir: Path | None) -> float:
    """The validated run's speed tick level (execute.tick_level_s), on a GPU as on a CPU. The tick times a kernel on
    the host's core; a small model's GPU steps are launch-bound, paced by that core as a CPU
    run's are. On an H100 (zoo-target, four plain cases) the calibration runs' median ticks
    followed their decode steps (correlation 0.97 across runs), and the validated run's speed
    estimated by the ticks missed its measured speed by 0.3-10.7% (mean 3.7%) where the two
    runs beside it missed by 1.1-35.0% (mean 10.7%). Where the kernels set the pace instead, the
    ticks do not follow the calibration runs, and `speed_from_ticks` gives them little weight."""
    return speed_tick_s(validated_dir) if validated_dir is not None else float("nan")


@dataclass(frozen=True)
class CopyScale:
    """The factor for the fit's copy times in the validated run (None: leave them as fitted) and
    the words the verdict gives it."""

    speed: float | None
    note: str = ""


def _copy_scale(fit, runs: list[ExecRun], ticks: list[float], tick_val: float, adjacent: tuple[int, int]):
    """How the validated run's swap copies compare with the fit: the copies' own measured/priced
    ratio in the calibration runs, which drifts apart from the compute's (swap copies of one
    case took 10.6 to 13.3 us per block in consecutive runs). Where LOO_MIN_RUNS or more
    calibration runs swapped, their ratios go through the speed ticks like the compute's
    (speed_from_ticks); else the mean of the two runs next to the validated one (`adjacent`,
    indices into `runs`). Re-priced on 28 validated preempt-swap and preempt-cost-aware runs (26
    on the 2-core CPU, 2 on an H200): mean |swap-cost ratio error| 6.2% by the adjacent runs,
    3.3% through the ticks (within 5%: 18 and 24 of 28); the H200's preempt-cost-aware ran 1.3x
    slower than its calibration runs, copies included (-20.7% by the adjacent runs, -2.7%
    through the ticks). Returns the CopyScale and the adjacent runs' ratios."""
    ratios = [swap_ratio(fit, r) for r in runs]
    near = [ratios[i] for i in adjacent if np.isfinite(ratios[i]) and ratios[i] > 0]
    swapped = [i for i, c in enumerate(ratios) if np.isfinite(c) and c > 0]
    if len(swapped) >= LOO_MIN_RUNS:
        by_ticks = speed_from_ticks(
            [ratios[i] for i in swapped], [ticks[i] for i in swapped], tick_val, subject="the copies' speed"
        )
        if np.isfinite(by_ticks.speed):
            return CopyScale(by_ticks.speed, f"; copies scaled by {by_ticks.speed:.3f}, {by_ticks.note}"), near
    if not near:
        return CopyScale(None), near
    return CopyScale(float(np.mean(near)), f"; copies {', '.join(f'{c:.3f}' for c in near)}"), near


def calibrate_around(
    run,
    model: str,
    out_dir: Path,
    opts: CaseOptions = CaseOptions(),
    workloads: CalibrationSet = CalibrationSet(),
    validated_dir: Path | None = None,
) -> FittedCostModel:
    """Calibrate on both sides of `run()` (the validated run): the calibration workloads once
    before it and once after, one fit over both. A machine whose speed drifts then gets a fit for
    its average speed around the run rather than for a moment before it, and the two halves tell
    whether it drifted: meta["speed_shift"] = (median measured/fitted time after) / (before) - 1
    over the same workloads.

    The runs go in mirror order (after the run: the last one first), so the two runs next to
    the validated one are the same workload (with `requests`, its own mix), and the fit is
    scaled by their mean measured/fitted ratio: the machine's speed near the run. The speed of
    this 2-core machine moved by 5-15% within tens of seconds with nothing else running; the
    runs next to the validated one tracked it better than the fit's average over all six
    (preempt cases, mean absolute cost-model bias 3.5% against 5.2%). Nothing of the validated
    run is used.

    With speed ticks (executor/clock.py: a reference kernel timed inside each run) in every run,
    `validated_dir` the validated run's folder: the speed is that run's own instead, its tick
    level times the calibration runs' median speed per tick (measured/fitted ratio over tick,
    all six runs), or their median ratio where their ticks did not track their speed
    (execute.speed_from_ticks). Only the kernel's time is read from the validated run, never its
    iterations."""
    out_dir = Path(out_dir)
    seed, serving = workloads.seed, workloads.serving
    specs = workloads.specs(model)
    halves: dict[str, list[Path]] = {"before": [], "after": []}

    def calib(side: str) -> None:
        for spec in specs if side == "before" else specs[::-1]:
            d = out_dir / side / spec.name
            if not opts.reuse_runs:  # re-pricing: the runs already there
                if opts.log:
                    opts.log(f"calibration run {spec.name} ({side} the validated run)")
                run_executor(spec, build_requests(spec), model, d, opts)
            halves[side].append(d)

    calib("before")
    run()
    calib("after")
    fit = fit_from_runs(
        halves["before"] + halves["after"],
        {
            "seed": seed,
            "seeds": [s.seed for s in specs],
            "workloads": [s.name for s in specs],
            "matched": serving is not None,
            "bracketed": True,
        },
        root=out_dir,
    )
    loaded = {d: load_exec_run(d) for dirs in halves.values() for d in dirs}

    def ratios(d: Path) -> np.ndarray:
        e = loaded[d]
        y = e.iteration_period_s
        ok = np.isfinite(y)
        return y[ok] / fit.predict_many([s for s, k in zip(e.shapes, ok) if k])

    per_run = {d: ratios(d) for d in loaded}
    ratio = {
        side: float(np.median(np.concatenate([per_run[d] for d in dirs]))) if dirs else float("nan")
        for side, dirs in halves.items()
    }
    fit.meta["speed_ratio_before"], fit.meta["speed_ratio_after"] = ratio["before"], ratio["after"]
    fit.meta["speed_shift"] = ratio["after"] / ratio["before"] - 1.0
    adjacent = (halves["before"][-1], halves["after"][0])
    near = [float(np.median(per_run[d])) for d in adjacent]
    runs = [d for dirs in halves.values() for d in dirs]
    ticks = [speed_tick_s(d) for d in runs]
    tick_val = validated_tick_s(validated_dir)
    copy_scale, copies = _copy_scale(
        fit, [loaded[d] for d in runs], ticks, tick_val, adjacent=(len(halves["before"]) - 1, len(halves["before"]))
    )
    fit.meta["speed_ratio_adjacent"], fit.meta["copy_ratio_adjacent"] = near, copies

    speed = speed_from_ticks([np.median(per_run[d]) for d in runs], ticks, tick_val)
    if np.isfinite(speed.speed):
        fit.meta["speed_ticks_s"] = {"calibration": ticks, "validated": tick_val, "tick_weight": speed.tick_weight}
        fit = fit.scaled(speed.speed, why=speed.note + copy_scale.note, transfer_factor=copy_scale.speed)
    elif all(np.isfinite(near)) and all(x > 0 for x in near):
        fit = fit.scaled(
            float(np.mean(near)),
            why=f"the machine's speed near the validated run: mean measured/fitted "
            f"ratio of the calibration runs just before and after it "
            f"({near[0]:.3f}, {near[1]:.3f}){copy_scale.note}",
            transfer_factor=copy_scale.speed,
        )
    fit.save(out_dir / "executor-fit.json")
    return fit
