"""Markdown tables of a measured profile's numbers (for docs/findings/profiler-accuracy.md):

    python -m executor.profiler.report hwprofiles/cpu-reference.yaml
"""
from __future__ import annotations

import sys

from .regress import REGRESSORS


def _fmt_s(x: float) -> str:
    return f"{x * 1e3:.3f} ms" if x < 1 else f"{x:.3f} s"


def regressor_table_md(comp: dict) -> str:
    degs = sorted({int(d) for row in comp["table"].values() for d in row})
    best = (comp["best"]["estimator"], int(comp["best"]["degree"]))
    lines = ["| regressor - degree | " + " | ".join(str(d) for d in degs) + " |",
             "|---|" + "---:|" * len(degs)]
    for name, row in comp["table"].items():
        cells = []
        for d in degs:
            v = row[str(d)]
            s = f"{v:.2f}" if v < 1e4 else f"{v:.2g}"
            cells.append(f"**{s}**" if (name, d) == best else s)
        lines.append(f"| {REGRESSORS.get(name, name)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def headline_md(hw: dict, calib: dict) -> str:
    link = calib["host_link"]
    rows = [("achieved GEMM " + dt, f"{v * 1e3:.1f} GFLOP/s") for dt, v in hw["peak_tflops"].items()]
    rows += [("achieved memory bandwidth", f"{hw['memory_bandwidth_gbps']:.1f} GB/s ({calib['roofs']['memory_source']})"),
             ("copy host-to-device / device-to-host", f"{link['h2d_gbps']:.2f} / {link['d2h_gbps']:.2f} GB/s "
                                                      f"(latency {link['h2d_latency_us']:.1f} / {link['d2h_latency_us']:.1f} us)")]
    for c, e in hw["efficiency"].items():
        rows.append((f"efficiency {c} (compute / memory)", f"{e['compute']:.3g} / {e['memory']:.3g}"))
    rows.append(("kernel launch / iteration overhead",
                 f"{hw['overheads']['kernel_launch_us']:.3g} us / {hw['overheads']['iteration_us']:.3g} us"))
    rse = calib["roofline_step_error"]
    rows.append(("roofline MAPE on the step times (uncalibrated -> calibrated)",
                 f"{rse['uncalibrated_mape']:.1f}% -> {rse['calibrated_mape']:.1f}% ({rse['n']} steps)"))
    return "| quantity | value |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in rows)


def swap_md(sw: dict) -> str:
    lines = ["| KV of | tokens | bytes | swap-out measured / predicted | swap-in measured / predicted | "
             "error out / in / total | per-layer copies (error) | executor swap (error) |",
             "|---|---:|---:|---|---|---|---|---|"]
    for r in sw["rows"]:
        lines.append(f"| {r['model']} | {r['tokens']} | {r['bytes'] / 2**20:.1f} MiB | "
                     f"{_fmt_s(r['swap_out_s'])} / {_fmt_s(r['pred_out_s'])} | {_fmt_s(r['swap_in_s'])} / {_fmt_s(r['pred_in_s'])} | "
                     f"{r['err_out_pct']:.2f}% / {r['err_in_pct']:.2f}% / {r['err_swap_pct']:.2f}% | "
                     f"{_fmt_s(r['per_layer_swap_s'])} ({r['err_per_layer_pct']:.1f}%) | "
                     f"{_fmt_s(r['executor_swap_s'])} ({r['err_executor_pct']:.1f}%) |")
    lines.append(f"| **MAPE** | | | | | **{sw['mape_out']:.2f}% / {sw['mape_in']:.2f}% / {sw['mape_swap']:.2f}%** | "
                 f"{sw['mape_per_layer_swap']:.1f}% | {sw['mape_executor_swap']:.1f}% |")
    if sw.get("rounds", 1) > 1:
        lines.append(f"\nEach measured time is the median of {sw['rounds']} rounds over all sizes; the rounds of one "
                     f"size vary by {sw['rounds_cv_median'] * 100:.1f}% (median coefficient of variation).")
    return "\n".join(lines)


def recompute_md(rc: dict) -> str:
    lines = ["| layers x hidden | tokens | batch | measured | predicted (RegressionCostModel) | error | "
             "raw regressor error | calibrated roofline error |", "|---|---:|---:|---|---|---:|---:|---:|"]
    for r in rc["rows"]:
        shape = f"{r['layers']} x {r['hidden']}" + ("" if r.get("shape_measured", True) else " (not swept)")
        lines.append(f"| {shape} | {r['tokens']} | {r['batch']} | {_fmt_s(r['measured_s'])} | "
                     f"{_fmt_s(r['pred_regression_s'])} | {r['err_regression_pct']:.2f}% | "
                     f"{r['err_regressor_raw_pct']:.2f}% | {r['err_roofline_pct']:.1f}% |")
    def pct(x):
        return "-" if x is None else f"{x:.2f}%"

    lines.append("")
    lines.append("| MAPE over | RegressionCostModel | calibrated roofline |")
    lines.append("|---|---:|---:|")
    lines.append(f"| recompute (batch 1), all shapes | **{pct(rc['mape_recompute'])}** | {pct(rc['mape_recompute_roofline'])} |")
    lines.append(f"| recompute, swept shapes | {pct(rc['mape_recompute_swept_shapes'])} | |")
    lines.append(f"| recompute, unswept shape | {pct(rc['mape_recompute_unswept_shape'])} | |")
    lines.append(f"| batched prefill (batch 4) | {pct(rc['mape_batched_prefill'])} | |")
    lines.append(f"| every row | {pct(rc['mape_regression'])} | {pct(rc['mape_roofline'])} |")
    if rc.get("rounds", 1) > 1:
        lines.append(f"\nEach measured time is the median of {rc['rounds']} rounds over all settings; the rounds of "
                     f"one setting vary by {rc['rounds_cv_median'] * 100:.1f}% (median coefficient of variation).")
    return "\n".join(lines)


def report_md(hw: dict, calib: dict) -> str:
    parts = ["## Headline numbers", headline_md(hw, calib)]
    for kind, comp in calib["step_model"]["comparison"].items():
        parts += [f"## {kind.capitalize()} step time: held-out MAPE (%) ({comp['n_train']} train / {comp['n_test']} held out)",
                  regressor_table_md(comp)]
    v = calib.get("validation")
    if v:
        parts += ["## Swap predictor on held-out sizes", swap_md(v["swap"]),
                  "## Recompute predictor on held-out prefills", recompute_md(v["recompute"])]
        sw, rc = v["swap"], v["recompute"]
        if sw.get("drift") or rc.get("drift"):
            txt = ("## Machine-speed drift\n\nThis machine's speed wanders (a shared VM). The swap check times the copy "
                   "sweep's 64 MiB copy again in each round; the recompute check times a fixed prefill (2 x 256, 64 "
                   "tokens) that the step sweep also timed before every shape. Time at the check / time during the "
                   f"sweep: copy {sw.get('drift') or float('nan'):.3f}, prefill {rc.get('drift') or float('nan'):.3f}. "
                   "Scaling each prediction by that ratio (what a predictor that knew the machine's current speed "
                   f"would say): swap MAPE {sw.get('mape_swap_drift_corrected') or float('nan'):.2f}%, recompute "
                   f"MAPE {rc.get('mape_recompute_drift_corrected') or float('nan'):.2f}%.")
            if v.get("drift"):
                txt += (" Whole-profile sentinels (start and end of the sweeps vs. the end of the checks): "
                        + ", ".join(f"{k} {x:.3f}" for k, x in v["drift"].items()) + ".")
            parts.append(txt)
    return "\n\n".join(parts) + "\n"


def main(argv=None) -> int:
    import yaml

    from simulator.costmodel.regression import calibration_for
    from simulator.hardware.catalog import load_hardware

    path = (argv or sys.argv[1:])[0]
    hw = load_hardware(path)
    calib = calibration_for(hw)
    sys.stdout.write(report_md(yaml.safe_load(hw.model_dump_json()), calib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
