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

from infersim.simulator.calibration.fit import fit_kernels, predict_rows
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


def evaluate(table: Path) -> pd.DataFrame:
    kind = recognise(table)
    frames = []
    for device, name in DEVICES.items():
        rows = kind.read(table, device)
        hw = load_hardware(name + ":datasheet")
        labels = sorted({r.label for r in rows})
        datasheet = roofline_s(rows, hw, 1.0, 1.0, 0.0)
        two_knob = roofline_s(rows, hw, 0.7, 0.8, 5.0)
        for held in labels:
            train = [r for r in rows if r.label != held]
            idx = [j for j, r in enumerate(rows) if r.label == held]
            test = [rows[j] for j in idx]
            calib = fit_kernels(train, hw, SOURCE)
            frames.append(pd.DataFrame({
                "device": device, "model": held, "op": [r.op for r in test], "kernel": [r.kernel for r in test],
                "tp": [r.tp for r in test], "tokens": [r.tokens for r in test],
                "measured": [r.time_s for r in test], "calibrated": predict_rows(calib, test, hw),
                "datasheet": datasheet[idx], "two_knob": two_knob[idx]}))
            print(f"{device} held out {held}", flush=True)
    df = pd.concat(frames, ignore_index=True)
    df["range"] = "other"  # 33-63 and 513-1023 tokens, between the reported ranges
    for lo, hi, label in RANGES:
        df.loc[(df.tokens >= lo) & (df.tokens <= hi), "range"] = label
    return df


MODELS = ("calibrated", "datasheet", "two_knob")


def scores(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    out = df.copy()
    for m in MODELS:
        out[m + "_rel"] = (out[m] - out.measured) / out.measured * 100
    agg = {}
    for m in MODELS:
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
    g = d.groupby(["device", "model", "op", "tp", "range"]).agg(rows=("err", "size"), MAPE=("abs", "mean"),
                                                                 bias=("err", "mean")).reset_index()
    return g.sort_values("MAPE", ascending=False).head(n)


def _span(x: pd.Series, signed: bool = False) -> str:
    if signed:
        return f"within +-{x.abs().max():.1f}%"
    return f"{x.min():.1f}-{x.max():.1f}%"


def summary(per_model: pd.DataFrame, rng: pd.DataFrame) -> str:
    lin = per_model[per_model.cls == "linear"]
    el = per_model[per_model.cls == "elementwise"]
    lr = rng[rng.cls == "linear"]
    return (f"Linear operators per held-out model: calibrated {_span(lin['calibrated MAPE'])} MAPE (bias "
            f"{_span(lin['calibrated bias'], True)}), datasheet {_span(lin['datasheet MAPE'])} (bias "
            f"{lin['datasheet bias'].min():.1f}% to {lin['datasheet bias'].max():.1f}%), two-knob {_span(lin['two_knob MAPE'])}. Per token range: 1-32 tokens "
            f"{_span(lr[lr.range == '1-32']['calibrated MAPE'])}, 64-512 {_span(lr[lr.range == '64-512']['calibrated MAPE'])}, "
            f"1024-4096 {_span(lr[lr.range == '1024-4096']['calibrated MAPE'])}. Elementwise per held-out model: calibrated "
            f"{_span(el['calibrated MAPE'])}, datasheet {_span(el['datasheet MAPE'])}.")


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
        "held-out model's rows; every number below is out of sample. Columns: `calibrated` (the fitted GEMM "
        "corner model and elementwise models of `sim calibrate`), `datasheet` (max(FLOPs / peak, bytes / "
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
    ]
    return "\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("table", type=Path, nargs="?", help="linear_ops.csv (per-layer operator medians; default: the shipped table)",
                    default=Path(__file__).parent / "data" / "gpu-kernels" / "linear_ops.csv.gz")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("RESULTS-gpu-calibration.md"))
    args = ap.parse_args()
    df = evaluate(args.table)
    text = report(df, args.table)
    args.out.write_text(text + WHY)
    print(f"wrote {args.out}")


WHY = """
## Where the targets are missed, and why

- **Linear operators, 64-512 tokens (10.6-11.8% MAPE on every device, bias within +-2.3%).** Measured
  times step every 64-128 tokens as cuBLAS switches tile shape and split-K with M, N and K
  (Llama-3-8B's down projection on the A100: 0.111 ms at 128 tokens, 0.162 ms at 136, back to
  0.134 ms at 184). Which kernel a shape gets depends on N and K as well as M, so the staircase of
  one model does not transfer to another; the fitted p-norm corner and 64/128-token tile follow
  the trend through the steps, not each step. A fixed wave-quantisation model (tiles / SMs)
  scored worse (12-48% held out), as did a per-token-count correction table (no gain): the
  steps are kernel choices, not waves of one kernel.
- **Single shapes off by 20-26%**: a held-out model's projection whose cuBLAS kernel differs from
  the other models' (phi-2's Q/K/V projection on the H100 at 520-1016 tokens, -26%; Qwen-72B's
  down projection at 64-512 tokens, +-21%).
- **Small-weight GEMMs at high TP (attn_post_proj at TP 8, 1-32 tokens: up to +24%).** Weights of
  3-6 MB stay in the 40-50 MB L2 between the profiler's repeated calls, so the measurement runs
  faster than a weight read from HBM. In a real forward pass each layer reads other weights, so
  the model keeps the HBM read; the measured rows understate these shapes.
- **Elementwise, 1-32 tokens (bias -33% to -42%).** These kernels take 2-8 us and the tables
  round medians to 1 us (0.001 ms): one rounding step is 12-50% of the time. The floor also
  differs by model (an RMSNorm at 1 token: 4 us for Llama-3-8B, 8 us for Qwen-72B), which one
  floor per kernel kind cannot follow. In an iteration these kernels are a few percent of a
  decode step, beside GEMMs and attention.
  A floor joined to the streaming time by a fitted p-norm, with octave-balanced weights (as the
  GEMM fit has), lowered this bias to -15% to -31% but raised the 64-512 range to +9-15% bias
  and the whole-range error by 2-8 points, so the elementwise fit stays launch + bytes / rate.
- **phi-2 elementwise (25-28%)** is the one model with a LayerNorm, a GELU MLP and partial
  rotary, none of which the other (RMSNorm, SiLU-and-mul, full rotary) models measure.
"""

if __name__ == "__main__":
    main()
