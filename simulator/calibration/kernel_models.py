"""The calibrated kernel time models, as NumPy functions of the cost model's own counts, and
their fits. The cost model (simulator/costmodel/roofline.py) and `sim calibrate` both price a
kernel through these functions, so a fitted value means the same thing in both places.

GEMM of M tokens, FLOPs per token F, bytes W + A M (weights once, activations per token):

    memory  = (W + A M) / (bandwidth x memory)
    compute = F M' / (peak x compute),  M' = M up to one tile, ceil(M / tile) tile beyond
    compute = compute x fill^-w,  fill = tiles / (waves x SMs)
    time    = launch + (memory^p + compute^p)^(1/p) + waves x wave latency

Small batches read the weights (memory-bound), large ones saturate the tensor cores
(compute-bound); between them both limit at once, which a plain max() misses by up to 30%
at 128-512 tokens and the p-norm corner follows. Past one tile, M is rounded up to the kernel's
tile of rows (the step in measured times every `tile` tokens); below it, the skinny kernels
cuBLAS picks for a few tokens do not pay for a padded tile (with padding, the fit trades it
against an impossible 99% of peak bandwidth; without, the fractions come out where achieved
bandwidth is, 77-90%, at the same held-out error). The launch floor is what a tiny GEMM costs.

Wave quantisation: the output is cut into 128 x 128 tiles (ceil(M / 128) x ceil(N / 128)) that
run in waves of one tile per SM; a last wave that fills few SMs wastes the rest. The fitted
exponent w (wave_exponent) scales compute time by fill^-w: 0 ignores waves, 1 is a single tile
shape's full wave cost. cuBLAS picks among many tile shapes and split-K, so the measured cost of
a partial wave is a fraction of one kernel's (w 0.2-0.4 on the measured cards). Each wave also
pays a fixed latency (filling and draining a tile's K-loop pipeline and writing its output),
which shows where waves are many and short: narrow outputs at large M. Without the SM count
(`sm_count` of the profile) fill is 1 and there are no waves.

Elementwise kernels (one model per kind): launch + bytes x max(1, S / M) / (bandwidth x memory).
Norms, activations, rotary and residual adds give each token's row to its own thread block, so a
batch of fewer than S tokens (S = saturation_tokens) leaves SMs idle and takes as long as S tokens
would: the small-batch floor grows with the row width (an RMSNorm of one token on the A100: 5 us at hidden
4096, 8 us at 8192), which a constant floor cannot follow.

Fits minimise squared log error (every row weighs the same, whatever its size) with
scipy.optimize.least_squares from fixed starting points: deterministic for a given table."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

TILE_CANDIDATES = (1, 16, 32, 64, 128)
WAVE_TILE = 128  # rows and columns of the output tile the wave count assumes


@dataclass(frozen=True)
class GemmParams:
    compute: float
    memory: float
    launch_us: float
    corner_exponent: float
    tile_tokens: int
    wave_exponent: float = 0.0
    wave_latency_us: float = 0.0


@dataclass(frozen=True)
class GemmDevice:
    """What the GEMM model needs of the device: peaks and SM count (None: no wave model)."""
    peak_flops: float
    bandwidth_bytes_per_s: float
    sm_count: int | None = None


def output_waves(tokens, out_width, sm_count: int | None):
    """(fill, waves) of 128 x 128 output tiles run one per SM: fill is the share of the waves'
    SM slots that hold a tile. Without an SM count: fill 1, no waves."""
    tokens = np.asarray(tokens, dtype=np.float64)
    if not sm_count:
        return np.ones_like(tokens), np.zeros_like(tokens)
    n_tiles = np.ceil(np.maximum(np.asarray(out_width, dtype=np.float64), 1.0) / WAVE_TILE)
    tiles = np.ceil(tokens / WAVE_TILE) * n_tiles
    waves = np.ceil(tiles / sm_count)
    return tiles / (waves * sm_count), waves


def gemm_time_s(params: GemmParams, flops_per_token, bytes_const, bytes_per_token, tokens, out_width,
                device: GemmDevice):
    """Elementwise over arrays: any number of settings give the same numbers one by one."""
    tokens = np.asarray(tokens, dtype=np.float64)
    tile = float(params.tile_tokens)
    memory_s = (bytes_const + bytes_per_token * tokens) / (device.bandwidth_bytes_per_s * params.memory)
    padded = np.where(tokens <= tile, tokens, np.ceil(tokens / tile) * tile)
    compute_s = flops_per_token * padded / (device.peak_flops * params.compute)
    fill, waves = output_waves(tokens, out_width, device.sm_count)
    compute_s = compute_s * fill ** -params.wave_exponent
    p = params.corner_exponent
    return (params.launch_us * 1e-6 + (memory_s ** p + compute_s ** p) ** (1.0 / p)
            + params.wave_latency_us * 1e-6 * waves)


SATURATION_CANDIDATES = tuple(sorted({round(2 ** (i / 4)) for i in range(45)}))  # 1 to 2048 tokens, 4 per octave


def elementwise_time_s(memory: float, launch_us: float, nbytes, tokens, bandwidth_bytes_per_s: float,
                       saturation_tokens: int = 1):
    """Elementwise over arrays; `tokens` are the rows of the kernel (batch tokens)."""
    occupancy = np.maximum(1.0, saturation_tokens / np.asarray(tokens, dtype=np.float64))
    return launch_us * 1e-6 + np.asarray(nbytes, dtype=np.float64) * occupancy / (bandwidth_bytes_per_s * memory)


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
    return GemmParams(float(np.exp(x[0])), float(np.exp(x[1])), float(x[2]), float(1.0 + np.exp(x[3])), int(tile),
                      float(x[4]), float(x[5]))


def fit_gemm(samples: GemmSamples, device: GemmDevice) -> GemmParams:
    """Best (compute, memory, launch, corner, wave exponent, wave latency) for each candidate
    tile; the tile that fits best. Without an SM count both wave terms stay 0."""
    from scipy.optimize import least_squares

    s = samples
    log_t = np.log(s.time_s)
    sw = np.sqrt(octave_weights(s.tokens))
    floor_us = float(np.min(s.time_s)) * 1e6
    best = None
    for tile in TILE_CANDIDATES:
        def resid(x):
            pred = gemm_time_s(_params(x, tile), s.flops_per_token, s.bytes_const, s.bytes_per_token, s.tokens,
                               s.out_width, device)
            return (np.log(pred) - log_t) * sw

        waves = bool(device.sm_count)
        x0 = np.array([np.log(0.7), np.log(0.8), 0.5 * floor_us, 0.0, 0.2 if waves else 0.0, 0.1 * floor_us if waves else 0.0])
        lo = np.array([np.log(0.05), np.log(0.05), 0.0, np.log(1e-3), 0.0, 0.0])
        hi = np.array([np.log(1.5), np.log(1.5), max(floor_us, 1e-3), np.log(19.0), 1.5 if waves else 1e-12,
                       max(floor_us, 1e-3) if waves else 1e-12])
        res = least_squares(resid, x0, bounds=(lo, hi),
                            x_scale=np.array([1.0, 1.0, max(floor_us, 1.0), 1.0, 1.0, max(floor_us, 1.0)]))
        cost = float(np.mean(res.fun ** 2))
        if best is None or cost < best[0] - 1e-12:
            best = (cost, _params(res.x, tile))
    best_params = best[1]
    if not device.sm_count:
        best_params = GemmParams(**{**best_params.__dict__, "wave_exponent": 0.0, "wave_latency_us": 0.0})
    return best_params


@dataclass(frozen=True)
class ElementwiseParams:
    memory: float
    launch_us: float
    saturation_tokens: int


def _fit_launch_rate(nbytes: np.ndarray, t: np.ndarray) -> tuple[float, float, float]:
    """(launch s, s per byte, residual) of t = launch + bytes x rate, least squares in relative
    error with both terms non-negative."""
    from scipy.optimize import nnls

    (launch_s, inv_rate), resid = nnls(np.column_stack([1.0 / t, nbytes / t]), np.ones_like(t))
    return float(launch_s), float(inv_rate), float(resid)


def fit_elementwise(nbytes: np.ndarray, tokens: np.ndarray, time_s: np.ndarray,
                    bandwidth_bytes_per_s: float) -> ElementwiseParams:
    """(memory fraction, launch us, saturation tokens): for each candidate S, the least-squares
    launch and rate; the S with the smallest relative error (the first on ties: deterministic)."""
    nbytes = np.asarray(nbytes, dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.float64)
    t = np.asarray(time_s, dtype=np.float64)
    best = None
    for s in SATURATION_CANDIDATES:
        launch_s, inv_rate, resid = _fit_launch_rate(nbytes * np.maximum(1.0, s / tokens), t)
        if inv_rate > 0 and (best is None or resid < best[0] - 1e-12):
            best = (resid, launch_s, inv_rate, s)
    if best is None:  # every row at the floor: no bandwidth information; the fastest row's rate
        return ElementwiseParams(float(min(1.0 / (float(np.min(t / nbytes)) * bandwidth_bytes_per_s), 3.0)), 0.0, 1)
    _, launch_s, inv_rate, s = best
    memory = 1.0 / (inv_rate * bandwidth_bytes_per_s)
    return ElementwiseParams(float(min(memory, 3.0)), launch_s * 1e6, int(s))


def errors_pct(pred, measured) -> tuple[float, float]:
    """(MAPE, signed bias), percent."""
    rel = (np.asarray(pred) - np.asarray(measured)) / np.asarray(measured)
    return float(np.mean(np.abs(rel)) * 100.0), float(np.mean(rel) * 100.0)
