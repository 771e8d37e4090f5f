"""The kernel time models the cost model prices calibrated profiles with, as NumPy functions of
its own FLOP and byte counts. `sim calibrate` (simulator/calibration/) fits their parameters and
records them in a profile's `calibration:` section; the models themselves, and how a fitted
value is read back, live here so the cost model needs nothing of the fitting code.
their fits. The cost model (simulator/costmodel/roofline.py) and `sim calibrate` both price a
kernel through these functions, so a fitted value means the same thing in both places.

GEMM of M tokens, FLOPs per token F, bytes W + A M (weights once, activations per token):

    memory  = (W + A M) / (bandwidth x memory)
    compute = F M' / (peak x compute),  M' = M up to one tile; beyond it
              s ceil(M / tile) tile + (1 - s) ceil(M / 2 tile) 2 tile
    compute = compute x fill^-w,  fill = tiles / (waves x SMs)
    time    = launch + (memory^p + compute^p)^(1/p) + waves x wave latency

Small batches read the weights (memory-bound), large ones saturate the tensor cores
(compute-bound); between them both limit at once, which a plain max() misses by up to 30%
at 128-512 tokens and the p-norm corner follows. Past one tile, M is rounded up to the kernel's
tile of rows (the step in measured times every `tile` tokens); below it, the skinny kernels
cuBLAS picks for a few tokens do not pay for a padded tile (with padding, the fit trades it
against an impossible 99% of peak bandwidth; without, the fractions come out where achieved
bandwidth is, 77-90%, at the same held-out error). cuBLAS runs tiles of one height for some
shapes and of twice that height for others (an A100 8,192 x 8,192 projection steps every 128
tokens, Llama-3-8B's gate/up every 64), so the rounding is a fitted share s (tile_share) at the
tile and the rest at twice the tile: the average staircase of the shapes measured. The launch
floor is what a tiny GEMM costs.

Wave quantisation: the output is cut into 128 x 128 tiles (ceil(M / 128) x ceil(N / 128)) that
run in waves of one tile per SM; a last wave that fills few SMs wastes the rest. The fitted
exponent w (wave_exponent) scales compute time by fill^-w: 0 ignores waves, 1 is a single tile
shape's full wave cost. cuBLAS picks among many tile shapes and split-K, so the measured cost of
a partial wave is a fraction of one kernel's (w 0.2-0.4 on the measured cards). Each wave also
pays a fixed latency (filling and draining a tile's K-loop pipeline and writing its output),
which shows where waves are many and short: narrow outputs at large M. Without the SM count
(`sm_count` of the profile) fill is 1 and there are no waves.

Elementwise kernels (one model per kind): launch + bytes x max(1, S / M) / (bandwidth x memory)
without the cache term below.
Norms, activations, rotary and residual adds give each token's row to its own thread block, so a
batch of fewer than S tokens (S = saturation_tokens) leaves SMs idle and takes as long as S tokens
would: the small-batch floor grows with the row width (an RMSNorm of one token on the A100: 5 us at hidden
4096, 8 us at 8192), which a constant floor cannot follow. A plain activation (GELU) runs the
same pointwise kernel as the residual add and is priced by the add kind.

An elementwise kernel reads what the kernel before it wrote, so a working set that fits the L2
cache streams from the cache: its first C bytes (C = cache_mb) move at `cache_memory` of the
memory bandwidth, the rest at `memory`:

    launch + max(1, S / M) x (min(B, C) / (bandwidth x cache_memory) + max(B - C, 0) / (bandwidth x memory))

The fitted C is about half the L2 on the measured cards (A100: 19 of 40 MB for the norm, 23 for
the residual add; H100: 27 of 50; A40: 4.8 of 6), one of the two L2 partitions of the A100 and
H100; below it, norms and adds stream 1.4-2.5x faster per byte than from memory.

The embedding lookup is a row gather (PyTorch's embedding runs index_select). For at most 16
indices index_select runs its small-index kernel, in which each thread walks the indices one
after another, so its time grows by a fixed step per token whatever the row width (on the A100:
3, 4, 5, 8, 14 us at 1, 2, 4, 8, 16 tokens, then 5 us at 24); such batches are priced
gather_us + gather_us_per_token x tokens (`gather_tokens` = 16), larger ones by the model above.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..hardware.profile import ElementwiseFit, GemmFit, HardwareProfile
from ..hardware.quantization import pricing_rule
from ..models.dtypes import compute_dtype_for

MB = 2**20  # the cache size unit of the profiles

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
    tile_share: float = 1.0


@dataclass(frozen=True)
class GemmDevice:
    """What the GEMM model needs of the device: peaks and SM count (None: no wave model)."""

    peak_flops: float
    bandwidth_bytes_per_s: float
    sm_count: int | None = None


def output_waves(tokens, out_width, sm_count: int | None, groups=1.0):
    """(fill, waves) of 128 x 128 output tiles run one per SM: fill is the share of the waves'
    SM slots that hold a tile. `groups` GEMMs of the same shape in one launch (a grouped GEMM:
    the routed experts of a layer) share the waves. Without an SM count: fill 1, no waves."""
    tokens = np.asarray(tokens, dtype=np.float64)
    if not sm_count:
        return np.ones_like(tokens), np.zeros_like(tokens)
    n_tiles = np.ceil(np.maximum(np.asarray(out_width, dtype=np.float64), 1.0) / WAVE_TILE)
    tiles = np.ceil(tokens / WAVE_TILE) * n_tiles * groups
    waves = np.ceil(tiles / sm_count)
    # no rows (a batch of prefill chunks that produce no logits): no tiles, nothing to fill
    return np.where(waves > 0, tiles / np.maximum(waves, 1.0) / sm_count, 1.0), waves


def gemm_time_s(
    params: GemmParams, flops_per_token, bytes_const, bytes_per_token, tokens, out_width, device: GemmDevice, groups=1.0
):
    """Elementwise over arrays: any number of settings give the same numbers one by one. With
    `groups`, one of that many same-shape GEMMs run in one launch, which fill the SMs together
    (the group's wave latency shared among them)."""
    tokens = np.asarray(tokens, dtype=np.float64)
    tile = float(params.tile_tokens)
    memory_s = (bytes_const + bytes_per_token * tokens) / (device.bandwidth_bytes_per_s * params.memory)
    share = params.tile_share
    rounded = share * np.ceil(tokens / tile) * tile + (1.0 - share) * np.ceil(tokens / (2.0 * tile)) * 2.0 * tile
    padded = np.where(tokens <= tile, tokens, rounded)
    compute_s = flops_per_token * padded / (device.peak_flops * params.compute)
    fill, waves = output_waves(tokens, out_width, device.sm_count, groups)
    compute_s = compute_s * fill**-params.wave_exponent
    p = params.corner_exponent
    wave_s = params.wave_latency_us * 1e-6 * waves / groups
    return params.launch_us * 1e-6 + (memory_s**p + compute_s**p) ** (1.0 / p) + wave_s


@dataclass(frozen=True)
class StreamParams:
    """An elementwise kernel's streaming model (see the module docstring)."""

    memory: float
    launch_us: float
    saturation_tokens: int = 1
    cache_bytes: float = 0.0
    cache_memory: float | None = None


def elementwise_time_s(params: StreamParams, nbytes, tokens, bandwidth_bytes_per_s: float):
    """Elementwise over arrays; `tokens` are the rows of the kernel (batch tokens)."""
    occupancy = np.maximum(1.0, params.saturation_tokens / np.asarray(tokens, dtype=np.float64))
    nbytes = np.asarray(nbytes, dtype=np.float64)
    memory_s = np.maximum(nbytes - params.cache_bytes, 0.0) / (bandwidth_bytes_per_s * params.memory)
    cached_s = 0.0
    if params.cache_bytes > 0:
        cached_s = np.minimum(nbytes, params.cache_bytes) / (bandwidth_bytes_per_s * params.cache_memory)
    return params.launch_us * 1e-6 + occupancy * (cached_s + memory_s)


def stream_params(fit: ElementwiseFit) -> StreamParams:
    return StreamParams(fit.memory, fit.launch_us, fit.saturation_tokens, fit.cache_mb * MB, fit.cache_memory)


def elementwise_fit_time_s(fit: ElementwiseFit, nbytes, tokens, bandwidth_bytes_per_s: float):
    """One kernel of a fitted elementwise kind, elementwise over arrays: the streaming model,
    and the small-index gather's line for batches of at most `gather_tokens` tokens."""
    t = elementwise_time_s(stream_params(fit), nbytes, tokens, bandwidth_bytes_per_s)
    if not fit.gather_tokens:
        return t
    tokens = np.asarray(tokens, dtype=np.float64)
    gather_s = (fit.gather_us + fit.gather_us_per_token * tokens) * 1e-6
    return np.where(tokens <= fit.gather_tokens, gather_s, t)


def gemm_params(fit: GemmFit) -> GemmParams:
    """The GEMM model's parameters as a profile records them."""
    return GemmParams(
        fit.compute,
        fit.memory,
        fit.launch_us,
        fit.corner_exponent,
        fit.tile_tokens,
        fit.wave_exponent,
        fit.wave_latency_us,
        fit.tile_share,
    )


def gemm_device(hardware: HardwareProfile, dtype: str = "fp16") -> GemmDevice:
    return GemmDevice(hardware.peak_flops(dtype), hardware.memory_bandwidth_bytes_per_s(), hardware.sm_count)


def gemm_dtype_for(weight_dtype: str, hardware: HardwareProfile) -> str:
    """The tensor-core rate a model's GEMMs run at. FP8 weights run FP8 GEMMs where the card has
    FP8 tensor cores (activations quantised per token, W8A8, as vLLM and TensorRT-LLM do on Hopper
    and Ada); elsewhere vLLM runs them weight-only through FP8 Marlin at the 16-bit rate (W8A16).
    Weight-only INT8 / INT4 always compute at the activations' 16 bits."""
    if weight_dtype == "fp8" and "fp8" in hardware.peak_tflops:
        return "fp8"
    return compute_dtype_for(weight_dtype)


def weight_gemm_device(hardware: HardwareProfile, weight_dtype: str, experts: bool = False) -> GemmDevice:
    """The device a model's weight GEMMs see (`experts`: the routed experts' fused MoE): the
    peak of `gemm_dtype_for` and the memory bandwidth, each times the share the kernel vLLM runs
    for these weights on this card reaches of it (simulator/catalog/quantization.yaml: Marlin's
    dequantisation costs 10% of the 16-bit rate where compute-bound; Volta's exllama kernel
    streams weights at 0.48 of Marlin's rate)."""
    device = gemm_device(hardware, gemm_dtype_for(weight_dtype, hardware))
    rule = pricing_rule(hardware, weight_dtype, experts)
    if rule is None:
        return device
    return replace(
        device,
        peak_flops=device.peak_flops * rule.compute_share,
        bandwidth_bytes_per_s=device.bandwidth_bytes_per_s * rule.memory_share,
    )
