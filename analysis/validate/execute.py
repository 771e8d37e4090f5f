"""Running the executor for validation: one torch thread (timings on a shared machine),
arrivals replayed without sleeping, no plots (the report draws its own).

The objects alive before the run (torch, transformers, the loaded model: several hundred
thousand) are moved out of the garbage collector's reach for its duration (`gc.freeze`), so a
full collection in the middle of a millisecond iteration walks only what the run itself
allocates; calibration and validated runs are treated alike."""

from __future__ import annotations

import dataclasses
import gc
import json
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow.parquet as pq

from infersim.executor.clock import TICK_EVERY, speed_ticks
from infersim.executor.options import VALIDATION
from infersim.simulator.metrics.rundir import write_json

from .rule import apply_rule

SPEED_TICKS = "speed_ticks.json"


@contextmanager
def recording_speed_ticks(out: Path):
    """The run's speed ticks (executor/clock.py) written to out/speed_ticks.json when it ends."""
    with speed_ticks(TICK_EVERY) as rows:
        yield
    if rows and Path(out).is_dir():
        d = {"every_steps": TICK_EVERY, "clock_s": [r[0] for r in rows], "tick_s": [r[1] for r in rows]}
        if all(len(r) > 2 for r in rows):  # a pipelined run's drafting process ticked beside it
            d["drafting_tick_s"] = [r[2] for r in rows]
        write_json(Path(out) / SPEED_TICKS, d)


# a tick longer than this many times the run's median is capped there: one long stall (a page
# fault storm, a collection) is not the core's share, while time slices lost to another process
# (4-5x a 0.9 ms tick on a 2-core host) stay in
TICK_CAP = 10.0


def tick_level_s(ticks) -> float:
    """A run's speed level from its speed ticks: their mean, each capped at TICK_CAP times their
    median. The mean, not the median: a process sharing its core loses whole time slices (4-5
    ms), which a 0.9 ms kernel escapes in most ticks, so the median stays at the uncontended
    speed while the run's iterations take twice as long; the mean counts the lost slices in
    proportion (a busy process on the same core: median 0.88-0.96 ms alone and shared, mean 0.90
    alone, 1.6-2.3 ms shared, the runs' busy time 1.06 against 2.2-2.4 s). NaN under 3 ticks."""
    t = np.asarray(ticks, dtype=np.float64)
    if t.size < 3:
        return float("nan")
    return float(np.mean(np.minimum(t, TICK_CAP * np.median(t))))


def speed_tick_s(run_dir: Path, key: str = "tick_s") -> float:
    """The speed level of a run's ticks (tick_level_s; NaN for a run without ticks: older runs).
    key "drafting_tick_s": a pipelined run's drafting process's ticks, taken beside its own."""
    path = Path(run_dir) / SPEED_TICKS
    if not path.is_file():
        return float("nan")
    return tick_level_s(json.loads(path.read_text()).get(key) or [])


# the speed ticks nearest an iteration that say the machine's speed around it (5 tracked the
# per-iteration errors best of 1, 3, 5 and 9 on plain-load validations; CHANGELOG.md, validation)
LOCAL_TICKS = 5
LOCAL_MIN_TICKS = 10


def local_speed(run_dir: Path, times_s) -> np.ndarray | None:
    """The machine's speed around each engine time in `times_s` (seconds on the run's engine
    clock) relative to the whole run: the median of the LOCAL_TICKS speed ticks nearest in time
    over the run's median tick. None for a run with fewer than LOCAL_MIN_TICKS ticks."""
    path = Path(run_dir) / SPEED_TICKS
    if not path.is_file():
        return None
    d = json.loads(path.read_text())
    clock, ticks = (
        np.asarray(d.get("clock_s") or [], dtype=np.float64),
        np.asarray(d.get("tick_s") or [], dtype=np.float64),
    )
    if ticks.size < LOCAL_MIN_TICKS or clock.size != ticks.size:
        return None
    times = np.asarray(times_s, dtype=np.float64)
    k = min(LOCAL_TICKS, ticks.size)
    near = np.argsort(np.abs(times[:, None] - clock[None, :]), axis=1, kind="stable")[:, :k]
    return np.median(ticks[near], axis=1) / np.median(ticks)


# leave-one-out needs this many calibration runs to say whether the ticks track their speed
LOO_MIN_RUNS = 4


@dataclass(frozen=True)
class TickSpeed:
    """The validated run's speed (measured/fitted time; NaN: leave the fit as it is), the weight
    its ticks had in it against the calibration runs' median ratio (1: the ticks alone), and a
    sentence for the report."""

    speed: float
    tick_weight: float = float("nan")
    note: str = ""


def _loo_log_errors(r: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Root-mean-square log error predicting each calibration run's ratio from the others: by
    their median ratio (constant), and by their median ratio per tick times its own tick."""
    const, tick = [], []
    for i in range(r.size):
        m = np.arange(r.size) != i
        const.append(np.log(np.median(r[m]) / r[i]))
        tick.append(np.log(np.median(r[m] / t[m]) * t[i] / r[i]))
    return float(np.sqrt(np.mean(np.square(const)))), float(np.sqrt(np.mean(np.square(tick))))


def speed_from_ticks(
    ratios, ticks, tick_val: float, subject: str = "the machine's speed in the validated run"
) -> TickSpeed:
    """The validated run's speed from its speed tick level (tick_level_s): the calibration runs'
    median ratio per tick (`ratios` their measured/fitted ratios, `ticks` their tick levels) times
    its tick.

    How far the ticks track the run's speed on this machine at this moment is measured on the
    calibration runs themselves (with LOO_MIN_RUNS or more): each run's ratio predicted from the
    others, by the ticks and by their median ratio alone; the two estimates of the validated
    run's speed are combined in log space with inverse-variance weights from those leave-one-out
    errors (ticks that predicted the runs exactly get weight 1, ticks that moved while the runs
    did not get little). A validated tick outside the calibration runs' range adds its log
    distance from that range to the median ratio's error: on a host where another process shared
    the core through the calibration runs and not the validated run (validated run 0.44 of the
    fit), the median ratio said 1.02 and the weighted speed 1.00 (the median ticks saw nothing),
    the tick levels with this term 0.51. Measured with each run's median tick as its level,
    re-priced on 45 validations of three matrices (CHANGELOG.md, validation;
    the validated runs' measured/fitted ratio against each estimate): mean |speed error| 4.3% by the
    median ratio, 3.4% by the ticks, 3.1% choosing the smaller leave-one-out error, 3.0% weighted
    (over 5%: 13, 9, 8 and 7 of 45); the tick kernel sometimes moved 10-30% between runs at the
    same speed, and sometimes followed a run 24-30% slower than the runs around it.

    `subject` names what the note says the speed is of (the swap copies' has its own).

    NaN when a run has no ticks (an older run), or no tick is passed: the offload validation and
    a pipelined run's drafting process pass none for a GPU run (how those follow the ticks is not
    measured yet); the plain and speculative ones pass it (calibrate.validated_tick_s: a small
    model's GPU steps are host-paced)."""
    r, t = np.asarray(ratios, dtype=np.float64), np.asarray(ticks, dtype=np.float64)
    if not (
        np.isfinite(tick_val)
        and r.size
        and r.size == t.size
        and np.isfinite(r).all()
        and (r > 0).all()
        and np.isfinite(t).all()
        and (t > 0).all()
    ):
        return TickSpeed(float("nan"))
    by_ticks = float(np.median(r / t) * tick_val)
    note = (
        f"{subject}: its speed tick {tick_val * 1e3:.3f} ms (calibration runs "
        f"{t.min() * 1e3:.3f}-{t.max() * 1e3:.3f} ms) times their median measured/fitted ratio per tick"
    )
    if r.size < LOO_MIN_RUNS:
        return TickSpeed(by_ticks, 1.0, note)
    loo_const, loo_tick = _loo_log_errors(r, t)
    # the median ratio assumes the validated run ran like the calibration runs; a tick outside
    # their range says it did not, by at least that distance (log), which leaving one calibration
    # run out cannot show
    outside = max(0.0, float(np.log(tick_val / t.max())), float(np.log(t.min() / tick_val)))
    var_c, var_t = loo_const**2 + outside**2, loo_tick**2
    w = 0.5 if var_c + var_t == 0 else var_c / (var_c + var_t)
    const = float(np.median(r))
    speed = float(np.exp(w * np.log(by_ticks) + (1.0 - w) * np.log(const)))
    return TickSpeed(
        speed,
        w,
        f"{note} ({by_ticks:.3f}), weighted {w:.2f} against their median ratio ({const:.3f}) "
        f"by how well each predicted the {r.size} calibration runs left out one at a time "
        f"(rms {loo_tick:.1%} by ticks, {loo_const:.1%} by the median ratio"
        + (f"; its tick {outside:.1%} (log) outside theirs" if outside > 0 else "")
        + ")",
    )


def scaled_clause(meta: dict) -> str:
    """The verdict's words for a fit scaled to the validated run's speed ('' when it was not)."""
    if "scaled_by" not in meta or "scaled_because" not in meta:
        return ""
    return f"; scaled by {meta['scaled_by']:.3f}, {meta['scaled_because']}"


def busy_s(run_dir: Path) -> float:
    """Seconds the engine computed in an executor run: its iterations' (a speculative run: its
    verification rounds') durations summed; idle waits for arrivals are not in it. NaN for a
    folder with neither table."""
    for name in ("iterations.parquet", "speculation_rounds.parquet"):
        path = Path(run_dir) / name
        if path.is_file():
            t = pq.read_table(str(path), columns=["t_start_s", "t_end_s"])
            return float(np.sum(t.column("t_end_s").to_numpy() - t.column("t_start_s").to_numpy()))
    return float("nan")


def run_repeated(run_one, exec_dir: Path, repeats: int = 1) -> dict:
    """The validated run, measured `repeats` times on the same requests: run_one(folder) for each;
    the run of median busy time (execute.busy_s: the machine's speed, read without the simulator)
    is kept at exec_dir, the others beside it as <exec_dir>.repeat-K. A single run on a shared
    2-core machine sometimes runs 10% slower or faster than the calibration runs around it with
    nothing to tell it apart; the median of three is the level the machine held, as benchmarks
    report. Returns what the report says about it (empty for one run)."""
    exec_dir, repeats = Path(exec_dir), max(1, int(repeats))
    for old in exec_dir.parent.glob(f"{exec_dir.name}.repeat-*"):
        shutil.rmtree(old)  # a previous validation's
    if repeats == 1:
        run_one(exec_dir)
        return {}
    dirs = [exec_dir.parent / f"{exec_dir.name}.repeat-{k}" for k in range(1, repeats + 1)]
    for d in dirs:
        run_one(d)
    busy = [busy_s(d) for d in dirs]
    kept = int(np.argsort(np.nan_to_num(busy, nan=np.inf), kind="stable")[(repeats - 1) // 2])
    if exec_dir.exists():
        shutil.rmtree(exec_dir)
    dirs[kept].rename(exec_dir)
    finite = [b for b in busy if np.isfinite(b)]
    spread = max(finite) / min(finite) - 1.0 if finite and min(finite) > 0 else float("nan")
    return {"repeats": repeats, "busy_s": busy, "kept": kept + 1, "spread": spread}


def repeat_dirs(exec_dir: Path) -> list[Path]:
    """The validated run's folders: the run kept (of median busy time) first, then the other
    repeats run_repeated left beside it."""
    exec_dir = Path(exec_dir)
    return [exec_dir] + sorted(exec_dir.parent.glob(f"{exec_dir.name}.repeat-*"))


def repeats_note(info: dict) -> str:
    """One sentence for the report: which of the repeated runs is the measurement."""
    if not info:
        return ""
    times = ", ".join(f"{b:.2f}" for b in info["busy_s"])
    return (
        f"measured {info['repeats']} times on the same requests (busy {times} s, spread "
        f"{info['spread']:.1%}); run {info['kept']}, the median, is the measurement"
    )


@dataclass(frozen=True)
class CaseOptions:
    """How a validation case runs: the executor's settings, the workload drawn, the report."""

    device: str = "cpu"
    dtype: str | None = None  # the executor's default for the device when None
    threads: int = 1
    seed: int | None = None  # the case's own seed when None
    requests: int | None = None  # the case's own request count when None
    spec: object = None  # a WorkloadSpec that replaces the case's workload
    calibration: Path | None = None  # a saved fit instead of calibrating now
    report: bool = True  # write report.html / report.md
    repeats: int = 1  # measure the validated run this many times and keep the median (run_repeated)
    # re-price: fit and compare the runs already in the output folder (exec/, calibration/) with
    # this code, executing nothing (benchmarks/reprice_validation.py; plain and speculative cases)
    reuse_runs: bool = False
    log: Callable[[str], None] | None = None  # progress lines


def run_executor(spec, requests, model: str, out: Path, opts: CaseOptions = CaseOptions(), execute=None) -> dict:
    """One validated run: `execute` (a mode's hook; default the plain executor) on `opts.threads`
    torch threads, with the speed ticks recorded, the clock jumping idle gaps and no plots."""
    import torch

    if execute is None:
        from infersim.executor.run import execute

    prev = torch.get_num_threads()
    torch.set_num_threads(max(1, int(opts.threads)))
    gc.collect()
    gc.freeze()  # collections walk only what the run allocates
    try:
        with recording_speed_ticks(out):
            exec_opts = dataclasses.replace(VALIDATION, device=opts.device, dtype=opts.dtype)
            return execute(spec, requests, model, Path(out), exec_opts)
    finally:
        gc.unfreeze()
        torch.set_num_threads(prev)


def case_header(case, model: str, opts: CaseOptions) -> dict:
    """The fields every case's validation.json starts with: which case ran, of what, on what."""
    return {
        "case": case.name,
        "title": case.title,
        "mode": case.mode,
        "model": model,
        "device": opts.device,
        "threads": opts.threads,
    }


def finish_case(result: dict, out: Path, report: Callable[[], object] | None = None) -> dict:
    """A case's verdict under the rule (rule.apply_rule) written to out/validation.json, then its
    report (`report`, when the case writes one); returns the result."""
    apply_rule(result)
    write_json(Path(out) / "validation.json", result)
    if report is not None:
        report()
    return result


def execute_case(case, mode, spec, reqs, model: str, out: Path, opts: CaseOptions, what: str = "") -> dict:
    """The validated run, `opts.repeats` times, into out/exec; what run_repeated says about it.
    With `opts.reuse_runs` nothing runs: the folders already there are the runs (re-pricing)."""
    if opts.reuse_runs:
        return {}
    if opts.log:
        opts.log(f"{case.name}: executing {len(reqs)} requests on {model} ({opts.device}){what}")
    return run_repeated(
        lambda d: mode.run(spec, reqs, model, d, opts),
        out / "exec",
        opts.repeats,
    )
