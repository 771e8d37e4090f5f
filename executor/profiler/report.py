"""Markdown tables of a measured profile's numbers (for docs/findings/profiler-accuracy.md):

python -m infersim.executor.profiler.report hwprofiles/cpu-reference.yaml
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import yaml

from infersim.simulator.costmodel.calibration_file import calibration_for
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.yamlio import write_atomic

from .regress import REGRESSORS


def _fmt_s(x: float) -> str:
    return f"{x * 1e3:.3f} ms" if x < 1 else f"{x:.3f} s"


def regressor_table_md(comp: dict) -> str:
    degs = sorted({int(d) for row in comp["table"].values() for d in row})
    best = (comp["best"]["estimator"], int(comp["best"]["degree"]))
    lines = ["| regressor - degree | " + " | ".join(str(d) for d in degs) + " |", "|---|" + "---:|" * len(degs)]
    for name, row in comp["table"].items():
        cells = []
        for d in degs:
            if str(d) not in row:  # the physical model has one form, not five degrees
                cells.append("-")
                continue
            v = row[str(d)]
            s = f"{v:.2f}" if v < 1e4 else f"{v:.2g}"
            cells.append(f"**{s}**" if (name, d) == best else s)
        label = "affine + quadratic in tokens (physical)" if name == "affine_quadratic" else REGRESSORS.get(name, name)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def headline_md(hw: dict, calib: dict) -> str:
    link = calib["host_link"]
    rows = [("achieved GEMM " + dt, f"{v * 1e3:.1f} GFLOP/s") for dt, v in hw["peak_tflops"].items()]
    rows += [
        ("achieved memory bandwidth", f"{hw['memory_bandwidth_gbps']:.1f} GB/s ({calib['roofs']['memory_source']})"),
        (
            "copy host-to-device / device-to-host",
            f"{link['h2d_gbps']:.2f} / {link['d2h_gbps']:.2f} GB/s "
            f"(latency {link['h2d_latency_us']:.1f} / {link['d2h_latency_us']:.1f} us)",
        ),
    ]
    for c, e in hw["efficiency"].items():
        rows.append((f"efficiency {c} (compute / memory)", f"{e['compute']:.3g} / {e['memory']:.3g}"))
    rows.append(
        (
            "kernel launch / iteration overhead",
            f"{hw['overheads']['kernel_launch_us']:.3g} us / {hw['overheads']['iteration_us']:.3g} us",
        )
    )
    rse = calib["roofline_step_error"]
    rows.append(
        (
            "roofline MAPE on the step times (uncalibrated -> calibrated)",
            f"{rse['uncalibrated_mape']:.1f}% -> {rse['calibrated_mape']:.1f}% ({rse['n']} steps)",
        )
    )
    return "| quantity | value |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)


def swap_md(sw: dict) -> str:
    lines = [
        "| KV of | tokens | bytes | swap-out measured / predicted | swap-in measured / predicted | "
        "error out / in / total | per-layer copies (error) | executor swap (error) |",
        "|---|---:|---:|---|---|---|---|---|",
    ]
    for r in sw["rows"]:
        lines.append(
            f"| {r['model']} | {r['tokens']} | {r['bytes'] / 2**20:.1f} MiB | "
            f"{_fmt_s(r['swap_out_s'])} / {_fmt_s(r['pred_out_s'])} | {_fmt_s(r['swap_in_s'])} / {_fmt_s(r['pred_in_s'])} | "
            f"{r['err_out_pct']:.2f}% / {r['err_in_pct']:.2f}% / {r['err_swap_pct']:.2f}% | "
            f"{_fmt_s(r['per_layer_swap_s'])} ({r['err_per_layer_pct']:.1f}%) | "
            f"{_fmt_s(r['executor_swap_s'])} ({r['err_executor_pct']:.1f}%) |"
        )
    lines.append(
        f"| **MAPE** | | | | | **{sw['mape_out']:.2f}% / {sw['mape_in']:.2f}% / {sw['mape_swap']:.2f}%** | "
        f"{sw['mape_per_layer_swap']:.1f}% | {sw['mape_executor_swap']:.1f}% |"
    )
    if sw.get("rounds", 1) > 1:
        lines.append(
            f"\nEach measured time is the median of {sw['rounds']} rounds over all sizes; the rounds of one "
            f"size vary by {sw['rounds_cv_median'] * 100:.1f}% (median coefficient of variation)."
        )
    return "\n".join(lines)


def recompute_md(rc: dict) -> str:
    lines = [
        "| layers x hidden | tokens | batch | measured | predicted (RegressionCostModel) | error | "
        "raw regressor error | calibrated roofline error |",
        "|---|---:|---:|---|---|---:|---:|---:|",
    ]
    for r in rc["rows"]:
        shape = f"{r['layers']} x {r['hidden']}" + ("" if r.get("shape_measured", True) else " (not swept)")
        lines.append(
            f"| {shape} | {r['tokens']} | {r['batch']} | {_fmt_s(r['measured_s'])} | "
            f"{_fmt_s(r['pred_regression_s'])} | {r['err_regression_pct']:.2f}% | "
            f"{r['err_regressor_raw_pct']:.2f}% | {r['err_roofline_pct']:.1f}% |"
        )

    def pct(x):
        return "-" if x is None else f"{x:.2f}%"

    lines.append("")
    lines.append("| MAPE over | RegressionCostModel | calibrated roofline |")
    lines.append("|---|---:|---:|")
    lines.append(
        f"| recompute (batch 1), all shapes | **{pct(rc['mape_recompute'])}** | {pct(rc['mape_recompute_roofline'])} |"
    )
    lines.append(f"| recompute, swept shapes | {pct(rc['mape_recompute_swept_shapes'])} | |")
    lines.append(f"| recompute, unswept shape | {pct(rc['mape_recompute_unswept_shape'])} | |")
    lines.append(f"| batched prefill (batch 4) | {pct(rc['mape_batched_prefill'])} | |")
    lines.append(f"| every row | {pct(rc['mape_regression'])} | {pct(rc['mape_roofline'])} |")
    if rc.get("rounds", 1) > 1:
        lines.append(
            f"\nEach measured time is the median of {rc['rounds']} rounds over all settings; the rounds of "
            f"one setting vary by {rc['rounds_cv_median'] * 100:.1f}% (median coefficient of variation)."
        )
    return "\n".join(lines)


def per_model_md(key: str, e: dict) -> str:
    """One served model's own predictors: the regressor table on its held-out prefills, the
    held-out rows, and the executor's swap check."""
    rc, sw = e["recompute"], e["swap"]
    comp = rc["comparison"]
    ch, orc = comp["chosen"], comp["oracle"]
    la = e.get("load_average") or {}
    out = [
        f"### {key}: measured {e.get('measured_at', '?')}, {e.get('threads', '?')} thread(s), {e['dtype']}, "
        f"load {la.get('start') or float('nan'):.2f} -> {la.get('end') or float('nan'):.2f}, "
        f"{rc['rounds']} rounds, {comp['n_fit']} fitted / {comp['n_held_out']} held-out prefills",
        "",
        "Held-out MAPE (%) of every candidate fitted on the grid (features: tokens, batch, sum of squared "
        "prompt lengths; the physical model is time = c0 + c1 tokens + c2 batch + c3 sum q^2, c >= 0):",
        "",
        regressor_table_md({"table": comp["table"], "best": {"estimator": ch["estimator"], "degree": ch["degree"]}}),
        "",
        f"Kept (lowest mean error in a 5-fold cross-validation on the grid, never on the held-out set): "
        f"**{REGRESSORS.get(ch['estimator'], ch['estimator'])}, degree {ch['degree']}** (bold above), held-out "
        f"{ch['held_out_mape']:.2f}%; the held-out set itself would have picked "
        f"{REGRESSORS.get(orc['estimator'], orc['estimator'])}, degree {orc['degree']} ({orc['held_out_mape']:.2f}%).",
        "",
        "| held-out prompts | measured | per-model (RegressionCostModel) | error | generic regressor error | "
        "calibrated roofline error | rounds CV |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rc["rows"]:
        if r["role"] != "held":
            continue
        out.append(
            f"| {' + '.join(map(str, r['prompts']))} | {_fmt_s(r['measured_s'])} | "
            f"{_fmt_s(r.get('pred_cost_model_s', r['pred_s']))} | "
            f"{r.get('err_cost_model_pct', r.get('err_predictor_pct', float('nan'))):.2f}% | "
            f"{r.get('err_generic_pct', float('nan')):.1f}% | {r.get('err_roofline_pct', float('nan')):.1f}% | "
            f"{r['rounds_cv'] * 100:.1f}% |"
        )

    def pct(x):
        return "-" if x is None else f"{x:.2f}%"

    out += [
        "",
        "| MAPE over | per-model | generic regressor | calibrated roofline |",
        "|---|---:|---:|---:|",
        f"| recompute: held-out prompts alone | **{pct(rc['mape_recompute'])}** | {pct(rc['mape_recompute_generic'])} | "
        f"{pct(rc['mape_recompute_roofline'])} |",
        f"| held-out batches of 2-4 prompts | {pct(rc['mape_held_out_batched'])} | | |",
        f"| fitted settings (in-sample) | {pct(rc['mape_fitted'])} | | |",
        "",
        "Swap through the executor (`PagedKVCache.swap_out` / `swap_in` of one sequence):",
        "",
        "| tokens | blocks laid out | role | bytes | copies | swap-out measured | swap-in measured | error out / in / "
        "total: fitted executor swap | profile link (latency per memcpy segment + bandwidth) | bandwidth only |",
        "|---:|---|---|---:|---:|---:|---:|---|---|---|",
    ]
    for r in sw["rows"]:
        cells = []
        for f in ("model_fit", "link", "bandwidth_only"):
            cells.append(
                f"{r[f'err_out_{f}_pct']:.1f}% / {r[f'err_in_{f}_pct']:.1f}% / {r[f'err_swap_{f}_pct']:.1f}%"
                if f"err_out_{f}_pct" in r
                else "-"
            )
        out.append(
            f"| {r['tokens']} | {r.get('layout', '-')} | {r['role']} | {r['bytes'] / 1024:.0f} KiB | "
            f"{r.get('copies', '-')} | {_fmt_s(r['swap_out_s'])} | "
            f"{_fmt_s(r['swap_in_s'])} | " + " | ".join(cells) + " |"
        )
    m = sw["held_out_mape"]
    cells = [
        f"**{m[f]['out']:.2f}% / {m[f]['in']:.2f}% / {m[f]['swap']:.2f}%**" if f in m else "-"
        for f in ("model_fit", "link", "bandwidth_only")
    ]
    out.append("| **held-out MAPE** | | | | | | | " + " | ".join(cells) + " |")
    for lay in ("contiguous", "fragmented"):
        if lay in m.get("model_fit", {}):
            cells = [
                f"{m[f][lay]['out']:.2f}% / {m[f][lay]['in']:.2f}% / {m[f][lay]['swap']:.2f}%" if f in m else "-"
                for f in ("model_fit", "link", "bandwidth_only")
            ]
            out.append(f"| held-out, {lay} | | | | | | | " + " | ".join(cells) + " |")
    fit = sw["fit"]
    out += [
        "",
        f"Fitted to the executor's swaps of this model on the fitted sizes: swap-out "
        f"{fit['d2h']['latency_us']:.1f} us + {fit['d2h'].get('per_copy_us', 0):.2f} us per copy + bytes / "
        f"{fit['d2h']['gbps']:.2f} GB/s, swap-in {fit['h2d']['latency_us']:.1f} us + "
        f"{fit['h2d'].get('per_copy_us', 0):.2f} us per copy + bytes / {fit['h2d']['gbps']:.2f} GB/s. Sentinel prefill "
        f"({e['sentinel']['prefill_tokens']} tokens) per round: "
        + ", ".join(f"{x * 1e3:.2f}" for x in e["sentinel"]["per_round_s"])
        + " ms.",
    ]
    return "\n".join(out)


def plot_per_model(key: str, e: dict, path) -> None:
    """Held-out recompute and swap of one model, measured against the predictions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rc, sw = e["recompute"], e["swap"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    one = sorted((r for r in rc["rows"] if r["batch"] == 1), key=lambda r: r["tokens"])
    t = [r["tokens"] for r in one]
    for k, lab, st in (
        ("pred_cost_model_s", f"per-model ({rc['mape_recompute']:.2f}% held out)", "-"),
        ("pred_generic_s", f"generic regressor ({rc['mape_recompute_generic']:.1f}%)", "--"),
        ("pred_roofline_s", f"calibrated roofline ({rc['mape_recompute_roofline']:.1f}%)", ":"),
    ):
        if k in one[0]:
            a.plot(t, [r[k] * 1e3 for r in one], st, label=lab)
    fit = [r for r in one if r["role"] == "fit"]
    held = [r for r in one if r["role"] == "held"]
    a.plot(
        [r["tokens"] for r in fit],
        [r["measured_s"] * 1e3 for r in fit],
        "o",
        color="0.6",
        ms=4,
        label="measured, fitted",
    )
    a.plot([r["tokens"] for r in held], [r["measured_s"] * 1e3 for r in held], "kx", ms=7, label="measured, held out")
    a.set(
        xscale="log",
        yscale="log",
        xlabel="prompt tokens (one sequence)",
        ylabel="prefill time (ms)",
        title=f"recompute of {e['name']} (executor prefill)",
    )
    a.legend(fontsize=8)
    m = sw["held_out_mape"]
    for lay, mk in (("contiguous", "o"), ("fragmented", "s")):
        rows = sorted((r for r in sw["rows"] if r["layout"] == lay), key=lambda r: r["bytes"])
        x = [r["bytes"] / 1024 for r in rows]
        b.plot(
            x, [(r["swap_out_s"] + r["swap_in_s"]) * 1e3 for r in rows], "k" + mk, mfc="none", label=f"measured, {lay}"
        )
        for f, st, lab in (
            ("model_fit", "-", "fitted executor link"),
            ("link", "--", "profile link, latency per segment"),
            ("bandwidth_only", ":", "bandwidth only"),
        ):
            if f"pred_out_{f}_s" in rows[0]:
                b.plot(
                    x,
                    [(r[f"pred_out_{f}_s"] + r[f"pred_in_{f}_s"]) * 1e3 for r in rows],
                    st,
                    color={"model_fit": "C0", "link": "C1", "bandwidth_only": "C2"}[f],
                    label=f"{lab} ({m[f]['swap']:.1f}%)" if lay == "contiguous" else None,
                )
    b.set(
        xscale="log",
        yscale="log",
        xlabel="KV bytes of the sequence (KiB)",
        ylabel="swap out + in (ms)",
        title="swap through PagedKVCache (held-out MAPE)",
    )
    b.legend(fontsize=8)
    fig.tight_layout()

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, buf.getvalue())


def report_md(hw: dict, calib: dict) -> str:
    parts = ["## Headline numbers", headline_md(hw, calib)]
    for kind, comp in calib["step_model"]["comparison"].items():
        parts += [
            f"## {kind.capitalize()} step time: held-out MAPE (%) ({comp['n_train']} train / {comp['n_test']} held out)",
            regressor_table_md(comp),
        ]
    v = calib.get("validation")
    if v:
        parts += [
            "## Swap predictor on held-out sizes",
            swap_md(v["swap"]),
            "## Recompute predictor on held-out prefills",
            recompute_md(v["recompute"]),
        ]
        sw, rc = v["swap"], v["recompute"]
        if sw.get("drift") or rc.get("drift"):
            txt = (
                "## Machine-speed drift\n\nA machine's speed wanders (on a shared VM by several percent in minutes). The swap check times the copy "
                "sweep's 64 MiB copy again in each round; the recompute check times a fixed prefill (2 x 256, 64 "
                "tokens) that the step sweep also timed before every shape. Time at the check / time during the "
                f"sweep: copy {sw.get('drift') or float('nan'):.3f}, prefill {rc.get('drift') or float('nan'):.3f}. "
                "Scaling each prediction by that ratio (what a predictor that knew the machine's current speed "
                f"would say): swap MAPE {sw.get('mape_swap_drift_corrected') or float('nan'):.2f}%, recompute "
                f"MAPE {rc.get('mape_recompute_drift_corrected') or float('nan'):.2f}%."
            )
            if v.get("drift"):
                txt += (
                    " Whole-profile sentinels (start and end of the sweeps vs. the end of the checks): "
                    + ", ".join(f"{k} {x:.3f}" for k, x in v["drift"].items())
                    + "."
                )
            parts.append(txt)
    pm = (calib.get("per_model") or {}).get("models") or {}
    if pm:
        parts.append("## Per-model predictors (sim profile --model)")
        parts += [per_model_md(k, e) for k, e in pm.items()]
    return "\n\n".join(parts) + "\n"


def main(argv=None) -> int:
    args = list(argv or sys.argv[1:])
    plot_dir = None
    if "--plot-dir" in args:  # --plot-dir DIR: a PNG per measured model, profiler-<model>.png
        i = args.index("--plot-dir")
        plot_dir = args[i + 1]
        del args[i : i + 2]
    path = args[0]
    hw = load_hardware(path)
    calib = calibration_for(hw)
    sys.stdout.write(report_md(yaml.safe_load(hw.model_dump_json()), calib))
    if plot_dir:
        for key, e in ((calib.get("per_model") or {}).get("models") or {}).items():
            plot_per_model(key, e, Path(plot_dir) / f"profiler-{e['name']}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
