"""Leave-one-model-out evaluation of the calibrated kernel models on measured GPU tables.

For every device and every model in the table: fit the calibration (sim calibrate's fit) on
all other models' rows, predict the held-out model's rows, and score MAPE and signed bias per
device, operator, token range and TP degree; beside it, the datasheet roofline (max(FLOPs /
peak, bytes / bandwidth)) and the plain two-knob roofline (70% of peak FLOP/s, 80% of
bandwidth, +5 us per kernel) on the same rows. Writes benchmarks/RESULTS-gpu-calibration.md.

    python benchmarks/gpu_calibration.py linear_ops.csv [--out benchmarks/RESULTS-gpu-calibration.md]

The table is microsoft/vidur's profiling data re-tabulated (MIT License, Copyright (c)
Microsoft Corporation, https://github.com/microsoft/vidur), in the `linear_ops` format of
docs/profiling.md."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from infersim.simulator.calibration.fit import fit_kernels, measured_gemms, predict_rows, table_correction
from infersim.simulator.calibration.fit_plot import FitSeries, plot_fit
from infersim.simulator.calibration.kernel_models import errors_pct
from infersim.simulator.calibration.tables import recognise
from infersim.simulator.hardware.catalog import load_hardware

DEVICES = {"a100": "a100-80gb-sxm", "a40": "a40", "h100": "h100-sxm"}
RANGES = [(1, 32, "1-32"), (64, 512, "64-512"), (1024, 4096, "1024-4096"), (4097, 1 << 30, ">4096")]
TARGET = {"gemm": 5.0}
TARGET_ELEMENTWISE = 10.0
SOURCE = "microsoft/vidur profiling data, MIT License, Copyright (c) Microsoft Corporation, https://github.com/microsoft/vidur"


def roofline_s(rows, hw, ec: float, em: float, launch_us: float) -> np.ndarray:
    """max(FLOPs / (peak ec), bytes / (bw em)) + launch, for GEMM and elementwise rows alike."""
    peak, bw = hw.peak_flops("fp16"), hw.memory_bandwidth_bytes_per_s()
    flops = np.array([r.flops_per_token * r.tokens for r in rows])
    nbytes = np.array([r.bytes for r in rows])
    return np.maximum(flops / (peak * ec), nbytes / (bw * em)) + launch_us * 1e-6


def row_frame(rows) -> pd.DataFrame:
    """The measured rows as a table: what each row is and its measured seconds."""
    return pd.DataFrame(
        {
            "model": [r.label for r in rows],
            "op": [r.op for r in rows],
            "kernel": [r.kernel for r in rows],
            "tp": [r.tp for r in rows],
            "tokens": [r.tokens for r in rows],
            "out_width": [r.out_width for r in rows],
            "flops_per_token": [r.flops_per_token for r in rows],
            "measured": [r.time_s for r in rows],
        }
    )


def held_out(rows, hw, source: str, progress=lambda model: None) -> tuple[np.ndarray, list[int]]:
    """Each model's rows predicted by `sim calibrate`'s fit on the other models' rows: columns
    (with the training models' measured shapes, as `sim calibrate` would ship them; the fitted
    model alone), and the row order that groups the models alphabetically."""
    out = np.full((len(rows), 2), np.nan)
    order = []
    for held in sorted({r.label for r in rows}):
        train = [r for r in rows if r.label != held]
        idx = [j for j, r in enumerate(rows) if r.label == held]
        test = [rows[j] for j in idx]
        calib = fit_kernels(train, hw, source)
        shapes = table_correction(calib.gemm, measured_gemms(train), hw)
        out[idx, 0] = predict_rows(calib, test, hw, correction=shapes)
        out[idx, 1] = predict_rows(calib, test, hw)
        order += idx
        progress(held)
    return out, order


def label_ranges(df: pd.DataFrame) -> pd.DataFrame:
    df["range"] = "other"  # 33-63 and 513-1023 tokens, between the reported ranges
    for lo, hi, label in RANGES:
        df.loc[(df.tokens >= lo) & (df.tokens <= hi), "range"] = label
    return df


def evaluate(table: Path) -> pd.DataFrame:
    kind = recognise(table)
    frames = []
    for device, name in DEVICES.items():
        rows = kind.read(table, device)
        hw = load_hardware(name + ":datasheet")
        df = row_frame(rows)
        pred, order = held_out(rows, hw, SOURCE, progress=lambda m: print(f"{device} held out {m}", flush=True))
        df["calibrated"], df["fitted_model"] = pred[:, 0], pred[:, 1]
        df["datasheet"] = roofline_s(rows, hw, 1.0, 1.0, 0.0)
        df["two_knob"] = roofline_s(rows, hw, 0.7, 0.8, 5.0)
        df.insert(0, "device", device)
        frames.append(df.iloc[order])
    return label_ranges(pd.concat(frames, ignore_index=True))


MODELS = ("calibrated", "fitted_model", "datasheet", "two_knob")


def scores(df: pd.DataFrame, by: list[str], models: tuple[str, ...] = MODELS) -> pd.DataFrame:
    """Rows, MAPE and signed bias (percent) of each predictor column in `models`, per group."""
    out = df.copy()
    for m in models:
        out[m + "_rel"] = (out[m] - out.measured) / out.measured * 100
    agg = {}
    for m in models:
        agg[f"{m} MAPE"] = (m + "_rel", lambda x: np.mean(np.abs(x)))
        agg[f"{m} bias"] = (m + "_rel", "mean")
    g = out.groupby(by).agg(rows=("measured", "size"), **agg).reset_index()
    return g


def md_table(g: pd.DataFrame) -> str:
    cols = list(g.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in g.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            cells.append(f"{v:+.1f}" if "bias" in c else f"{v:.1f}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def worst_shapes(df: pd.DataFrame, n: int = 12) -> pd.DataFrame:
    d = df[df.kernel == "gemm"].copy()
    d["err"] = (d.calibrated - d.measured) / d.measured * 100
    d["abs"] = d.err.abs()
    g = (
        d.groupby(["device", "model", "op", "tp", "range"])
        .agg(rows=("err", "size"), MAPE=("abs", "mean"), bias=("err", "mean"))
        .reset_index()
    )
    return g.sort_values("MAPE", ascending=False).head(n)


def repeated_shapes(df: pd.DataFrame) -> pd.DataFrame:
    """GEMM rows whose shape (device, M, N, K) another measured operator also has: each such row
    beside the median of the other measurements of its shape, from other models (`other
    model`) and from the same model's other operators (`same model`; in this table only
    Qwen-72B's Q/K/V projection, which adds a bias, against its bias-free gate/up projection)."""
    d = df[df.kernel == "gemm"]
    shape = ["device", "tokens", "out_width", "flops_per_token"]
    recs = []
    for _, g in d.groupby(shape):
        if len(g) < 2:
            continue
        for _, r in g.iterrows():
            for kind, others in (
                ("other model", g[g.model != r.model]),
                ("same model", g[(g.model == r.model) & (g.op != r.op)]),
            ):
                if len(others):
                    recs.append(
                        {
                            "device": r.device,
                            "range": r.range,
                            "kind": kind,
                            "repeat": abs(others.measured.median() - r.measured) / r.measured * 100,
                            "calibrated": abs(r.calibrated - r.measured) / r.measured * 100,
                        }
                    )
    return pd.DataFrame(recs)


def noise_floor(df: pd.DataFrame) -> pd.DataFrame:
    """Per device, source and token range: how far one measurement of a GEMM shape lies from
    the other measurements of the same shape (a bound on what any model of M, N and K can
    reach), beside the calibrated model's held-out error on the same rows."""
    r = repeated_shapes(df)
    order = [label for _, _, label in RANGES[:3]]
    r = r[r["range"].isin(order)].assign(range=lambda x: pd.Categorical(x["range"], order, ordered=True))
    g = r.groupby(["device", "kind", "range"], observed=True).agg(
        rows=("repeat", "size"), **{"repeat MAPE": ("repeat", "mean"), "calibrated MAPE": ("calibrated", "mean")}
    )
    return g.reset_index()


def _span(x: pd.Series, signed: bool = False) -> str:
    if signed:
        return f"within +-{x.abs().max():.1f}%"
    return f"{x.min():.1f}-{x.max():.1f}%"


def summary(per_model: pd.DataFrame, rng: pd.DataFrame) -> str:
    lin = per_model[per_model.cls == "linear"]
    el = per_model[per_model.cls == "elementwise"]
    lr = rng[rng.cls == "linear"]
    return (
        f"Linear operators per held-out model: calibrated {_span(lin['calibrated MAPE'])} MAPE (bias "
        f"{_span(lin['calibrated bias'], True)}), fitted model alone {_span(lin['fitted_model MAPE'])}, datasheet {_span(lin['datasheet MAPE'])} (bias "
        f"{lin['datasheet bias'].min():.1f}% to {lin['datasheet bias'].max():.1f}%), two-knob {_span(lin['two_knob MAPE'])}. Per token range: 1-32 tokens "
        f"{_span(lr[lr.range == '1-32']['calibrated MAPE'])}, 64-512 {_span(lr[lr.range == '64-512']['calibrated MAPE'])}, "
        f"1024-4096 {_span(lr[lr.range == '1024-4096']['calibrated MAPE'])}. Elementwise per held-out model: calibrated "
        f"{_span(el['calibrated MAPE'])}, datasheet {_span(el['datasheet MAPE'])}."
    )


def report(df: pd.DataFrame, table: Path) -> str:
    df = df.assign(cls=np.where(df.kernel == "gemm", "linear", "elementwise"))
    per_model = scores(df, ["device", "cls", "model"])
    linear_ok = per_model[per_model.cls == "linear"]["calibrated MAPE"] <= TARGET["gemm"]
    elem_ok = per_model[per_model.cls == "elementwise"]["calibrated MAPE"] <= TARGET_ELEMENTWISE
    rng = scores(df[df.range.isin(["1-32", "64-512", "1024-4096"])], ["device", "cls", "range"])
    bias_ok = rng["calibrated bias"].abs() <= 5.0
    parts = [
        "# GPU calibration: leave-one-model-out accuracy",
        "",
        "Written by `python benchmarks/gpu_calibration.py linear_ops.csv` (the table: microsoft/vidur's profiling "
        "data re-tabulated, MIT License, Copyright (c) Microsoft Corporation, https://github.com/microsoft/vidur). "
        "For each device and each model, the calibration is fitted on every other model's rows and scored on the "
        "held-out model's rows; every number below is out of sample. Columns: `calibrated` (what `sim calibrate` "
        "ships: the fitted GEMM corner and wave model corrected by the training models' measured GEMM shapes "
        "of the same N at a nearby K, and the elementwise saturation models), `fitted_model` (the same without "
        "the measured shapes: what a GEMM of a shape no table measured gets), `datasheet` (max(FLOPs / peak, bytes / "
        "bandwidth), the `NAME:datasheet` roofline), `two_knob` (70% of peak FLOP/s, 80% of bandwidth, +5 us per "
        "kernel). MAPE and bias in percent; bias = mean (predicted - measured) / measured.",
        "",
        "## Summary",
        "",
        summary(per_model, rng),
        "",
        "## Targets",
        "",
        f"- linear operators <= 5% MAPE on every held-out model: {'met' if linear_ok.all() else 'MISSED'} "
        f"({int(linear_ok.sum())} of {len(linear_ok)} device x model cells)",
        f"- elementwise <= 10% MAPE on every held-out model: {'met' if elem_ok.all() else 'MISSED'} "
        f"({int(elem_ok.sum())} of {len(elem_ok)})",
        f"- no token range with |bias| > 5%: {'met' if bias_ok.all() else 'MISSED'} "
        f"({int(bias_ok.sum())} of {len(bias_ok)} device x class x range cells)",
        "",
        "## Per held-out model",
        "",
        md_table(per_model),
        "",
        "## Per device and operator",
        "",
        md_table(scores(df, ["device", "op"])),
        "",
        "## Per token range",
        "",
        md_table(scores(df, ["device", "cls", "range"])),
        "",
        "## Per TP degree",
        "",
        md_table(scores(df, ["device", "cls", "tp"])),
        "",
        "## Worst GEMM shapes (calibrated, held out)",
        "",
        md_table(worst_shapes(df)),
        "",
        "## Noise floor: one GEMM shape measured more than once",
        "",
        "Identical GEMM shapes (same device, M, N and K) recur in the table: models that share the hidden size "
        "8,192 share their attention output projections at equal TP, and a TP-split projection of one model "
        "can match another's. `repeat MAPE`: each such row against the median of the other measurements of its "
        "shape, the error a model that knew every measured shape exactly would make. `calibrated MAPE`: the "
        "held-out calibrated model on the same rows. `other model`: the other measurements come from other "
        "models (what leave-one-model-out could at best borrow); `same model`: from the same model's other "
        "operator of that shape.",
        "",
        md_table(noise_floor(df)),
        "",
    ]
    return "\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "table",
        type=Path,
        nargs="?",
        help="linear_ops.csv (per-layer operator medians; default: the shipped table)",
        default=Path(__file__).parent / "data" / "gpu-kernels" / "linear_ops.csv.gz",
    )
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("RESULTS-gpu-calibration.md"))
    args = ap.parse_args()
    df = evaluate(args.table)
    text = report(df, args.table)
    figure = args.out.with_suffix(".png")
    text = text.replace(
        "## Summary\n", f"## Summary\n\n![held-out predicted / measured per device]({figure.name})\n", 1
    )
    args.out.write_text(text + WHY)
    plot_held_out(df, figure)
    print(f"wrote {args.out} and {figure}")


def plot_held_out(df: pd.DataFrame, path: Path) -> None:
    """Every held-out row's calibrated predicted / measured against its token count, one panel per
    device and class (linear, elementwise), with the bands of the fit figure of `sim calibrate
    --plot`."""
    series = []
    for device in DEVICES:
        for cls, mask in (("linear", df.kernel == "gemm"), ("elementwise", df.kernel != "gemm")):
            sub = df[(df.device == device) & mask]
            series.append(
                FitSeries(
                    f"{device} {cls}, held out",
                    sub.tokens.to_numpy(dtype=np.float64),
                    (sub.calibrated / sub.measured).to_numpy(),
                    errors_pct(sub.calibrated, sub.measured)[0],
                )
            )
    plot_fit(series, path, "calibrated", "leave-one-model-out, each model predicted by a fit on the others")


WHY = """
## Where the targets are missed, and why

- **Linear operators (3.1-7.8% MAPE per held-out model, 5 of 14 cells within 5%; the fitted
  model alone 4.9-8.6%, 1 of 14; every linear token range within +-2.1% bias).** The cells met
  are the held-out models whose projection widths other measured models share: Qwen-72B,
  CodeLlama-34B and Llama-3-70B (hidden size 8,192) on the A100, Qwen-72B and CodeLlama-34B on
  the A40. The misses are models whose widths no other model has: InternLM-20B (hidden 5,120:
  7.4-7.8%), phi-2 (6.3-7.5%), Llama-3-8B on the A100 (5.7%), and on the H100 Qwen-72B and
  CodeLlama-34B (5.8% and 5.2%: their gate/up projections, 2 x intermediate / TP wide, are
  theirs alone). For such a shape the fitted model is all there is, and the model form is the
  limit: fitted on all models of a device and scored on the same rows, it gives 5.6% (A100),
  7.0% (A40) and 8.0% (H100), above 5% before anything is held out, while a GEMM shape
  measured for two models agrees within 0.4-3.0% (the noise-floor table: on those rows the
  corrected model, held out, now scores 0.7-3.1%, at the floor). What the model misses is the
  staircase of cuBLAS kernel choices, which differs from shape to shape: on the A100 an
  8,192 x 8,192 projection steps every 128 tokens (+32% from 256 to 264 tokens, +36% from
  384 to 392), Llama-3-8B's 28,672-wide gate/up projection every 64, and some steps go down
  (Llama-3-8B's down projection: 0.111 ms at 128 tokens, 0.162 ms at 152, 0.134 ms at 184); on
  the H100 an 8,192-wide output runs 17-30% slower than the model from 520 to 640 tokens at
  every K measured, and 23-33% slower at 136-192 tokens for K <= 4,096 but 9-20% faster for
  K >= 5,504. A fit free to take any time that never falls as M grows (isotonic regression per
  shape) reaches 0.8-2.8% in sample; the measured-shape correction reaches 1.1-1.5% on the rows
  it was fitted on. The limit is not these tables': on projections this project timed itself
  on an H100 with another cuBLAS (seven models, RESULTS-kernels-on-real-gpus.md), the same fit
  held out per model gives 3.5-6.2%, 4 of 7 models within 5% (missed: Qwen-72B, InternLM-20B
  and phi-2, 5.4-6.2%).
- **The same shape with and without a bias.** The only identical shapes within one model are
  Qwen-72B's Q/K/V projection and its gate/up projection at twice the TP degree (N = 2 x 24,576
  / TP, K = 8,192). In microsoft/vidur's profiled layer the Q/K/V projection of Qwen carries a
  bias (`use_qkv_bias`) and the gate/up projection none, and the two differ by 6-11% at 64-512
  tokens (the `same model` rows above; A40, 6,144 x 8,192 at 184 tokens: 0.400 ms with the
  bias, 0.237 ms without): the bias epilogue changes cuBLAS's kernel choice. The tables carry
  no bias column, so the model cannot tell these rows apart; phi-2's projections all carry a
  bias. Measured: the measured shapes kept apart by bias (a GEMM with a bias corrected only by
  measured GEMMs with one: Qwen's Q/K/V and phi-2's projections): no cell better, the A40's and
  H100's phi-2 worse (7.1 -> 7.4%, 7.5 -> 7.9%); not kept.
- **Ideas measured for the GEMM model**, in order. Ranges are MAPE per held-out model, A100 /
  A40 / H100. The kept ones are this benchmark's numbers (before: 5.7-8.1 / 6.7-8.2 / 8.2-9.2);
  the others come from a standalone leave-one-model-out run on the GEMM rows with the same fit
  but the tile fixed at 64 tokens (there the model before this change scores 5.7-8.1 / 6.7-8.2 /
  8.4-9.6, the fill term 5.5-7.7 / 6.6-8.2 / 7.8-9.1).
  - kept: compute time x fill^-w, fill = the share of SM slots of all waves that 128 x 128 output
    tiles occupy, w fitted per device (0.2-0.4): 5.5-7.7 / 6.6-8.2 / 7.5-8.7 (64-512 tokens
    10.6-11.8% -> 9.8-11.6%). 128 x 256 or 256 x 128 tiles for the fill: no better (5.4-8.1 /
    6.6-8.2 / 8.0-9.3).
  - kept: a fixed latency per wave (fitted 1.4 us on the A100, 1.7 us on the A40, 0 on the H100):
    5.1-7.5 / 6.3-8.0 / 7.5-8.7. The same latency per tile instead of per wave: 5.1-7.6 / 6.4-8.2
    / 7.8-9.1.
  - kept: M rounded partly at the tile and partly at twice the tile (`tile_share`, fitted 0.56
    of 64 tokens on the A100, 0.51 of 64 on the A40, 0.71 of 128 on the H100): 4.9-7.4 /
    6.2-8.1 / 7.5-8.6, 64-512 tokens 9.7-11.5% -> 9.1-11.2%. Three tile heights (64 / 128 / 256
    or 32 / 64 / 128) with two fitted shares: no better than two (4.9-7.4 / 6.2-8.1 /
    7.5-8.5); a geometric instead of an arithmetic mean of the two roundings: the same; the
    share a logistic function of log2 N (and of log2 K), as a heuristic preferring short tiles
    for narrow outputs would make it: the slopes fit near 0 on the A100 and A40 (4.9-7.4 /
    6.2-8.1) and vary from fold to fold on the H100 (7.5-8.5, 64-512 tokens worse: 8.5-11.5%).
  - a correction learned from the other models' residuals at the nearest shapes (Gaussian
    kernel over log2 N and log2 K at the same M, 0.25-1 octave wide, normalised weights): helps
    the held-out models that share the hidden size 8,192 with others (A100 Qwen-72B 5.8 ->
    4.1%, CodeLlama-34B 6.0 -> 4.0%, Llama-3-70B 5.1 -> 4.1%) and hurts those with shapes of
    their own (Llama-3-8B 5.8 -> 6.1%, phi-2 6.7 -> 8.3%, A40 InternLM-20B 8.0 -> 8.3%): with
    normalised weights a lone distant shape counts in full, and the staircase does not carry
    from one N to another. Dropped in that form; kept as the measured shapes below.
  - kept: **measured shapes** (simulator/costmodel/measured_gemms.py). Same output width N
    only; over the measured K's of that N a Gaussian in log2 K, the weighted mean of their log
    ratios (measured / model, at the next measured token count) scaled by the largest weight, so
    a lone shape an octave away counts for nothing; the tables' GEMM medians ship beside the
    profile. On this benchmark's folds: 3.1-7.4 / 4.4-7.8 / 5.2-7.5, 5 of 14 cells (was 1),
    64-512 tokens 9.1 / 11.2 / 10.1% -> 6.5 / 8.7 / 7.4%, no cell worse than the fitted model
    alone. Width (standalone run, same folds): 0.2 octave 3.1-7.4 / 4.4-7.9 / 5.2-7.6; 0.25
    (kept) as above; 0.3 3.3-7.4 / 4.5-7.8 / 5.3-7.4; 0.5 3.6-7.4 / 4.7-7.5 / 5.6-7.2;
    normalised weights instead of scaled, 0.3 octave: the A100's phi-2 6.5 -> 8.2% and
    InternLM-20B 7.4 -> 8.2%. Neighbouring widths N as well (Gaussian in log2 N, 0.1 or 0.2
    octave): no better (3.4-7.4 / 4.4-7.9 / 5.3-7.4 and 3.5-7.2 / 4.5-8.0 / 5.6-7.4, the A100's
    phi-2 6.8%). With the learned correction of the bullet above (its best setting) where the
    measured shapes give none: 3.0-7.3 / 4.3-6.9 / 4.9-6.8, 6 of 14 cells (the H100's
    CodeLlama-34B 4.9%; its Qwen-72B 5.1%, the A100's Llama-3-8B 5.1%), the A100's phi-2 worse
    (6.3 -> 7.3%): one cell more for a tree ensemble in every profile; not kept.
  - a robust loss for the GEMM fit instead of least squares in log time (scipy's least_squares,
    with the measured shapes on top): soft_l1 at f_scale 0.05 3.1-7.4 / 4.3-7.7 / 5.1-7.5
    (0.0-0.3 points better per cell, the same 5 cells met), at 0.02 or 0.1 the same within 0.1;
    cauchy 0.05 3.1-7.4 / 4.2-7.6 / 5.0-7.7 (the H100's CodeLlama-34B 5.0%, its phi-2 worse);
    arctan 0.05 3.2-7.3 / 4.5-7.8 / 5.1-7.8 (64-512 bias -2.6% on the H100); without the octave
    row weights as well: the same. Not kept: no cell crosses 5%.
  - every training model given the same total weight in the GEMM fit (on top of the octave
    weights, so Llama-3's 7,296 rows count as much as phi-2's 1,044): 3.1-7.4 / 4.3-7.8 /
    5.2-7.5, no cell more than 0.1 point from the kept fit. Not kept.
  - a bias epilogue as a feature (phi-2's projections and Qwen's Q/K/V carry a bias, which
    changes cuBLAS's kernel choice): fitted on all models of a device, the mean log ratio
    measured / model of the bias GEMMs per model and token range is -1.4..+3.5% on the A100 and
    -1.9..+3.0% on the A40 (the other GEMMs -3.2..+1.9% and -4.0..+4.3%), no consistent sign;
    on the H100 +2.0..+4.2% against -2.8..+3.2%. Too small beside the per-shape scatter to
    carry a cell below 5%; not built.
  - one GEMM fit per measured operator (Q/K/V, output, gate/up, down projection) instead of one
    per device: 4.8-7.2 / 6.1-8.2 / 7.3-8.3 against 4.9-7.4 / 6.2-8.1 / 7.5-8.6 for the one fit
    (fitted model alone); too little for a fit that GEMMs without such a name (MoE experts,
    Medusa heads, the lm_head) could not use.
  - one tile shape with whole waves (time = waves x SMs x tile FLOPs, the textbook wave model):
    128 x 128 9.0-14.9 / 7.5-11.6 / 9.9-12.2; 128 x 256 15-31%; 256 x 128 13-28%; 64 x 128
    6.7-9.4 / 6.9-9.1 / 8.9-9.7. A partial wave costs a fraction of a whole one: cuBLAS runs
    another tile shape or split-K for it.
  - the fastest of six tile shapes (64 x 64 to 256 x 128) with whole waves, one efficiency:
    6.0-7.9 / 6.8-8.4 / 8.6-9.7; with split-K for under-filled waves 5.9-8.2 / 6.6-8.5 / 8.6-9.4;
    with an efficiency per tile shape 5.9-7.8 / 6.6-8.3 / 8.5-9.7 (the minimum hands all rows to
    one shape; the others keep their starting efficiency); with efficiency growing with tile
    area as a fitted power: the power fits to 0.0-0.2, 6.0-7.8 / 6.6-8.5 / 8.6-9.4.
  - under-occupancy alone (min(1, tiles / SMs)^-g): 5.7-8.0 / 6.7-8.2 / 8.3-9.4; beside the fill
    term g fits to 0. Fill applied to the weight-read time too: 5.6-7.8 / 6.6-8.2 / 8.2-9.3 with
    the H100's 64-512 bias at -5.9%.
  - a learned correction on top of this model, measured on this benchmark's folds and fitted
    model: scikit-learn's HistGradientBoostingRegressor (fixed random_state, one per device,
    fitted on the training models' rows only) predicting log(measured / model) from features
    meant to carry across N and K: log2 M, M's position in 64 / 128 / 256-row tiles, the tile
    count and position of N in 64 / 128 / 256 columns, K mod 256, waves and last-wave fill of
    64 x 128, 128 x 128, 128 x 256 and 256 x 128 tiles over the SM count, log2 N, log2 K,
    log2 K / N, arithmetic intensity, the datasheet memory share and weight bytes over L2. Best
    setting (depth 5, 200 rows per leaf, 300 trees at rate 0.05, absolute loss): 3.5-7.0 /
    5.2-7.2 / 5.8-6.3, 64-512 tokens 9.1 / 11.2 / 10.1% -> 7.3 / 8.8 / 7.1%, 3 of 14 cells
    within 5%. It gains most where the held-out model shares the hidden size 8,192 with others
    (A100 Qwen-72B 5.4 -> 3.7%, CodeLlama-34B 5.6 -> 4.1%, Llama-3-70B 4.9 -> 3.5%) and on the
    H100 (7.5-8.6 -> 5.8-6.3%), least on shapes of their own (A40 InternLM-20B 8.1 -> 6.8%,
    phi-2 7.4 -> 7.2%; A100 phi-2 6.5 -> 7.0%, worse). Variants: squared loss 3.4-7.2 /
    5.3-7.7 / 5.6-6.5; depth 8 3.2-7.4 / 5.1-7.8 / 5.4-6.5; monotone in log2 M 3.5-6.8 /
    5.3-7.2 / 5.8-6.3; octave row weights 3.7-7.1 / 5.6-8.0 / 5.8-6.3; one ensemble over the
    three devices with the device as a feature (the held-out model held out on all three)
    3.4-6.9 / 5.8-7.4 / 6.2-6.7; the correction scaled down by the held-out shape's distance
    d from the nearest training shape in (log2 N, log2 K), exp(-d^2 / 2 s^2): s = 0.3 octave
    3.5-6.5 / 5.3-7.8 / 6.0-6.8 (no cell worse than without the correction, 64-512 tokens 7.4 /
    9.7 / 7.8%), s = 0.6 3.5-6.7 / 5.2-7.2 / 5.9-6.3, s = 0.15 3.7-7.2 / 5.4-8.0 / 6.4-7.2.
    Without the N-tile and K mod 256 features: depth 5 3.3-7.2 / 5.3-7.7 / 5.8-6.8, depth 3
    with 200 or 500 rows per leaf 4.1-7.3 / 5.7-7.9 / 5.7-7.0,
    without N and K at all (tile, wave and intensity features only) 3.7-7.9 / 5.3-7.7 /
    5.7-7.4, the correction halved 3.9-6.5 / 5.5-7.8 / 6.4-6.8, ExtraTrees and RandomForest
    (100 trees of depth 6, 100 rows per leaf) 4.4-7.1 / 5.9-8.2 / 6.5-7.2 and 4.2-7.2 /
    5.7-8.0 / 6.2-6.8. Fitted with the held-out model's rows in, the best setting reaches
    2.4-4.9 / 4.1-5.7 / 3.4-4.5: the trees learn each measured shape's staircase, which, as
    with the nearest-shape correction, carries to a new N and K only in part. Not kept: 0.2-2.7
    points better on 13 of 14 cells (the A100's phi-2 worse, or level with the distance scaling)
    but the target met on 3, and a 300-tree ensemble in every profile.
- **Single shapes off by 17-25%**: a held-out model's projection whose cuBLAS kernel differs
  from the other models' (phi-2's Q/K/V projection on the H100 at 520-1016 tokens, -25%;
  Qwen-72B's down projection on the A40 at 64-512 tokens, -21%).
- **Small-weight GEMMs at high TP (attn_post_proj at TP 8, 1-32 tokens: up to +20%).** Weights
  of 3-6 MB stay in the 40-50 MB L2 between the profiler's repeated calls, so the measurement
  runs faster than a weight read from HBM. In a real forward pass each layer reads other
  weights, so the model keeps the HBM read; the measured rows understate these shapes.
- **Elementwise (4.7-7.5% on the RMSNorm / SiLU models: 11 of 14 cells met, phi-2's missed;
  every token range within +-2.1% bias).** Kept, in order: the saturation term (below S tokens a
  one-row-per-block kernel takes as long as S tokens, S fitted per kind from 1 to 2048) took
  these from 8.0-11.5% and the 1-32-token bias from -33..-42% to -1..-8%: with S on powers of
  two 6.4-10.2% and -6..-14%, with four steps per octave (kept) 6.2-9.8% and -1..-8%, with
  every integer 6.2-9.7% and 0..-8%. Then the cache term: a kernel's first C bytes (its
  working set, C fitted per kind from 256 kB to 256 MB, or none) stream at their own fitted
  rate, the rest at the memory rate (the cached rate never slower): 6.3-9.5% -> 4.7-7.5% on
  these models (A100 7.4-9.5 -> 6.0-6.7, A40 6.3-8.1 -> 4.7-6.7, H100 8.4-9.2 -> 6.3-7.5),
  phi-2 19.1 / 18.7 / 20.8% -> 14.9 / 13.3 / 18.0%, the residual add 10.0 / 13.4 / 8.4% ->
  4.5 / 4.0 / 5.7% and the two norms 9.9-14.3% -> 6.2-10.0% per device. Fitted on all models,
  C is about half the L2 for the norm, add and rotary kinds (A100 13.5-23 of 40 MB, H100
  23-32 of 50 MB: one of the two L2 partitions of these chips; A40 4.8 of 6 MB), and below it
  these kernels stream 1.2-2.5x faster per byte: an elementwise kernel reads what the kernel
  before it wrote, still in the L2 when it fits (in a forward pass as between the profiler's
  repeated calls). Before the cache term the model traded the two regimes against each other:
  up to +40% at 256-1,024 tokens (L2-resident, faster than the fitted rate) and -10% past
  4,096 tokens (from HBM, slower). A derived card scales C by its own L2 over the measured
  card's (datasheet `l2_cache_mb`). Measured and dropped: octave-balanced row weights
  (10.7-17.7%, worse at large batches); one model per measured operator instead of per kind
  (the two norms apart: no change, 9.6-11.5% before the saturation term); a floor joined to the
  streaming time by a fitted p-norm (1-32 bias -15% to -31%, 64-512 bias +9-15%); before the
  cache term, whole waves of rows instead of the saturation (ceil(M / R) x R rows, R fitted:
  vLLM's RMSNorm and SiLU-and-mul kernels run one 1,024-thread block per token, and the
  measured times step where the rows pass a multiple of two blocks per SM, e.g. Llama-3-70B's
  norm on the A100: 9-10 us to 216 tokens, 16-18 us from 224 to 432, 22-23 us from 440),
  measured with the cache term on the norm, activation, rotary and add kinds: no better (A100
  6.3-7.2% -> 6.4-7.4%, A40 5.1-7.2% -> 5.2-7.9%, H100 6.6-8.4% -> 6.6-9.4% on those kinds; the
  fit takes R = 108 rows, one block per SM, for the A100's norm); before the
  cache term, the saturation applied to the per-token bytes only (a norm's weight read once:
  bytes_const + bytes_per_token x max(M, S) instead of all bytes x max(1, S / M)), on the
  norm, activation, rotary and add kinds: 0.0-0.4 points better per held-out model, phi-2
  unchanged.
- **The 1-32-token bias (A100 / A40 / H100: -0.6 / -7.6 / -8.2% -> +2.9 / -3.9 / -0.9%).** It
  was not the tables' rounding: the measured times are whole microseconds (microsoft/vidur's
  raw mlp.csv gives each sample's minimum and maximum in whole 0.001 ms), and rounding to the
  nearest microsecond leaves an exact model's mean relative error at 0 (floor rounding would
  make it positive), never negative. It came from two kernels the model priced wrongly, both
  fixed by what the kernels run: (1) the activation model was fitted on SiLU-and-mul and
  phi-2's GELU rows together; GELU is PyTorch's pointwise kernel (1-2 us at 1-32 tokens where
  the per-row SiLU-and-mul kernel takes 8-22 us), so it pulled the saturation down (held-out
  Qwen-72B at TP 1 on the H100: 3 us predicted, 13 us measured). A plain activation is now
  priced by the `add` kind, the same pointwise kernel, with its own bytes (1-32 bias of
  `mlp_act` -7..-22% -> -6..+3%). (2) The embedding of at most 16 tokens runs PyTorch's
  small-index gather (index_select walks the indices one after another): 3, 4, 5, 8, 14 us at
  1, 2, 4, 8, 16 tokens on the A100, whatever the width, then 5 us at 24. It is now a fitted line
  (`gather_us` + `gather_us_per_token` x tokens, 2.35 + 0.71 us on the A100): `emb` 1-32 bias
  -16..-23% -> -0.2..-1.1%. What the 1-32 range keeps (10-16% MAPE) is mostly the resolution:
  an exact model scored against whole microseconds errs by 0.25 us / t on average, 12.5% on
  a 2 us kernel. The benchmark scores against the measured values as they are.
- **phi-2 elementwise (13.3-18.0%; 18.7-20.8% before the cache term, 25.2-28.9% before its
  residual add was read as two kernels).** phi-2's block has no post-attention norm:
  attention and MLP run side by side and the timed `add` is attn + mlp + residual, two add
  kernels where the other models' timed add is one (microsoft/vidur's profiled layer); the
  table reader prices it so (phi-2's add: 48% -> 12-20% MAPE, 8-11% with the cache term).
  Per operator (A100 / A40 / H100 MAPE): LayerNorm 21 / 27 / 28%, GELU 30 / 5 / 31% (bias -30
  / -2 / -30%: priced as the residual add's pointwise kernel it streams 0.7x as fast per byte
  on the A100 and H100, as fast on the A40; priced as SiLU-and-mul before: 41 / 18 / 37%, bias
  +18..+41%), the two residual adds 11 / 8 / 8% (up to 128 tokens +12% on the A40, 512-2,048
  tokens +11% and past 2,048 -11% on the A100), rotary 7 / 18 / 17% (-15..-17% on the A40 and
  H100), embedding 6 / 10 / 6%. LayerNorm is PyTorch's own kernel, which no other measured
  model runs: 7-8 us (A100) and 6 us (H100) from 1 to 512 tokens, where the norm model, learned
  on the RMSNorm kernel of 4,096-8,192-wide rows, gives a 2,560-wide row 2-4 us (-28..-43%),
  then faster per byte than that kernel (43 us for 4,096 x 2,560 on the A100; +26% past 2,048
  tokens on the A100, +43% on the H100). Held out, phi-2 leaves no row of it to fit. Measured
  and dropped (before the cache term): LayerNorm as two launches of the norm kernel (moments,
  then normalise) moving 3 x hidden bytes per token: 73-88%; LayerNorm as the pointwise `add`
  kind: 28-56% (bias -26..-56%); the pointwise kind's saturation counted in bytes (a floor the
  same for every width) instead of tokens: phi-2 19.1 / 18.7 / 20.8% -> 18.4 / 18.5 / 20.9%.
  With LayerNorm at 21-28% and GELU at 30% on two cards, the other operators would need 3-5%
  for phi-2 to reach 10%.
"""

if __name__ == "__main__":
    main()
