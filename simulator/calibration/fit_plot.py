"""`sim calibrate --plot`: how well the fitted kernel models follow the measured rows, one panel
per kernel kind: predicted / measured against the batch's token count, with the +-5% and +-10%
bands. The GEMM panel shows the fitted model alone and, where the profile ships measured
shapes, the corrected model beside it; the MAPE in each title is the one the profile records."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..costmodel.measured_gemms import MeasuredGemms
from ..hardware.profile import HardwareProfile
from ..metrics.plots import REPRODUCIBLE_PNG, finish_figure, pyplot
from .fit import predict_rows, table_correction
from .kernel_models import errors_pct
from .rows import KernelRow

BANDS = (0.05, 0.10)  # relative error lines drawn on every panel


@dataclass(frozen=True)
class FitSeries:
    """One panel's points: tokens, predicted / measured, and the series' MAPE in percent."""

    title: str
    tokens: np.ndarray
    ratio: np.ndarray
    mape_pct: float


def fit_series(rows: list[KernelRow], profile: HardwareProfile, table: MeasuredGemms | None) -> list[FitSeries]:
    """The panels of a calibrated profile on the rows it was fitted on (kinds in the profile's
    order: GEMM, GEMM with measured shapes, then each elementwise kind)."""
    cal = profile.calibration
    out = []
    kinds = np.array([r.kernel for r in rows])
    tokens = np.array([r.tokens for r in rows], dtype=np.float64)
    measured = np.array([r.time_s for r in rows])
    plain = predict_rows(cal, rows, profile)
    if cal.gemm is not None:
        gemm = kinds == "gemm"
        out.append(_series("GEMM (fitted model)", tokens[gemm], plain[gemm], measured[gemm]))
        if table is not None:
            corr = table_correction(cal.gemm, table, profile, width=cal.gemm.measured_shapes.k_width_octaves)
            g_rows = [r for r in rows if r.kernel == "gemm"]
            corrected = predict_rows(cal, g_rows, profile, correction=corr)
            out.append(_series("GEMM (measured shapes)", tokens[gemm], corrected, measured[gemm]))
    for kind in cal.elementwise:
        m = kinds == kind
        out.append(_series(kind, tokens[m], plain[m], measured[m]))
    return out


def _series(title: str, tokens, predicted, measured) -> FitSeries:
    mape, _ = errors_pct(predicted, measured)
    return FitSeries(title, tokens, np.asarray(predicted) / np.asarray(measured), mape)


def plot_fit(
    series: list[FitSeries], path: Path, device_name: str, what: str = "calibrated kernel models on their measured rows"
) -> Path:
    """One panel per series, three to a row, written atomically to `path` (PNG or SVG)."""
    plt = pyplot()
    cols = min(3, len(series))
    rows = -(-len(series) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False, sharey=True)
    for ax, s in zip(axes.flat, series):
        ax.scatter(s.tokens, s.ratio, s=4, alpha=0.35, linewidths=0)
        ax.axhline(1.0, color="black", linewidth=0.8)
        for band, style in zip(BANDS, ("--", ":")):
            for side in (1 - band, 1 + band):
                ax.axhline(side, color="grey", linewidth=0.8, linestyle=style)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{s.title}: MAPE {s.mape_pct:.1f}%", fontsize=10)
        ax.set_xlabel("tokens in the batch")
    for ax in axes[:, 0]:
        ax.set_ylabel("predicted / measured")
    for ax in list(axes.flat)[len(series) :]:
        ax.set_visible(False)
    fig.suptitle(f"{device_name}: {what} (dashed +-5%, dotted +-10%)")
    return finish_figure(fig, path, **(REPRODUCIBLE_PNG if Path(path).suffix.lower() == ".png" else {}))
