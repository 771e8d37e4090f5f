"""Measured GEMM shapes: the calibrated GEMM model corrected, shape by shape, by the medians a
device's tables measured.

The fitted GEMM model (kernel_times.gemm_time_s) follows the average staircase of cuBLAS's
kernel choices; each shape has its own (an A100 8,192 x 8,192 projection steps every 128
tokens, a 28,672-wide one every 64; on the H100 an 8,192-wide output runs 17-30% slower than
the average from 520 to 640 tokens). The staircase is a property of the output width N, the
inner size K and the token count M, and it repeats: the same shape measured for two models
agrees within 0.4-3%. So where a device's tables measured GEMMs of the same N at the same or
a nearby K, the model's time is scaled by their measured/model ratio at that token count:

    ratio(N, K, M) = exp(max_j w_j x sum_j w_j r_j(M) / sum_j w_j),
    w_j = exp(-(log2(K_j / K))^2 / (2 s^2))

over the measured shapes j of width N (s = `k_width_octaves`), r_j(M) the log ratio at the
smallest measured token count >= M (the next grid point shares M's tile). Scaling by the
largest weight lets the correction fade as K moves away from every measured shape; a GEMM of
a width no table measured, or past the largest measured token count, keeps the model's time.

The measured medians are data (a CSV beside the profile, with its source); the ratios are
computed against the profile's own fitted model when it loads, so they always match it."""

from __future__ import annotations

import gzip
import io
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import InfersimError
from ..hardware.profile import GemmFit
from ..models.dtypes import bytes_per_element
from ..yamlio import write_atomic
from .kernel_times import GemmDevice, GemmParams, gemm_params, gemm_time_s

COLUMNS = ("n", "k", "tokens", "time_us")
# how far a measured K carries: chosen by leave-one-model-out on the shipped tables (0.2 and 0.3
# octave score alike; 1 octave and wider borrow staircases that do not carry)
K_WIDTH_OCTAVES = 0.25


@dataclass(frozen=True)
class MeasuredGemms:
    """Median measured time of each GEMM shape of one device (fp16): output width n, inner
    size k, tokens, seconds; one row per shape, sorted by (n, k, tokens)."""

    n: np.ndarray
    k: np.ndarray
    tokens: np.ndarray
    time_s: np.ndarray

    @classmethod
    def from_arrays(cls, n, k, tokens, time_s) -> "MeasuredGemms":
        """The median of each shape's measurements (a shape measured for several models or
        operators appears once)."""
        df = pd.DataFrame({"n": np.rint(n), "k": np.rint(k), "tokens": np.rint(tokens), "time_s": time_s})
        g = df.groupby(["n", "k", "tokens"], sort=True).time_s.median().reset_index()
        return cls(*(g[c].to_numpy(dtype=np.float64) for c in ("n", "k", "tokens", "time_s")))

    def __len__(self) -> int:
        return len(self.n)

    def to_csv_bytes(self, source: str, dtype: str = "fp16") -> bytes:
        """Gzipped CSV (mtime 0: the same table gives the same bytes) under a comment naming
        the source."""
        buf = io.StringIO()
        buf.write(f"# measured GEMM medians ({dtype}): {source}\n")
        pd.DataFrame(
            {
                "n": self.n.astype(np.int64),
                "k": self.k.astype(np.int64),
                "tokens": self.tokens.astype(np.int64),
                "time_us": np.round(self.time_s * 1e6, 4),
            }
        ).to_csv(buf, index=False)
        out = io.BytesIO()
        with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as fh:
            fh.write(buf.getvalue().encode())
        return out.getvalue()

    def write(self, path: Path, source: str, dtype: str = "fp16") -> None:
        write_atomic(path, self.to_csv_bytes(source, dtype))

    @classmethod
    def read(cls, path: Path) -> "MeasuredGemms":
        try:
            df = pd.read_csv(path, comment="#")
        except (OSError, ValueError, EOFError) as exc:
            raise InfersimError(f"{path}: cannot read the measured GEMM table ({exc.__class__.__name__})") from None
        missing = [c for c in COLUMNS if c not in df.columns]
        if missing:
            raise InfersimError(f"{path}: column '{missing[0]}' missing (expected {', '.join(COLUMNS)})")
        values = df[list(COLUMNS)].to_numpy(dtype=np.float64)
        bad = ~np.isfinite(values) | (values <= 0)
        if bad.any():
            row, col = np.argwhere(bad)[0]
            raise InfersimError(f"{path}: data row {row + 1}, column '{COLUMNS[col]}': expected a positive number")
        return cls.from_arrays(values[:, 0], values[:, 1], values[:, 2], values[:, 3] * 1e-6)


class ShapeCorrection:
    """Per (N, K): the token grid and the ratio measured/model on it (see the module)."""

    def __init__(
        self,
        measured: MeasuredGemms,
        params: GemmParams,
        device: GemmDevice,
        k_width_octaves: float,
        element_bytes: float = 2.0,
    ):
        m, b = measured, element_bytes
        model = gemm_time_s(params, 2.0 * m.n * m.k, b * m.n * m.k, b * (m.n + m.k), m.tokens, m.n, device)
        log_ratio = np.log(m.time_s / model)
        self._width = float(k_width_octaves)
        self._by_n: dict[float, list[tuple[float, np.ndarray, np.ndarray]]] = {}
        keys = np.stack([m.n, m.k], axis=1)
        starts = np.flatnonzero(np.r_[True, np.any(keys[1:] != keys[:-1], axis=1)])
        for lo, hi in zip(starts, np.r_[starts[1:], len(m)]):
            self._by_n.setdefault(float(m.n[lo]), []).append((float(m.k[lo]), m.tokens[lo:hi], log_ratio[lo:hi]))
        self._curves: dict[tuple[float, float], tuple[np.ndarray, np.ndarray] | None] = {}

    def curve(self, n: float, k: float) -> tuple[np.ndarray, np.ndarray] | None:
        """(token grid, ratio at each grid point and 1 after the last) of a GEMM of width n and
        inner size k; None if no measured shape of width n is near k."""
        key = (float(round(n)), float(round(k)))
        if key not in self._curves:
            self._curves[key] = self._build(*key)
        return self._curves[key]

    def _build(self, n: float, k: float):
        shapes = self._by_n.get(n)
        if not shapes:
            return None
        weights = np.array([np.exp(-0.5 * (np.log2(kj / k) / self._width) ** 2) for kj, _, _ in shapes])
        if weights.max() < 1e-3:  # every measured K about an octave away or more
            return None
        grid = np.unique(np.concatenate([t for _, t, _ in shapes]))
        num, den, top = np.zeros_like(grid), np.zeros_like(grid), np.zeros_like(grid)
        for w, (_, tokens, lr) in zip(weights, shapes):
            idx = np.searchsorted(tokens, grid, side="left")  # the curve's grid point >= each token count
            ok = idx < len(tokens)
            r = lr[np.minimum(idx, len(tokens) - 1)]
            num += np.where(ok, w * r, 0.0)
            den += np.where(ok, w, 0.0)
            top = np.maximum(top, np.where(ok, w, 0.0))
        ratio = np.exp(np.where(den > 0, num / np.maximum(den, 1e-300) * top, 0.0))
        return grid, np.append(ratio, 1.0)  # past the last grid point: the model's own time

    def factor(self, n: float, k: float, tokens) -> np.ndarray:
        """Multiplier of the model's time, elementwise over token counts."""
        tokens = np.asarray(tokens, dtype=np.float64)
        c = self.curve(n, k)
        if c is None:
            return np.ones_like(tokens)
        return ratio_on(c, tokens)

    def factors(self, n, k, tokens) -> np.ndarray:
        """Multipliers of GEMMs of many shapes, elementwise over (n, k, tokens)."""
        tokens = np.asarray(tokens, dtype=np.float64)
        keys, inverse = np.unique(np.stack([np.rint(n), np.rint(k)], axis=1), axis=0, return_inverse=True)
        out = np.ones_like(tokens)
        for i, (ni, ki) in enumerate(keys):
            sel = inverse.ravel() == i
            out[sel] = self.factor(ni, ki, tokens[sel])
        return out


def gemm_inner_size(flops_per_token, out_width):
    """K of a GEMM from its FLOPs per token (2 K N) and its output width N."""
    return np.asarray(flops_per_token, dtype=np.float64) / (2.0 * np.asarray(out_width, dtype=np.float64))


def ratio_on(curve: tuple[np.ndarray, np.ndarray], tokens: np.ndarray) -> np.ndarray:
    """The multiplier at each token count (1 for none, or past the measured grid)."""
    grid, ratio = curve
    return np.where(tokens > 0, ratio[np.searchsorted(grid, tokens, side="left")], 1.0)


def shape_correction(fit: GemmFit | None, device: GemmDevice, dtype: str) -> ShapeCorrection | None:
    """The correction of a profile's GEMM fit for GEMMs of `dtype` (None without measured
    shapes, or when they timed another dtype's kernels); built once per table, fit and device."""
    shapes = fit.measured_shapes if fit is not None else None
    if shapes is None or not same_gemm_kernels(dtype, shapes.dtype):
        return None
    path = Path(shapes.file)
    try:
        stat = path.stat()
    except OSError:
        raise InfersimError(f"{path}: measured GEMM table not found") from None
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    return _correction(key, gemm_params(fit), device, shapes.k_width_octaves, bytes_per_element(shapes.dtype))


@lru_cache(maxsize=16)
def _correction(key: tuple, params: GemmParams, device: GemmDevice, width: float, element_bytes: float):
    return ShapeCorrection(MeasuredGemms.read(Path(key[0])), params, device, width, element_bytes)


def same_gemm_kernels(dtype: str, measured_dtype: str) -> bool:
    """Whether GEMMs of `dtype` run the kernels a table of `measured_dtype` timed: the same
    dtype, or fp16 and bf16 (the same tensor-core kernels at the same rate)."""
    half = ("fp16", "bf16")
    return dtype == measured_dtype or (dtype in half and measured_dtype in half)
