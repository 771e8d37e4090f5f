"""Reading measured collective tables and fitting a `collectives:` profile section from them.

Two layouts are read, told apart by their columns (`detect`):

- `infersim-collectives`: one row per (setup, collective, num_workers, size, devices_per_node)
  with `median_ms` (the layout of the collectives table derived from microsoft/vidur's
  profiling data, and the documented format for a user's own measurements);
- `vidur-network`: vidur's profiler output (`data/profiling/network/<setup>/all_reduce.csv`,
  `send_recv.csv`): `time_stats.<collective>.median` in ms, one row per size and rank; the
  setup is the folder name unless given.

`size` counts fp16 elements (bytes = 2 x size), as both layouts record it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from ..errors import InfersimError
from .collectives import COLLECTIVES, CollectiveFit, CollectivesSection, SizeSegment, topology_of

# Repeated medians of one kernel in microsoft/vidur's tables (benchmarks/data/gpu-kernels) agree
# within 1.05x on the A100 and 1.21x on the A40 and H100: two times further apart than 1.5x are
# not the same measurement (a typo, another unit, another device). `sim calibrate` applies it to
# GEMM and elementwise rows (calibration/checks.py) and here to collectives.
REPEAT_RATIO = 1.5

BYTES_PER_ELEMENT = 2  # the tables time fp16 buffers
KEY = ["setup", "collective", "num_workers", "devices_per_node"]
INTEGER_COLUMNS = ("num_workers", "size", "devices_per_node", "max_devices_per_node")
FORMATS = {
    "infersim-collectives": {
        "setup",
        "collective",
        "num_workers",
        "size",
        "devices_per_node",
        "max_devices_per_node",
        "median_ms",
    },
    "vidur-network": {"collective", "num_workers", "size", "devices_per_node", "max_devices_per_node"},
}


def detect(columns: Iterable[str]) -> str | None:
    """The collective-table layout these columns belong to, or None if neither."""
    cols = set(columns)
    if FORMATS["infersim-collectives"] <= cols:
        return "infersim-collectives"
    if FORMATS["vidur-network"] <= cols and any(_is_vidur_median(c) for c in cols):
        return "vidur-network"
    return None


def _is_vidur_median(column: str) -> bool:
    return column.startswith("time_stats.") and column.endswith(".median")


def _fail(path: Path, row: int, column: str, problem: str):
    raise InfersimError(f"{path}: row {row + 1} (line {row + 2}), column '{column}': {problem}")


def read_collectives_table(path: str | Path, setup: str | None = None) -> pd.DataFrame:
    """Rows of a collective table as setup, collective, num_workers, devices_per_node,
    max_devices_per_node, nbytes, time_s (medians over the ranks of vidur's tables). A malformed
    row, or one size measured twice (on the same rank) with times more than REPEAT_RATIO apart,
    is a one-line InfersimError naming the file, row and column."""
    path = Path(path)
    if not path.is_file():
        raise InfersimError(f"{path}: file not found")
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InfersimError(f"{path}: not a readable CSV table ({exc.__class__.__name__})") from None
    kind = detect(raw.columns)
    if kind is None:
        need = sorted(FORMATS["infersim-collectives"])
        raise InfersimError(
            f"{path}: not a collectives table; expected columns {', '.join(need)} "
            f"(or vidur's all_reduce.csv / send_recv.csv columns)"
        )
    if kind == "vidur-network":
        median_col = next(c for c in raw.columns if _is_vidur_median(c))
        raw = raw.assign(setup=setup or path.resolve().parent.name, median_ms=raw[median_col])
    elif setup is not None:
        raw = raw[raw["setup"] == setup]
    table = _validated(raw, path, "median_ms" if kind == "infersim-collectives" else median_col)
    table.attrs["source"] = path.name
    return table


def _numbers(raw: pd.DataFrame, path: Path, column: str, source_column: str, integer: bool) -> pd.Series:
    values = pd.to_numeric(raw[column], errors="coerce")
    bad = values.isna() | ~np.isfinite(values) | (values <= 0)
    if integer:
        bad |= values.fillna(0) % 1 != 0
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        kind = "a positive integer" if integer else "a positive number"
        _fail(path, row, source_column, f"expected {kind}, got '{raw[column].iloc[row]}'")
    return values.astype(np.int64) if integer else values.astype(np.float64)


def _validated(raw: pd.DataFrame, path: Path, median_col: str) -> pd.DataFrame:
    raw = raw.reset_index(drop=True)
    ints = {c: _numbers(raw, path, c, c, integer=True) for c in INTEGER_COLUMNS}
    time_ms = _numbers(raw, path, "median_ms", median_col, integer=False)
    unknown = ~raw["collective"].isin(COLLECTIVES)
    if unknown.any():
        row = int(np.flatnonzero(unknown.to_numpy())[0])
        _fail(path, row, "collective", f"expected one of {', '.join(COLLECTIVES)}, got '{raw['collective'].iloc[row]}'")
    empty = raw["setup"].str.strip() == ""
    if empty.any():
        _fail(path, int(np.flatnonzero(empty.to_numpy())[0]), "setup", "empty")
    _check_placement(path, ints)
    table = pd.DataFrame({"setup": raw["setup"], "collective": raw["collective"], **ints, "time_s": time_ms * 1e-3})
    # vidur's tables hold one row per rank: ranks are medianed, a repeat of one rank is checked
    ranks = ["rank"] if "rank" in raw.columns else []
    _check_repeats(path, table.assign(rank=raw.get("rank")), KEY + ["max_devices_per_node", "size"] + ranks, median_col)
    table["nbytes"] = table.pop("size") * BYTES_PER_ELEMENT
    return table.groupby(KEY + ["max_devices_per_node", "nbytes"], as_index=False, sort=True)["time_s"].median()


def _check_repeats(path: Path, table: pd.DataFrame, key: list[str], column: str) -> None:
    """Refuse one measurement given twice with times more than REPEAT_RATIO apart, as `sim
    calibrate` does for kernel rows (simulator/calibration/checks.py): they cannot both be right."""
    times = table.groupby(key, sort=False)["time_s"]
    fast, slow = times.idxmin().to_numpy(), times.idxmax().to_numpy()
    ratio = table["time_s"].to_numpy()[slow] / table["time_s"].to_numpy()[fast]
    if (ratio > REPEAT_RATIO).any():
        i = int(np.flatnonzero(ratio > REPEAT_RATIO)[0])
        first, later = sorted((int(fast[i]), int(slow[i])))
        row = table.iloc[later]
        _fail(
            path,
            later,
            column,
            f"{row['time_s'] * 1e3:.4g} ms for the same {row['collective']} ({row['size']} elements, "
            f"{row['num_workers']} workers) as row {first + 1} (line {first + 2}, "
            f"{table['time_s'].iloc[first] * 1e3:.4g} ms), {ratio[i]:.3g}x apart; keep the right one",
        )


def _check_placement(path: Path, ints: dict[str, pd.Series]) -> None:
    workers, per_node, max_per_node = ints["num_workers"], ints["devices_per_node"], ints["max_devices_per_node"]
    checks = [
        (per_node > workers, "devices_per_node", "more devices per node than num_workers"),
        (workers % per_node != 0, "devices_per_node", "does not divide num_workers"),
        (per_node > max_per_node, "max_devices_per_node", "smaller than devices_per_node"),
    ]
    for bad, column, problem in checks:
        if bad.any():
            _fail(path, int(np.flatnonzero(bad.to_numpy())[0]), column, problem)


@dataclass(frozen=True)
class FitOptions:
    """How the piecewise fit chooses its size ranges."""

    max_segments: int = 4  # size ranges per fit at most
    target_mape_pct: float = 3.0  # stop adding ranges once the fit is this close
    min_rows_per_segment: int = 8  # a range rests on at least this many sizes
    candidate_edges: int = 48  # log-spaced candidate range boundaries over the measured sizes


def fit_collectives(
    table: pd.DataFrame, setup: str, *, source: str | None = None, options: FitOptions | None = None
) -> CollectivesSection:
    """Fit the `collectives:` section of one setup from a table `read_collectives_table`
    returned (or any frame with its columns). Each (collective, num_workers,
    devices_per_node) becomes a piecewise latency + size/bandwidth fit whose size ranges are
    chosen to minimise the squared relative error; `source` (default: the table's file name)
    is recorded with the section."""
    options = options or FitOptions()
    rows = table[table["setup"] == setup]
    if rows.empty:
        known = ", ".join(sorted(table["setup"].unique()))
        raise InfersimError(f"{table.attrs.get('source', 'table')}: no rows for setup '{setup}'; setups: {known}")
    origin = table.attrs.get("source", "table")
    fits: dict[str, list[CollectiveFit]] = {c: [] for c in COLLECTIVES}
    for (collective, workers, per_node), group in rows.groupby(["collective", "num_workers", "devices_per_node"]):
        where = (
            f"{origin}: setup={setup}, collective={collective}, num_workers={workers}, " f"devices_per_node={per_node}"
        )
        fits[collective].append(
            fit_one(
                group["nbytes"].to_numpy(),
                group["time_s"].to_numpy(),
                options,
                workers=int(workers),
                devices_per_node=int(per_node),
                topology=topology_of(setup, int(workers), int(per_node)),
                fitted_on=where,
            )
        )
    return CollectivesSection(
        setup=setup, max_devices_per_node=int(rows["max_devices_per_node"].max()), source=source or origin, **fits
    )


def fit_one(nbytes: np.ndarray, time_s: np.ndarray, options: FitOptions, **fields) -> CollectiveFit:
    """Piecewise fit of one collective's sizes and times (sorted by size here)."""
    order = np.argsort(nbytes, kind="stable")
    x, y = nbytes[order].astype(np.float64), time_s[order].astype(np.float64)
    cuts = _best_cuts(x, y, options)
    segments, pred = [], np.empty_like(y)
    for k, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:])):
        lat_s, inv_bw = _line(x[lo:hi], y[lo:hi])
        latency_us = round(lat_s * 1e6, 4)
        bandwidth_gbps = None if inv_bw == 0 else round(1.0 / inv_bw / 1e9, 4)
        # errors of the rounded values the profile stores, so a reloaded profile reproduces them
        pred[lo:hi] = latency_us * 1e-6 + (0.0 if bandwidth_gbps is None else x[lo:hi] / (bandwidth_gbps * 1e9))
        edge = None if hi == len(x) else round(float(np.sqrt(x[hi - 1] * x[hi])))  # between the two sizes
        segments.append(
            SizeSegment(
                max_bytes=edge,
                latency_us=latency_us,
                bandwidth_gbps=bandwidth_gbps,
                rows=hi - lo,
                mape_pct=round(_mape(pred[lo:hi], y[lo:hi]), 3),
            )
        )
    signed = (pred - y) / y * 100.0
    return CollectiveFit(
        rows=len(x),
        mape_pct=round(float(np.abs(signed).mean()), 3),
        bias_pct=round(float(signed.mean()), 3),
        segments=segments,
        **fields,
    )


def _mape(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - y) / y) * 100.0)


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """latency (s) and seconds per byte minimising the squared relative error, both >= 0:
    a negative intercept refits through the origin, a negative slope refits flat."""
    scale = x.max()
    a = np.column_stack([1.0 / y, x / scale / y])
    (lat, slope), *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
    if lat < 0:
        r = x / y
        lat, slope = 0.0, float(r.sum() / (r * r).sum()) * scale
    if slope <= 0:
        inv = 1.0 / y
        lat, slope = float(inv.sum() / (inv * inv).sum()), 0.0
    return float(lat), float(slope) / scale


def _sse(x: np.ndarray, y: np.ndarray) -> float:
    lat, inv_bw = _line(x, y)
    r = (lat + inv_bw * x - y) / y
    return float(r @ r)


def _best_cuts(x: np.ndarray, y: np.ndarray, options: FitOptions) -> list[int]:
    """Segment boundaries (indices, first 0, last len) by dynamic programming over
    log-spaced candidate boundaries: the fewest segments reaching the target error, else
    the best with max_segments."""
    n, m = len(x), options.min_rows_per_segment
    grid = np.geomspace(x[0], x[-1], options.candidate_edges)[1:-1]
    cands = sorted({0, n} | {int(i) for i in np.searchsorted(x, grid) if m <= i <= n - m})
    cost = {
        (i, j): _sse(x[a:b], y[a:b])
        for i, a in enumerate(cands)
        for j, b in enumerate(cands)
        if j > i and b - a >= min(m, n)
    }
    best: dict[tuple[int, int], tuple[float, list[int]]] = {(0, 0): (0.0, [0])}
    last = len(cands) - 1
    chosen = None
    for k in range(1, options.max_segments + 1):
        for j in range(1, last + 1):
            options_k = [
                (best[(k - 1, i)][0] + cost[(i, j)], best[(k - 1, i)][1] + [cands[j]])
                for i in range(j)
                if (k - 1, i) in best and (i, j) in cost
            ]
            if options_k:
                best[(k, j)] = min(options_k, key=lambda t: t[0])
        if (k, last) in best:
            cuts = best[(k, last)][1]
            chosen = cuts
            if _cuts_mape(x, y, cuts) <= options.target_mape_pct:
                break
    return chosen if chosen is not None else [0, n]


def _cuts_mape(x: np.ndarray, y: np.ndarray, cuts: list[int]) -> float:
    err = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        lat, inv_bw = _line(x[lo:hi], y[lo:hi])
        err.append(np.abs(lat + inv_bw * x[lo:hi] - y[lo:hi]) / y[lo:hi])
    return float(np.concatenate(err).mean() * 100.0)
