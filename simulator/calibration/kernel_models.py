"""Fitting the calibrated kernel time models (simulator/costmodel/kernel_times.py, where the
models and their formulas are described) to measured rows.

Fits minimise squared log error (every row weighs the same, whatever its size) with
scipy.optimize.least_squares from fixed starting points: deterministic for a given table."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares, nnls

from ..costmodel.kernel_times import GemmDevice, GemmParams, gemm_time_s

TILE_CANDIDATES = (1, 16, 32, 64, 128)


SATURATION_CANDIDATES = tuple(sorted({round(2 ** (i / 4)) for i in range(45)}))  # 1 to 2048 tokens, 4 per octave


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


def _fit_launch_rate(nbytes: np.ndarray, t: np.ndarray, kernels: np.ndarray) -> tuple[float, float, float]:
    """(launch s, s per byte, residual) of t = kernels x (launch + bytes x rate), least squares in
    relative error with both terms non-negative."""
    (launch_s, inv_rate), resid = nnls(np.column_stack([kernels / t, kernels * nbytes / t]), np.ones_like(t))
    return float(launch_s), float(inv_rate), float(resid)


def fit_elementwise(
    nbytes: np.ndarray,
    tokens: np.ndarray,
    time_s: np.ndarray,
    bandwidth_bytes_per_s: float,
    kernels=None,
    gather_tokens: int | None = None,
) -> ElementwiseParams:
    """(memory fraction, launch us, saturation tokens): for each candidate S, the least-squares
    launch and rate; the S with the smallest relative error (the first on ties: deterministic).
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
            return ElementwiseParams(
                p.memory, p.launch_us, p.saturation_tokens, gather_tokens, gather_s * 1e6, per_token_s * 1e6
            )
    best = None
    for s in SATURATION_CANDIDATES:
        launch_s, inv_rate, resid = _fit_launch_rate(nbytes * np.maximum(1.0, s / tokens), t, kernels)
        if inv_rate > 0 and (best is None or resid < best[0] - 1e-12):
            best = (resid, launch_s, inv_rate, s)
    if best is None:  # every row at the floor: no bandwidth information; the fastest row's rate
        rate = float(np.min(t / (kernels * nbytes)))
        return ElementwiseParams(float(min(1.0 / (rate * bandwidth_bytes_per_s), 3.0)), 0.0, 1)
    _, launch_s, inv_rate, s = best
    memory = 1.0 / (inv_rate * bandwidth_bytes_per_s)
    return ElementwiseParams(float(min(memory, 3.0)), launch_s * 1e6, int(s))


def _fit_gather(tokens: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(fixed s, s per token) of t = fixed + tokens x per token, least squares in relative error,
    both non-negative."""
    (fixed_s, per_token_s), _ = nnls(np.column_stack([1.0 / t, tokens / t]), np.ones_like(t))
    return float(fixed_s), float(per_token_s)


def errors_pct(pred, measured) -> tuple[float, float]:
    """(MAPE, signed bias), percent."""
    rel = (np.asarray(pred) - np.asarray(measured)) / np.asarray(measured)
    return float(np.mean(np.abs(rel)) * 100.0), float(np.mean(rel) * 100.0)
