"""Measured kernel rows -> the `calibration:` section of a hardware profile, and the
predictions of a profile for measured rows (used to record fit errors and by the
leave-one-model-out benchmark). One path for every source of measurements: the shared GPU
tables, vidur's mlp.csv, generic CSVs and `sim profile`'s own micro-benchmarks all arrive
here as KernelRows."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..costmodel.kernel_times import elementwise_fit_time_s, gemm_device, gemm_params, gemm_time_s
from ..costmodel.measured_gemms import K_WIDTH_OCTAVES, MeasuredGemms, ShapeCorrection, gemm_inner_size
from ..errors import InfersimError
from ..hardware.profile import Calibration, ElementwiseFit, GemmFit, HardwareProfile, MeasuredShapes
from ..models.dtypes import bytes_per_element, normalize_dtype
from .kernel_models import GATHER_TOKENS, GemmSamples, errors_pct, fit_elementwise, fit_gemm
from .rows import KernelRow

MIN_GEMM_ROWS = 8
MIN_ELEMENTWISE_ROWS = 2


def _rates(hardware: HardwareProfile, dtype: str) -> tuple[float, float]:
    return hardware.peak_flops(dtype), hardware.memory_bandwidth_bytes_per_s()


def _gemm_samples(rows: list[KernelRow]) -> GemmSamples:
    col = lambda name: np.array([getattr(r, name) for r in rows], dtype=np.float64)  # noqa: E731
    return GemmSamples(
        col("flops_per_token"),
        col("bytes_const"),
        col("bytes_per_token"),
        col("tokens"),
        col("time_s"),
        col("out_width"),
    )


def measured_gemms(rows: list[KernelRow]) -> MeasuredGemms:
    """The GEMM rows' medians by shape (n, k, tokens)."""
    g = [r for r in rows if r.kernel == "gemm"]
    n = np.array([r.out_width for r in g])
    k = gemm_inner_size([r.flops_per_token for r in g], n)
    return MeasuredGemms.from_arrays(n, k, [r.tokens for r in g], [r.time_s for r in g])


def predict_rows(
    calibration: Calibration,
    rows: list[KernelRow],
    hardware: HardwareProfile,
    dtype: str = "fp16",
    correction: ShapeCorrection | None = None,
) -> np.ndarray:
    """Predicted seconds of each row under a calibration (NaN where it has no model); GEMMs
    scaled by `correction` (measured shapes) when given."""
    peak, bw = _rates(hardware, dtype)
    out = np.full(len(rows), np.nan)
    for kernel in sorted({r.kernel for r in rows}):
        idx = [j for j, r in enumerate(rows) if r.kernel == kernel]
        sub = [rows[j] for j in idx]
        if kernel == "gemm" and calibration.gemm is not None:
            s = _gemm_samples(sub)
            t = gemm_time_s(
                gemm_params(calibration.gemm),
                s.flops_per_token,
                s.bytes_const,
                s.bytes_per_token,
                s.tokens,
                s.out_width,
                gemm_device(hardware, dtype),
            )
            if correction is not None:
                t = t * correction.factors(s.out_width, gemm_inner_size(s.flops_per_token, s.out_width), s.tokens)
            out[idx] = t
        elif kernel in calibration.elementwise:
            out[idx] = np.array([r.kernels for r in sub]) * elementwise_fit_time_s(
                calibration.elementwise[kernel],
                np.array([r.bytes for r in sub]),
                np.array([r.tokens for r in sub]),
                bw,
            )
    return out


def _provenance(source: str, rows: list[KernelRow]) -> dict:
    """A FittedValue's record of its rows; its errors are measured after the fit."""
    return {
        "source": source,
        "rows": len(rows),
        "mape_pct": 0.0,
        "bias_pct": 0.0,
        "fitted_on": sorted({r.label for r in rows}),
    }


def unfitted_kinds(rows: list[KernelRow]) -> dict[str, list[KernelRow]]:
    """The elementwise kinds with fewer rows than their fit needs (MIN_ELEMENTWISE_ROWS: a launch
    cost and a bandwidth need two sizes), which `fit_kernels` leaves out: `sim profile` times
    some kinds at one size, and those operators keep the profile's `efficiency:` roofline."""
    by_kind: dict[str, list[KernelRow]] = {}
    for r in rows:
        if r.kernel != "gemm":
            by_kind.setdefault(r.kernel, []).append(r)
    return {k: sub for k, sub in sorted(by_kind.items()) if len(sub) < MIN_ELEMENTWISE_ROWS}


def unfitted_notes(rows: list[KernelRow]) -> list[str]:
    """One line per kind `fit_kernels` leaves out, naming its row and why."""
    return [
        f"note: {kind}: {len(sub)} row ({sub[0].where}); its fit needs {MIN_ELEMENTWISE_ROWS} sizes or more: "
        f"not fitted, the profile's `efficiency:` roofline prices {kind} kernels"
        for kind, sub in unfitted_kinds(rows).items()
    ]


def fit_kernels(
    rows: list[KernelRow],
    hardware: HardwareProfile,
    source: str,
    dtype: str = "fp16",
    on_kernel: Callable[[str, int], None] | None = None,
) -> Calibration:
    """Fit the GEMM model and one elementwise model per kernel kind present in the rows.
    `hardware` gives the peaks the fractions are fractions of; `on_kernel(kind, rows)` is told
    as each kind's fit starts (a progress bar: the GEMM fit of 30,000 rows takes half a minute)."""
    on_kernel = on_kernel or (lambda kernel, n: None)
    peak, bw = _rates(hardware, dtype)
    gemm_rows = [r for r in rows if r.kernel == "gemm"]
    gemm = None
    if gemm_rows:
        on_kernel("gemm", len(gemm_rows))
        if len(gemm_rows) < MIN_GEMM_ROWS:
            raise InfersimError(
                f"{gemm_rows[0].where}: {len(gemm_rows)} GEMM rows; the GEMM fit needs at least "
                f"{MIN_GEMM_ROWS} (several token counts)"
            )
        p = fit_gemm(_gemm_samples(gemm_rows), gemm_device(hardware, dtype))
        gemm = GemmFit(
            **_provenance(source, gemm_rows),
            compute=_sig(p.compute),
            memory=_sig(p.memory),
            launch_us=_sig(p.launch_us),
            corner_exponent=_sig(p.corner_exponent),
            tile_tokens=p.tile_tokens,
            wave_exponent=_sig(p.wave_exponent),
            wave_latency_us=_sig(p.wave_latency_us),
            tile_share=_sig(p.tile_share),
        )
    elementwise = {}
    unfitted = unfitted_kinds(rows)
    for kernel in sorted({r.kernel for r in rows} - {"gemm"} - set(unfitted)):
        sub = [r for r in rows if r.kernel == kernel]
        on_kernel(kernel, len(sub))
        e = fit_elementwise(
            np.array([r.bytes for r in sub]),
            np.array([r.tokens for r in sub]),
            np.array([r.time_s for r in sub]),
            bw,
            np.array([r.kernels for r in sub]),
            GATHER_TOKENS.get(kernel),
        )
        gather = {}
        if e.gather_tokens:
            gather = dict(
                gather_tokens=e.gather_tokens,
                gather_us=_sig(e.gather_us),
                gather_us_per_token=_sig(e.gather_us_per_token),
            )
        cache = dict(cache_mb=_sig(e.cache_mb), cache_memory=_sig(e.cache_memory)) if e.cache_mb else {}
        elementwise[kernel] = ElementwiseFit(
            **_provenance(source, sub),
            memory=_sig(e.memory),
            launch_us=_sig(e.launch_us),
            saturation_tokens=e.saturation_tokens,
            **gather,
            **cache,
        )
    if gemm is None and not elementwise:
        few = f" ({', '.join(unfitted)}: fewer than {MIN_ELEMENTWISE_ROWS} rows each)" if unfitted else ""
        raise InfersimError(f"{source}: no GEMM or elementwise rows to fit{few}")
    calib = Calibration(status="measured", source=source, gemm=gemm, elementwise=elementwise)
    return record_errors(calib, rows, hardware, dtype)


def record_errors(
    calibration: Calibration, rows: list[KernelRow], hardware: HardwareProfile, dtype: str = "fp16"
) -> Calibration:
    """The calibration with each fitted value's MAPE and bias on its rows, computed with the
    rounded values it stores (what a reader of the profile reproduces)."""
    pred = predict_rows(calibration, rows, hardware, dtype)
    meas = np.array([r.time_s for r in rows])
    kernels = np.array([r.kernel for r in rows])

    def scored(fit, mask):
        mape, bias = errors_pct(pred[mask], meas[mask])
        return fit.model_copy(update={"mape_pct": round(mape, 3), "bias_pct": round(bias, 3)})

    update = {}
    if calibration.gemm is not None:
        update["gemm"] = scored(calibration.gemm, kernels == "gemm")
    update["elementwise"] = {k: scored(e, kernels == k) for k, e in calibration.elementwise.items()}
    return calibration.model_copy(update=update)


def significant(x: float, digits: int = 4) -> float:
    """Round to significant digits (profiles hold measurements, not 17-digit noise)."""
    if x == 0 or not np.isfinite(x):
        return float(x)
    return float(f"{x:.{digits}g}")


def _sig(x: float) -> float:
    return significant(x, 5)


def table_correction(
    fit: GemmFit, table: MeasuredGemms, hardware: HardwareProfile, dtype: str = "fp16", width: float = K_WIDTH_OCTAVES
) -> ShapeCorrection:
    """The measured shapes of `table` correcting the fitted GEMM model `fit` on `hardware` (the
    table in memory; a shipped profile's is read through measured_gemms.shape_correction)."""
    return ShapeCorrection(table, gemm_params(fit), gemm_device(hardware, dtype), width, bytes_per_element(dtype))


def with_measured_shapes(
    calibration: Calibration, rows: list[KernelRow], hardware: HardwareProfile, file: str, dtype: str = "fp16"
) -> tuple[Calibration, MeasuredGemms]:
    """The calibration whose GEMM fit is corrected by its own rows' measured shapes (stored in
    `file`, relative to the profile), with the corrected model's errors on those rows; and the
    table to write there."""
    table = measured_gemms(rows)
    fit = calibration.gemm
    correction = table_correction(fit, table, hardware, dtype)
    g = [r for r in rows if r.kernel == "gemm"]
    mape, bias = errors_pct(predict_rows(calibration, g, hardware, dtype, correction), [r.time_s for r in g])
    shapes = MeasuredShapes(
        file=file,
        rows=len(table),
        k_width_octaves=K_WIDTH_OCTAVES,
        dtype=normalize_dtype(dtype),
        mape_pct=round(mape, 3),
        bias_pct=round(bias, 3),
    )
    gemm = fit.model_copy(update={"measured_shapes": shapes})
    return calibration.model_copy(update={"gemm": gemm}), table
