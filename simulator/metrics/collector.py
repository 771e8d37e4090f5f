"""Append-only metric columns, filled by the engine as it goes.

Per-request results live in preallocated arrays (one slot per request id). Inter-token
latencies are kept as (value, weight) pairs folded into a fixed log-spaced histogram, so a
million requests cost a few kilobytes. The time series has one row per engine segment (a
prefill iteration or a run of identical decode steps) and can be streamed to Parquet in
chunks so a long run keeps bounded memory."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REQUEST_COLUMNS = (
    "arrival_s",
    "first_scheduled_s",
    "first_token_s",
    "finish_s",
    "prompt_tokens",
    "output_tokens",
    "replica",
    "preempt_recompute",
    "preempt_swap",
    "aborted",
    "cached_tokens",
)
# the per-request columns as requests.parquet types them (the collector keeps float slots with
# -1 for "not yet"; every one of these is set by the time a request finishes or is aborted)
REQUEST_INT_COLUMNS = (
    "prompt_tokens",
    "output_tokens",
    "replica",
    "preempt_recompute",
    "preempt_swap",
    "cached_tokens",
)
REQUEST_BOOL_COLUMNS = ("aborted",)
SERIES_COLUMNS = (
    "t_start_s",
    "t_end_s",
    "replica",
    "steps",
    "batch_size",
    "batch_tokens",
    "prefill_tokens",
    "gpu_blocks_used",
    "cpu_blocks_used",
    "waiting",
    "swapped",
    "swap_out_bytes",
    "swap_in_bytes",
    "gpu_blocks_cached",  # blocks holding prefix-cache keys at the segment's end (0 without caching)
)

# inter-token latency histogram: 10 us .. 1e4 s, 400 bins per decade (~0.6% relative width)
_ITL_EDGES = np.logspace(-5, 4, 9 * 400 + 1)
# the quantities integrated over time (series columns), in TimeIntegrals order
_TW_COLUMNS = ("batch_size", "gpu_blocks_used", "cpu_blocks_used")


def exact_partials(terms) -> list[float]:
    """Floats whose exact sum is the exact sum of `terms` (math.fsum rounds once; the rest is
    taken again until nothing is left), so sums kept this way do not depend on the order or
    grouping of their terms."""
    terms, out = list(terms), []
    while True:
        r = math.fsum(terms + [-x for x in out])
        if r == 0.0:
            return out
        out.append(r)


def exact_products(v: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """v * w as a rounded product plus its exact error (Dekker), for integer weights below 2^26."""
    p = v * w
    c = v * 134217729.0  # 2^27 + 1: Veltkamp's split of v into 26-bit halves
    hi = c - (c - v)
    return p, (hi * w - p) + (v - hi) * w


class TimeIntegrals:
    """Time integrals of one replica's batch size and KV blocks in use, and its busy time, the
    same however the timeline is cut into segments (an event-mode stretch or one step at a time):
    contiguous pieces with equal values merge first, and each maximal piece adds
    (end - start) * value, so both modes add the same products in the same order."""

    def __init__(self):
        self.sums = [0.0] * (1 + len(_TW_COLUMNS))  # busy time, then one per column
        self._open: tuple[float, float, tuple] | None = None  # (start, end, values)

    def add(self, start: float, end: float, values: tuple) -> None:
        if end <= start:
            return
        op = self._open
        if op is not None and op[1] == start and op[2] == values:
            self._open = (op[0], end, values)
            return
        self._close()
        self._open = (start, end, values)

    @staticmethod
    def _accumulate(sums: list[float], piece: tuple[float, float, tuple]) -> None:
        start, end, values = piece
        dt = end - start
        sums[0] += dt
        for i, v in enumerate(values):
            sums[i + 1] += dt * v

    def _close(self) -> None:
        if self._open is not None:
            self._accumulate(self.sums, self._open)
            self._open = None

    def totals(self) -> list[float]:
        """The sums with the open piece included (it stays open: more may join it)."""
        sums = list(self.sums)
        if self._open is not None:
            self._accumulate(sums, self._open)
        return sums


class MetricsCollector:
    def __init__(self, num_requests: int, series_path: Path | None = None, chunk_rows: int = 65536):
        self.n = 0
        self._cap = max(16, int(num_requests))
        self.req = {c: np.full(self._cap, -1.0) for c in REQUEST_COLUMNS}
        self.itl_hist = np.zeros(len(_ITL_EDGES) + 1, dtype=np.float64)
        self.itl_sum = 0.0
        self.itl_count = 0.0
        self._itl_vals: list[np.ndarray] = []
        self._itl_wts: list[np.ndarray] = []
        self._itl_pending = 0
        self._itl_partials: list[float] = []  # exact sum of value * weight (exact_partials)
        self.counters = {
            "preempt_recompute": 0,
            "preempt_swap": 0,
            "preempt_recompute_forced": 0,
            "swap_out_bytes": 0.0,
            "swap_in_bytes": 0.0,
            "aborted": 0,
            "iterations": 0,
            "segments": 0,
        }
        self._chunk = int(chunk_rows)
        self._series = np.zeros((self._chunk, len(SERIES_COLUMNS)))
        self._series_rows = 0
        self._series_done: list[np.ndarray] = []
        self._series_path = series_path
        self._writer = None
        # time integrals per replica, for summaries without reading the series back
        self._integrals: dict[int, TimeIntegrals] = {}
        self.peak = {"batch_size": 0.0, "gpu_blocks_used": 0.0, "cpu_blocks_used": 0.0}
        self.abort_reasons: dict[str, int] = {}  # SchedulerLimits.abort_reason -> requests

    # ---- requests ---------------------------------------------------------------------
    def _ensure(self, rid: int) -> None:
        if rid >= self._cap:
            new = max(rid + 1, self._cap * 2)
            for c in REQUEST_COLUMNS:
                grown = np.full(new, -1.0)
                grown[: self._cap] = self.req[c]
                self.req[c] = grown
            self._cap = new

    def arrive(self, seq) -> None:
        self._ensure(seq.rid)
        r = self.req
        r["arrival_s"][seq.rid] = seq.arrival_s
        r["prompt_tokens"][seq.rid] = seq.prompt_len
        r["output_tokens"][seq.rid] = seq.output_len
        r["preempt_recompute"][seq.rid] = 0
        r["preempt_swap"][seq.rid] = 0
        r["aborted"][seq.rid] = 0
        r["cached_tokens"][seq.rid] = 0  # prompt tokens found in the prefix cache at the first admission
        self.n = max(self.n, seq.rid + 1)

    def finish(self, seq, now: float, aborted: bool = False, reason: str = "unknown") -> None:
        r = self.req
        r["first_scheduled_s"][seq.rid] = seq.first_scheduled_s
        r["first_token_s"][seq.rid] = seq.first_token_s
        r["finish_s"][seq.rid] = now
        r["replica"][seq.rid] = seq.replica
        r["cached_tokens"][seq.rid] = max(0, getattr(seq, "cached_tokens", 0))
        if aborted:
            r["aborted"][seq.rid] = 1
            self.counters["aborted"] += 1
            self.abort_reasons[reason] = self.abort_reasons.get(reason, 0) + 1

    def preempt(self, seq, mode: str, forced: bool = False) -> None:
        self.req[f"preempt_{mode}"][seq.rid] += 1
        self.counters[f"preempt_{mode}"] += 1
        if forced:
            self.counters["preempt_recompute_forced"] += 1

    # ---- inter-token latencies --------------------------------------------------------
    def add_itl(self, values, weight) -> None:
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        w = np.broadcast_to(np.asarray(weight, dtype=np.float64), v.shape)
        self._itl_vals.append(v)
        self._itl_wts.append(w)
        self._itl_pending += v.size
        if self._itl_pending > 1 << 18:
            self._fold_itl()

    def _fold_itl(self) -> None:
        if not self._itl_vals:
            return
        v = np.concatenate(self._itl_vals)
        w = np.concatenate(self._itl_wts)
        idx = np.searchsorted(_ITL_EDGES, v, side="right")
        self.itl_hist += np.bincount(idx, weights=w, minlength=self.itl_hist.size)
        # exactly: one gap of weight b (a decode stretch) and b gaps of weight 1 (step by step) add the same
        p, err = exact_products(v, w)
        self._itl_partials = exact_partials([*p.tolist(), *err.tolist(), *self._itl_partials])
        self.itl_sum = math.fsum(self._itl_partials)
        self.itl_count += float(w.sum())
        self._itl_vals, self._itl_wts, self._itl_pending = [], [], 0

    def itl_percentile(self, p: float) -> float:
        self._fold_itl()
        if self.itl_count == 0:
            return float("nan")
        cum = np.cumsum(self.itl_hist)
        i = int(np.searchsorted(cum, p / 100.0 * cum[-1], side="left"))
        lo = _ITL_EDGES[max(0, i - 1)]
        hi = _ITL_EDGES[min(len(_ITL_EDGES) - 1, i)]
        return float(np.sqrt(lo * hi))  # geometric bin centre

    def itl_mean(self) -> float:
        self._fold_itl()
        return self.itl_sum / self.itl_count if self.itl_count else float("nan")

    # ---- time series ------------------------------------------------------------------
    @property
    def tw(self) -> dict[str, float]:
        """Time-weighted sums over the replicas' busy time: time_s and one per integrated column."""
        return self.time_integrals()

    def time_integrals(self, replicas=None) -> dict[str, float]:
        """`tw` over the given replica indices only (None: every replica)."""
        totals = [0.0] * (1 + len(_TW_COLUMNS))
        for rep in sorted(self._integrals):
            if replicas is not None and rep not in replicas:
                continue
            for i, x in enumerate(self._integrals[rep].totals()):
                totals[i] += x
        return dict(zip(("time_s", *_TW_COLUMNS), totals))

    def segment(self, row: tuple, gpu_blocks_steps: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """One row of the series. `gpu_blocks_steps` = (step end times, GPU blocks in use per
        step) when the blocks in use changed inside the segment (a decode stretch): the time
        integral then counts each step with its own value, as stepping one by one does."""
        self._series[self._series_rows] = (*row, *(0.0,) * (len(SERIES_COLUMNS) - len(row)))  # later columns: 0
        integ = self._integrals.setdefault(int(row[2]), TimeIntegrals())
        if gpu_blocks_steps is None:
            integ.add(row[0], row[1], (row[4], row[7], row[8]))
        else:
            ends, used = gpu_blocks_steps
            cuts = np.flatnonzero(np.diff(used)) + 1  # steps where the blocks in use change
            first = np.concatenate(([0], cuts)).tolist()
            last = np.concatenate((cuts, [len(used)])).tolist()
            for a, b in zip(first, last):
                integ.add(
                    row[0] if a == 0 else float(ends[a - 1]), float(ends[b - 1]), (row[4], float(used[a]), row[8])
                )
        pk = self.peak
        pk["batch_size"] = max(pk["batch_size"], row[4])
        pk["gpu_blocks_used"] = max(pk["gpu_blocks_used"], row[7])
        pk["cpu_blocks_used"] = max(pk["cpu_blocks_used"], row[8])
        self._series_rows += 1
        self.counters["segments"] += 1
        self.counters["iterations"] += int(row[3])
        if self._series_rows == self._chunk:
            self._flush_series()

    def _flush_series(self) -> None:
        block = self._series[: self._series_rows].copy()
        self._series_rows = 0
        if self._series_path is None:
            self._series_done.append(block)
            return

        table = pa.table({c: block[:, i] for i, c in enumerate(SERIES_COLUMNS)})
        if self._writer is None:
            self._series_path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(str(self._series_path), table.schema)
        self._writer.write_table(table)

    def close_series(self):
        """Finish the time series: returns the in-memory array (None when streamed)."""
        if self._series_rows or (self._series_path is not None and self._writer is None):
            self._flush_series()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            return None
        return np.concatenate(self._series_done) if self._series_done else np.zeros((0, len(SERIES_COLUMNS)))

    def requests_table(self) -> dict[str, np.ndarray]:
        return {c: self.req[c][: self.n].copy() for c in REQUEST_COLUMNS}
