"""Running the executor for validation: one torch thread (timings on a shared machine),
arrivals replayed without sleeping, no plots (the report draws its own).

The objects alive before the run (torch, transformers, the loaded model: several hundred
thousand) are moved out of the garbage collector's reach for its duration (`gc.freeze`), so a
full collection in the middle of a millisecond iteration walks only what the run itself
allocates; calibration and validated runs are treated alike."""
from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SPEED_TICKS = "speed_ticks.json"


@contextmanager
def recording_speed_ticks(out: Path):
    """The run's speed ticks (executor/clock.py) written to out/speed_ticks.json when it ends."""
    from executor.clock import TICK_EVERY, speed_ticks

    from simulator.metrics.rundir import write_json

    with speed_ticks(TICK_EVERY) as rows:
        yield
    if rows and Path(out).is_dir():
        d = {"every_steps": TICK_EVERY, "clock_s": [r[0] for r in rows], "tick_s": [r[1] for r in rows]}
        if all(len(r) > 2 for r in rows):  # a pipelined run's drafting process ticked beside it
            d["drafting_tick_s"] = [r[2] for r in rows]
        write_json(Path(out) / SPEED_TICKS, d)


def speed_tick_s(run_dir: Path, key: str = "tick_s") -> float:
    """The median speed tick of a run (NaN for a run without ticks: older runs). key
    "drafting_tick_s": a pipelined run's drafting process's ticks, taken beside its own."""
    import json

    path = Path(run_dir) / SPEED_TICKS
    if not path.is_file():
        return float("nan")
    ticks = json.loads(path.read_text()).get(key) or []
    return float(np.median(ticks)) if len(ticks) >= 3 else float("nan")


# leave-one-out needs this many calibration runs to say whether the ticks track their speed
LOO_MIN_RUNS = 4


@dataclass(frozen=True)
class TickSpeed:
    """The validated run's speed (measured/fitted time; NaN: leave the fit as it is), where it
    came from ("ticks" or "calibration": the calibration runs' median ratio) and a sentence for
    the report."""
    speed: float
    source: str = ""
    note: str = ""


def _loo_log_errors(r: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Mean |log error| predicting each calibration run's ratio from the others: by their median
    ratio (constant), and by their median ratio per tick times its own tick."""
    const, tick = [], []
    for i in range(r.size):
        m = np.arange(r.size) != i
        const.append(abs(np.log(np.median(r[m]) / r[i])))
        tick.append(abs(np.log(np.median(r[m] / t[m]) * t[i] / r[i])))
    return float(np.mean(const)), float(np.mean(tick))


def speed_from_ticks(ratios, ticks, tick_val: float) -> TickSpeed:
    """The validated run's speed from its median speed tick: the calibration runs' median ratio
    per tick (`ratios` their measured/fitted ratios, `ticks` their median ticks) times its tick.

    Whether the ticks track the run's speed on this machine at this moment is checked on the
    calibration runs themselves (with LOO_MIN_RUNS or more): each run's ratio predicted from the
    others, by ticks and by their median ratio alone; where the ticks predicted worse, the
    median ratio is the speed (source "calibration"). Measured on the matrix of 2026-11-25 06:04
    UTC (14 validations): the tick kernel sometimes moved 10-30% between runs that ran at the same
    speed (spec-draft, medusa-tree: -8..-9% bias from the ticks), and sometimes followed a run 24%
    slower than the runs around it; mean |speed error| 3.2% by the ticks, 3.3% by the median
    ratio, 2.2% choosing per validation (none over 5%).

    NaN when a run has no ticks (an older run). The callers pass no tick for a GPU run: the
    kernel times the host's core, which is what a CPU run's steps take and not what a GPU's
    kernels do."""
    r, t = np.asarray(ratios, dtype=np.float64), np.asarray(ticks, dtype=np.float64)
    if not (np.isfinite(tick_val) and r.size and r.size == t.size and np.isfinite(r).all() and (r > 0).all()
            and np.isfinite(t).all() and (t > 0).all()):
        return TickSpeed(float("nan"))
    by_ticks = float(np.median(r / t) * tick_val)
    note = (f"the machine's speed in the validated run: its speed tick {tick_val * 1e3:.3f} ms (calibration runs "
            f"{t.min() * 1e3:.3f}-{t.max() * 1e3:.3f} ms) times their median measured/fitted ratio per tick")
    if r.size < LOO_MIN_RUNS:
        return TickSpeed(by_ticks, "ticks", note)
    loo_const, loo_tick = _loo_log_errors(r, t)
    check = (f" (leave-one-out over the {r.size} calibration runs: {loo_tick:.1%} by their ticks, "
             f"{loo_const:.1%} by their median ratio)")
    if loo_tick < loo_const:
        return TickSpeed(by_ticks, "ticks", note + check)
    return TickSpeed(float(np.median(r)), "calibration",
                     f"the calibration runs' median measured/fitted ratio: their speed ticks did not track their "
                     f"speed{check}; the validated run's tick {tick_val * 1e3:.3f} ms not used")


def run_executor(spec, requests, model: str, out: Path, *, device: str = "cpu", dtype: str | None = None,
                 threads: int = 1) -> dict:
    import torch

    from executor.run import execute

    prev = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    gc.collect()
    gc.freeze()
    try:
        with recording_speed_ticks(out):
            return execute(spec, requests, model, Path(out), device=device, dtype=dtype, realtime=False,
                           plots=False, quiet=True)
    finally:
        gc.unfreeze()
        torch.set_num_threads(prev)
