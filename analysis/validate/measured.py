"""Reading run directories back: an executor run (`sim exec`: iterations.parquet and
iteration_batches.parquet besides the common files) and a simulator run (`sim run`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from infersim.simulator.costmodel.executor_features import shapes_from_batches
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import read_columns

# a gap between iterations longer than this many median gaps, with an arrival inside it,
# is the engine waiting for work (its clock jumped), not engine overhead
IDLE_GAP_FACTOR = 4.0
IDLE_GAP_MIN_S = 2e-4


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise InfersimError(f"{path.parent}: missing {path.name}")
    return yaml.safe_load(path.read_text()) or {}


@dataclass
class RunDir:
    """What the common run directory holds (simulator or executor)."""

    path: Path
    config: dict
    summary: dict
    requests: dict[str, np.ndarray]
    series: dict[str, np.ndarray]

    @property
    def block_size(self) -> int:
        return int(self.config["workload"]["serving"]["block_size"])

    @property
    def bytes_per_block(self) -> float:
        return float(self.config["memory"]["kv_bytes_per_block"])

    @property
    def gpu_blocks(self) -> int:
        return int(self.config["memory"]["gpu_blocks"])


def _portable(config: dict) -> dict:
    """A run's config with its workload's model as this machine finds it: a run saved on another
    machine records its model's folder there (a zoo model's cache path); where that folder is
    missing here, the model the executor was asked for by name (`executor.model`, e.g.
    zoo-target) stands for it, so saved runs re-price anywhere (benchmarks/reprice_validation.py)."""
    w, name = config.get("workload") or {}, (config.get("executor") or {}).get("model")
    recorded = w.get("model")
    if name and recorded and recorded != name and not Path(str(recorded)).exists():
        return {**config, "workload": {**w, "model": name}}
    return config


def load_run(path: Path) -> RunDir:
    path = Path(path)
    if not path.is_dir():
        raise InfersimError(f"run directory not found: {path}")
    summary_path = path / "summary.json"
    if not summary_path.is_file():
        raise InfersimError(f"{path}: missing summary.json (not a run directory)")
    return RunDir(
        path,
        _portable(_read_yaml(path / "config.yaml")),
        json.loads(summary_path.read_text()),
        read_columns(path / "requests.parquet"),
        read_columns(path / "series.parquet"),
    )


@dataclass
class ExecRun(RunDir):
    iterations: dict[str, np.ndarray] = field(default_factory=dict)
    batches: dict[str, np.ndarray] = field(default_factory=dict)
    shapes: list = field(default_factory=list)
    iteration_period_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    idle_after: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @property
    def model(self) -> str:
        return str(self.config.get("executor", {}).get("model", self.config.get("model", {}).get("name", "?")))

    @property
    def device(self) -> str:
        return str(self.config.get("executor", {}).get("device", "?"))

    @property
    def threads(self) -> int:
        return int(self.config.get("executor", {}).get("threads", 0))


def engine_periods(it: dict[str, np.ndarray], arrivals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per iteration: the time from its start to the next iteration's start less that next
    iteration's swap copies (NaN for the last one and where the engine idled in between),
    and whether it idled."""
    start = np.asarray(it["t_start_s"], dtype=np.float64)
    end = np.asarray(it["t_end_s"], dtype=np.float64)
    swap = np.asarray(it["swap_s"], dtype=np.float64)
    n = start.size
    period = np.full(n, np.nan)
    idle = np.zeros(n, dtype=bool)
    if n < 2:
        return period, idle
    gap = start[1:] - end[:-1] - swap[1:]
    arr = np.sort(np.asarray(arrivals, dtype=np.float64))
    # an arrival strictly after this iteration ended and no later than the next one started
    k_lo = np.searchsorted(arr, end[:-1], side="right")
    k_hi = np.searchsorted(arr, start[1:], side="right")
    limit = max(IDLE_GAP_MIN_S, IDLE_GAP_FACTOR * float(np.median(gap)))
    idle[:-1] = (gap > limit) & (k_hi > k_lo)
    p = start[1:] - start[:-1] - swap[1:]
    period[:-1] = np.where(idle[:-1], np.nan, p)
    return period, idle


def load_exec_run(path: Path) -> ExecRun:
    base = load_run(path)
    it = read_columns(Path(path) / "iterations.parquet")
    b = read_columns(Path(path) / "iteration_batches.parquet")
    shapes = shapes_from_batches(b, np.asarray(it["iteration"], dtype=np.int64))
    arrivals = np.asarray(base.requests["arrival_s"], dtype=np.float64)
    period, idle = engine_periods(it, arrivals[arrivals >= 0])
    return ExecRun(base.path, base.config, base.summary, base.requests, base.series, it, b, shapes, period, idle)


STALL_FACTOR = 2.0  # an iteration this many times its like neighbours' median time stalled


def stalls(times_s: np.ndarray, shapes: list, window: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Which iterations stalled (the process lost its core for a scheduler slice), judged on
    the measurements alone: against the median of up to `window` iterations either side that
    ran the same kind of batch (decode-only or not) with the same number of sequences —
    consecutive decode steps of the same sequences cost almost the same. Returns (stalled,
    judged): iterations without two such neighbours are not judged."""
    y = np.asarray(times_s, dtype=np.float64)
    n = y.size
    kind = [(int(s.num_seqs), bool(np.all(s.query_tokens == 1))) for s in shapes]
    stalled = np.zeros(n, dtype=bool)
    judged = np.zeros(n, dtype=bool)
    for i in range(n):
        if not np.isfinite(y[i]):
            continue
        lo, hi = max(0, i - window), min(n, i + window + 1)
        ref = [y[j] for j in range(lo, hi) if j != i and np.isfinite(y[j]) and kind[j] == kind[i]]
        if len(ref) >= 2:
            judged[i] = True
            stalled[i] = y[i] >= STALL_FACTOR * float(np.median(ref))
    return stalled, judged


def jitter(times_s: np.ndarray, shapes: list, stalled: np.ndarray) -> float:
    """Median relative step between consecutive like iterations, stalls left out, / sqrt 2:
    the per-iteration timing noise no model can remove."""
    y = np.asarray(times_s, dtype=np.float64)
    d = []
    for i in range(1, y.size):
        a, b = shapes[i - 1], shapes[i]
        if (
            stalled[i]
            or stalled[i - 1]
            or not np.isfinite(y[i])
            or not np.isfinite(y[i - 1])
            or a.num_seqs != b.num_seqs
            or not (np.all(a.query_tokens == 1) and np.all(b.query_tokens == 1))
        ):
            continue
        d.append(abs(y[i] - y[i - 1]) / y[i - 1])
    return float(np.median(d) / np.sqrt(2.0)) if d else float("nan")


def swap_events(run: ExecRun) -> dict[str, np.ndarray]:
    """The iterations that swapped: bytes and copy calls per direction, and the measured copy
    time (both directions together: an iteration's swap time is one number). Runs recorded
    before the executor counted its copy calls have none (zeros)."""
    it = run.iterations
    o = np.asarray(it["swap_out_blocks"], dtype=np.float64) * run.bytes_per_block
    i = np.asarray(it["swap_in_blocks"], dtype=np.float64) * run.bytes_per_block
    m = (o > 0) | (i > 0)
    zero = np.zeros(o.size)
    co = np.asarray(it.get("swap_out_copies", zero), dtype=np.float64)
    ci = np.asarray(it.get("swap_in_copies", zero), dtype=np.float64)
    return {
        "out_bytes": o[m],
        "in_bytes": i[m],
        "out_copies": co[m],
        "in_copies": ci[m],
        "swap_s": np.asarray(it["swap_s"], dtype=np.float64)[m],
    }


def priced_swaps(cost_model, ev: dict) -> np.ndarray:
    """The cost model's time for each recorded swap (`swap_events`): with the copy calls the
    executor made when the model prices calls (an executor fit), else by the bytes alone."""

    def one(nbytes: float, direction: str, copies: float) -> float:
        if nbytes <= 0:
            return 0.0
        if copies > 0 and hasattr(cost_model, "copy_time_s"):
            return cost_model.copy_time_s(nbytes, direction, copies)
        return cost_model.transfer_time_s(nbytes, direction)

    return np.array(
        [
            one(o, "d2h", co) + one(i, "h2d", ci)
            for o, i, co, ci in zip(ev["out_bytes"], ev["in_bytes"], ev["out_copies"], ev["in_copies"])
        ],
        dtype=np.float64,
    )
