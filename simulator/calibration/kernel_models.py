"""Fitting the calibrated kernel time models (simulator/costmodel/kernel_times.py, where the
models and their formulas are described) to measured rows.

Fits minimise squared log error (every row weighs the same, whatever its size) with
scipy.optimize.least_squares from fixed starting points: deterministic for a given table."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares, nnls

from ..costmodel.kernel_times import MB, GemmDevice, GemmParams, gemm_time_s

TILE_CANDIDATES = (1, 16, 32, 64, 128)


SATURATION_CANDIDATES = tuple(sorted({round(2 ** (i / 4)) for i in range(45)}))  # 1 to 2048 tokens, 4 per octave
# cached working sets tried, MB: none, then 256 kB to 256 MB, 4 per octave (first-level caches of
# CPUs to the largest GPU L2)
CACHE_MB_CANDIDATES = (0.0,) + tuple(float(2 ** (i / 4)) for i in range(-8, 33))
MAX_CACHE_MEMORY = 20.0


def octave_weights(tokens) -> np.ndarray:
    """Row weights that give every octave of token counts the same total weight: measured
    sweeps are dense at large batches (steps of 256 up to 32k) and sparse at small ones, and
    an unweighted fit would trade the decode range away for them."""
    octave = np.floor(np.log2(np.asarray(tokens, dtype=np.float64)))
    _, inverse, counts = np.unique(octave, return_inverse=True, return_counts=True)
    w = 1.0 / counts[inverse]
    return w / w.mean()


@dataclass(frozen=True)
class GemmSamples:
    flops_per_token: np.ndarray
    bytes_const: np.ndarray
    bytes_per_token: np.ndarray
    tokens: np.ndarray
    time_s: np.ndarray
    out_width: np.ndarray


def _params(x, tile: int) -> GemmParams:
    return GemmParams(
        float(np.exp(x[0])),
        float(np.exp(x[1])),
        float(x[2]),
        float(1.0 + np.exp(x[3])),
        int(tile),
        float(x[4]),
        float(x[5]),
        float(x[6]),
    )


def fit_gemm(samples: GemmSamples, device: GemmDevice) -> GemmParams:
    """Best (compute, memory, launch, corner, wave exponent, wave latency, tile share) for each
    candidate tile; the tile that fits best. Without an SM count both wave terms stay 0."""
    s = samples
    log_t = np.log(s.time_s)
    sw = np.sqrt(octave_weights(s.tokens))
    floor_us = float(np.min(s.time_s)) * 1e6
    best = None
    for tile in TILE_CANDIDATES:

        def resid(x):
            pred = gemm_time_s(
                _params(x, tile), s.flops_per_token, s.bytes_const, s.bytes_per_token, s.tokens, s.out_width, device
            )
            return (np.log(pred) - log_t) * sw

        waves = bool(device.sm_count)
        x0 = np.array(
            [
                np.log(0.7),
                np.log(0.8),
                0.5 * floor_us,
                0.0,
                0.2 if waves else 0.0,
                0.1 * floor_us if waves else 0.0,
                0.75,
            ]
        )
        lo = np.array([np.log(0.05), np.log(0.05), 0.0, np.log(1e-3), 0.0, 0.0, 0.0])
        hi = np.array(
            [
                np.log(1.5),
                np.log(1.5),
                max(floor_us, 1e-3),
                np.log(19.0),
                1.5 if waves else 1e-12,
                max(floor_us, 1e-3) if waves else 1e-12,
                1.0,
            ]
        )
        res = least_squares(
            resid,
            x0,
            bounds=(lo, hi),
            x_scale=np.array([1.0, 1.0, max(floor_us, 1.0), 1.0, 1.0, max(floor_us, 1.0), 1.0]),
        )
        cost = float(np.mean(res.fun**2))
        if best is None or cost < best[0] - 1e-12:
            best = (cost, _params(res.x, tile))
    best_params = best[1]
    if not device.sm_count:
        best_params = GemmParams(**{**best_params.__dict__, "wave_exponent": 0.0, "wave_latency_us": 0.0})
    return best_params


# Kinds whose small batches run a serial gather: the embedding lookup is PyTorch's index_select,
# whose small-index kernel (at most 16 indices) walks the indices one after another in each thread.
GATHER_TOKENS = {"emb": 16}
MIN_GATHER_ROWS = 2  # on each side of gather_tokens, else the kind keeps the plain model


@dataclass(frozen=True)
class ElementwiseParams:
    memory: float
    launch_us: float
    saturation_tokens: int
    gather_tokens: int | None = None
    gather_us: float | None = None
    gather_us_per_token: float | None = None
    cache_mb: float = 0.0
    cache_memory: float | None = None


@dataclass(frozen=True)
class _StreamFit:
    launch_s: float
    s_per_byte: float  # from memory
    cached_s_per_byte: float  # from the cache (the first cache bytes)
    resid: float


def _fit_launch_rate(
    nbytes: np.ndarray, occupancy: np.ndarray, t: np.ndarray, kernels: np.ndarray, cache_bytes: float
) -> _StreamFit:
    """t = kernels x (launch + occupancy x (cached rate x bytes + extra x max(bytes - cache, 0))),
    least squares in relative error, every term non-negative (so the cache is never slower than
    memory: memory's rate is cached rate + extra)."""
    cols = [kernels / t, kernels * occupancy * nbytes / t]
    if cache_bytes > 0:
        cols.append(kernels * occupancy * np.maximum(nbytes - cache_bytes, 0.0) / t)
    x, resid = nnls(np.column_stack(cols), np.ones_like(t))
    extra = float(x[2]) if cache_bytes > 0 else 0.0
    return _StreamFit(float(x[0]), float(x[1]) + extra, float(x[1]), float(resid))


def fit_elementwise(
    nbytes: np.ndarray,
    tokens: np.ndarray,
    time_s: np.ndarray,
    bandwidth_bytes_per_s: float,
    kernels=None,
    gather_tokens: int | None = None,
) -> ElementwiseParams:
    """(memory fraction, launch us, saturation tokens, cached working set and its bandwidth
    fraction): for each candidate S and cache size, the least-squares launch and rates; the pair
    with the smallest relative error (the first on ties, so no cache unless it fits better:
    deterministic).
    `kernels`: launches each time spans, each moving `nbytes` (default one). With
    `gather_tokens`, rows of at most that many tokens fit the gather's line instead (when both
    sides have rows)."""
    nbytes = np.asarray(nbytes, dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.float64)
    t = np.asarray(time_s, dtype=np.float64)
    kernels = np.ones_like(t) if kernels is None else np.asarray(kernels, dtype=np.float64)
    if gather_tokens:
        small = tokens <= gather_tokens
        if MIN_GATHER_ROWS <= small.sum() and MIN_GATHER_ROWS <= (~small).sum():
            p = fit_elementwise(nbytes[~small], tokens[~small], t[~small], bandwidth_bytes_per_s, kernels[~small])
            gather_s, per_token_s = _fit_gather(tokens[small], t[small] / kernels[small])
            return replace(
                p, gather_tokens=gather_tokens, gather_us=gather_s * 1e6, gather_us_per_token=per_token_s * 1e6
            )
    best = None
    for s in SATURATION_CANDIDATES:
        occupancy = np.maximum(1.0, s / tokens)
        for cache_mb in CACHE_MB_CANDIDATES:
            f = _fit_launch_rate(nbytes, occupancy, t, kernels, cache_mb * MB)
            if f.s_per_byte > 0 and (best is None or f.resid < best[0].resid - 1e-12):
                best = (f, s, cache_mb)
    if best is None:  # every row at the floor: no bandwidth information; the fastest row's rate
        rate = float(np.min(t / (kernels * nbytes)))
        return ElementwiseParams(float(min(1.0 / (rate * bandwidth_bytes_per_s), 3.0)), 0.0, 1)
    f, s, cache_mb = best
    memory = min(1.0 / (f.s_per_byte * bandwidth_bytes_per_s), 3.0)
    if cache_mb == 0 or f.cached_s_per_byte >= f.s_per_byte:  # no faster cache found
        return ElementwiseParams(float(memory), f.launch_s * 1e6, int(s))
    cached = 1.0 / (f.cached_s_per_byte * bandwidth_bytes_per_s) if f.cached_s_per_byte > 0 else MAX_CACHE_MEMORY
    return ElementwiseParams(
        float(memory), f.launch_s * 1e6, int(s), cache_mb=cache_mb, cache_memory=float(min(cached, MAX_CACHE_MEMORY))
    )


def _fit_gather(tokens: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(fixed s, s per token) of t = fixed + tokens x per token, least squares in relative error,
    both non-negative."""
    (fixed_s, per_token_s), _ = nnls(np.column_stack([1.0 / t, tokens / t]), np.ones_like(t))
    return float(fixed_s), float(per_token_s)


def errors_pct(pred, measured) -> tuple[float, float]:
    """(MAPE, signed bias), percent."""
    rel = (np.asarray(pred) - np.asarray(measured)) / np.asarray(measured)
    return float(np.mean(np.abs(rel)) * 100.0), float(np.mean(rel) * 100.0)
