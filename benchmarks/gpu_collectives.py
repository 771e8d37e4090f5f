"""How well the fitted NCCL collective times predict measurements they were not fitted on.
Writes benchmarks/RESULTS-gpu-collectives.md.

Data: the collectives table derived from microsoft/vidur's profiling data (MIT License,
Copyright (c) Microsoft Corporation, https://github.com/microsoft/vidur), found in the
shipped table `benchmarks/data/gpu-kernels/collectives.csv.gz` or one given with --table.

For every setup and collective:
  - by worker count: each (workers, devices per node) is dropped from the section and
    predicted from the rest (the nearest measured count, rescaled as the cost model does);
  - by size range: each octave of message sizes is dropped from each fit in turn and
    predicted by the fit of the others (reported by coarser size ranges);
  - the datasheet model (the profile's interconnect: a ring at its bandwidth plus its latency)
    on the same rows, and a noise floor: the error of the median of each size's eight nearest
    measured sizes, which no smooth model beats where the measurements jump between levels.

Usage: python benchmarks/gpu_collectives.py [--table PATH] [--update-profiles]
  --update-profiles writes the fitted sections at the end of the shipped GPU profiles instead
  of the evaluation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from infersim.simulator.calibration.calibrate import SECTION_HEADERS
from infersim.simulator.calibration.profile_writer import with_sections
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.hardware.collectives import CollectivesSection, ring_traffic, topology_of
from infersim.simulator.hardware.collectives_fit import (
    FitOptions,
    fit_collectives,
    fit_one,
    read_collectives_table,
)
from infersim.simulator.hardware.profile import HardwareProfile
from infersim.simulator.paths import hwprofiles_dir
from infersim.simulator.yamlio import load_mapping, validate, write_atomic

HERE = Path(__file__).resolve().parent
OUT = HERE / "RESULTS-gpu-collectives.md"
MEASURED_TABLE = HERE / "data" / "gpu-kernels" / "collectives.csv.gz"
SOURCE = (
    "microsoft/vidur profiling data (data/profiling/network/, commit 7d47513), MIT License, "
    "Copyright (c) Microsoft Corporation, https://github.com/microsoft/vidur"
)
# the shipped profile each setup's section goes to, and the profile whose datasheet interconnect it is compared with
SHIPPED = {"a100_dgx": "a100-80gb-sxm", "h100_dgx": "h100-sxm", "a40_pairwise_nvlink": "a40"}
DATASHEET = {"a100": "a100-80gb-sxm", "h100": "h100-sxm", "a40": "a40"}
BANDS_BYTES = [
    (0, 256 * 2**10, "< 256 KiB"),
    (256 * 2**10, 2 * 2**20, "256 KiB - 2 MiB"),
    (2 * 2**20, 16 * 2**20, "2 - 16 MiB"),
    (16 * 2**20, 128 * 2**20, "16 - 128 MiB"),
    (128 * 2**20, float("inf"), ">= 128 MiB"),
]


def errors_pct(pred: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    signed = (pred - y) / y * 100.0
    return float(np.abs(signed).mean()), float(signed.mean())


def noise_floor(y: np.ndarray, half: int = 4) -> np.ndarray:
    """Each size predicted by the median of its `2*half` nearest neighbours (itself left out)."""
    out = np.empty_like(y)
    for i in range(len(y)):
        lo, hi = max(0, i - half), min(len(y), i + half + 1)
        out[i] = np.median(np.delete(y[lo:hi], i - lo))
    return out


def datasheet_s(collective: str, nbytes: np.ndarray, workers: int, setup: str) -> np.ndarray:
    ic = load_hardware(DATASHEET[setup.split("_")[0]]).interconnect
    traffic = ring_traffic(workers) if collective == "all_reduce" else 1.0
    return ic.latency_us * 1e-6 + traffic * nbytes / (ic.bandwidth_gbps * 1e9)


def group_rows(table: pd.DataFrame, setup: str, collective: str):
    rows = table[(table.setup == setup) & (table.collective == collective)]
    for (workers, per_node), g in rows.groupby(["num_workers", "devices_per_node"]):
        yield int(workers), int(per_node), g["nbytes"].to_numpy(np.float64), g["time_s"].to_numpy(np.float64)


def by_workers(section: CollectivesSection, table: pd.DataFrame, collective: str) -> list[dict]:
    out = []
    for workers, per_node, x, y in group_rows(table, section.setup, collective):
        fit = next(f for f in section.fits(collective) if (f.workers, f.devices_per_node) == (workers, per_node))
        rest = section.model_copy(update={collective: [f for f in section.fits(collective) if f is not fit]})
        held = rest.time_s(collective, x, workers, per_node)
        borrowed = rest.lookup(collective, workers, per_node)
        between = rest.bracket(collective, workers, per_node)
        row = {
            "workers": workers,
            "per_node": per_node,
            "topology": fit.topology,
            "rows": len(y),
            "fit": errors_pct(fit.time_s(x), y),
            "datasheet": errors_pct(datasheet_s(collective, x, workers, section.setup), y),
            "noise": errors_pct(noise_floor(y), y),
        }
        same_link = borrowed is not None and borrowed[0].topology == fit.topology
        row["held"] = errors_pct(held, y) if same_link else None
        row["from"] = (
            f"between {between[0].workers}/{between[0].devices_per_node} and {between[1].workers}/{between[1].devices_per_node}"
            if between is not None
            else f"from {borrowed[0].workers}/{borrowed[0].devices_per_node}"
            if same_link
            else "only count on this link"
        )
        out.append(row)
    return out


def octaves_held_out(x: np.ndarray, y: np.ndarray, options: FitOptions, fields: dict) -> np.ndarray:
    """Each octave of message sizes ([2^k, 2^(k+1)) bytes) predicted by a fit of all other sizes."""
    octave = np.floor(np.log2(x)).astype(int)
    pred = np.empty_like(y)
    for k in np.unique(octave):
        inside = octave == k
        pred[inside] = fit_one(x[~inside], y[~inside], options, **fields).time_s(x[inside])
    return pred


def by_size(setup: str, table: pd.DataFrame, collective: str, options: FitOptions) -> tuple[list[dict], dict]:
    """Per size band, all worker counts together: in-sample fit, octave held out, datasheet,
    noise floor; and each worker count's octave-held-out error."""
    acc = {label: {k: ([], []) for k in ("fit", "held", "datasheet", "noise")} for *_, label in BANDS_BYTES}
    per_group = {}
    for workers, per_node, x, y in group_rows(table, setup, collective):
        fields = dict(
            workers=workers, devices_per_node=per_node, topology=topology_of(setup, workers, per_node), fitted_on="-"
        )
        full = fit_one(x, y, options, **fields)
        floor = noise_floor(y)
        sheet = datasheet_s(collective, x, workers, setup)
        held = octaves_held_out(x, y, options, fields)
        per_group[(workers, per_node)] = errors_pct(held, y)
        for lo, hi, label in BANDS_BYTES:
            inside = (x >= lo) & (x < hi)
            if not inside.any():
                continue
            preds = {
                "fit": full.time_s(x[inside]),
                "datasheet": sheet[inside],
                "noise": floor[inside],
                "held": held[inside],
            }
            for key, pred in preds.items():
                acc[label][key][0].append(pred)
                acc[label][key][1].append(y[inside])
    rows = []
    for *_, label in BANDS_BYTES:
        if not acc[label]["fit"][0]:
            continue
        row = {"band": label, "rows": sum(len(a) for a in acc[label]["fit"][1])}
        for key, (preds, ys) in acc[label].items():
            row[key] = errors_pct(np.concatenate(preds), np.concatenate(ys)) if preds else None
        rows.append(row)
    return rows, per_group


def fmt(pair) -> str:
    return "n/a" if pair is None else f"{pair[0]:.1f}% ({pair[1]:+.1f}%)"


def report(table: pd.DataFrame, options: FitOptions) -> tuple[str, dict[str, CollectivesSection]]:
    lines = [
        "# NCCL collectives: fitted vs datasheet, held out",
        "",
        "Written by `python benchmarks/gpu_collectives.py` from the collectives table derived from",
        f"{SOURCE}. Times are medians over ranks; message bytes = 2 x elements (fp16).",
        "Each cell is MAPE (signed bias; positive = predicts slower). `noise floor`: each size predicted",
        "by the median of its 8 nearest measured sizes; where it is high the measured medians jump",
        "between levels from one size to the next and no model of size alone does better.",
        "",
    ]
    head, lines = lines, []
    sections, summary = {}, []
    for setup in sorted(table.setup.unique()):
        section = fit_collectives(table, setup, source=SOURCE, options=options)
        sections[setup] = section
        lines += [f"## {setup}", ""]
        for collective in ("all_reduce", "send_recv"):
            if not section.fits(collective):
                lines += [
                    f"No {collective} rows for this setup: the cost model prices it from the datasheet "
                    "interconnect.",
                    "",
                ]
                continue
            rows = by_workers(section, table, collective)
            bands, per_group = by_size(setup, table, collective, options)
            for r in rows:
                r["octaves"] = per_group[(r["workers"], r["per_node"])]
            lines += [
                f"### {collective}: by worker count",
                "",
                "| workers/per node | topology | rows | fit (in sample) | octaves held out | worker count held "
                "out (borrowed from) | datasheet | noise floor |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for r in rows:
                lines.append(
                    f"| {r['workers']}/{r['per_node']} | {r['topology']} | {r['rows']} | {fmt(r['fit'])} | "
                    f"{fmt(r['octaves'])} | {fmt(r['held'])} ({r['from']}) | {fmt(r['datasheet'])} | "
                    f"{fmt(r['noise'])} |"
                )
            lines += [
                "",
                f"### {collective}: by message size (all worker counts)",
                "",
                "| size range | rows | fit (in sample) | octave held out | datasheet | noise floor |",
                "|---|---|---|---|---|---|",
            ]
            for b in bands:
                lines.append(
                    f"| {b['band']} | {b['rows']} | {fmt(b['fit'])} | {fmt(b['held'])} | "
                    f"{fmt(b['datasheet'])} | {fmt(b['noise'])} |"
                )
            lines.append("")
            summary.append((setup, collective, rows, bands))
    return "\n".join(head + summary_lines(summary) + lines) + "\n", sections


def weighted(rows: list[dict], key: str) -> float | None:
    rows = [r for r in rows if r[key] is not None]
    return sum(r[key][0] * r["rows"] for r in rows) / sum(r["rows"] for r in rows) if rows else None


def summary_lines(summary) -> list[str]:
    out = [
        "## Summary",
        "",
        "MAPE over all rows of the setup, and over the worker counts within one node (the "
        "placements tensor parallelism uses up to 8 GPUs).",
        "",
        "| setup | collective | fit, all | octaves held out, all | octaves held out, in node | "
        "worker count held out, in node (worst) | datasheet, all |",
        "|---|---|---|---|---|---|---|",
    ]
    pct = lambda v: "-" if v is None else f"{v:.1f}%"  # noqa: E731
    for setup, collective, rows, _ in summary:
        node = [r for r in rows if r["per_node"] == r["workers"]]
        held = [r for r in node if r["held"] is not None]
        worst = max(held, key=lambda r: r["held"][0]) if held else None
        w_text = "-" if worst is None else f"{worst['workers']}/{worst['per_node']}: {worst['held'][0]:.1f}%"
        out.append(
            f"| {setup} | {collective} | {pct(weighted(rows, 'fit'))} | {pct(weighted(rows, 'octaves'))} | "
            f"{pct(weighted(node, 'octaves'))} | {w_text} | {pct(weighted(rows, 'datasheet'))} |"
        )
    return out + ["", *target_lines(summary), "", NOTES]


def target_lines(summary) -> list[str]:
    """The issue's all-reduce target (<= 10% MAPE held out by size range or by worker count),
    over the placements tensor parallelism uses within a node."""
    sizes, counts = [], []
    for setup, collective, rows, _ in summary:
        if collective != "all_reduce":
            continue
        node = [r for r in rows if r["per_node"] == r["workers"]]
        sizes.append((setup, weighted(node, "octaves")))
        counts += [(setup, r) for r in node if r["held"] is not None]
    size_ok = [v for _, v in sizes if v is not None and v <= 10.0]
    count_ok = [r for _, r in counts if r["held"][0] <= 10.0]
    met = lambda ok, n: "met" if len(ok) == n else "MISSED"  # noqa: E731
    return [
        "## Targets",
        "",
        f"- all-reduce <= 10% MAPE, size octaves held out, within a node: {met(size_ok, len(sizes))} "
        f"({len(size_ok)} of {len(sizes)} setups: "
        + ", ".join(f"{setup} {v:.1f}%" for setup, v in sizes if v is not None)
        + ")",
        f"- all-reduce <= 10% MAPE, worker count held out, within a node: {met(count_ok, len(counts))} "
        f"({len(count_ok)} of {len(counts)} counts: "
        + ", ".join(f"{setup} {r['workers']}/{r['per_node']} {r['held'][0]:.1f}%" for setup, r in counts)
        + ")",
    ]


NOTES = """## Where the 10% all-reduce target is missed, and why

- Messages below about 2 MiB: the measured medians jump between two levels from one size to
  the next (the noise-floor column: the median of a size's neighbours misses by as much as any
  model). These are latency-bound sizes, a few tens of microseconds, where a smooth function of
  the size cannot follow the measurement; the fit's errors there sit at or near the noise floor.
  The in-node rows from 2 MiB up are fitted to a few percent.
- Worker counts held out within a node: a count between two measured ones (4 between 2 and 8)
  is interpolated linearly in log2(workers) at each size: 11.3% on the A100, 8.6% on the H100
  (borrowing the nearest count instead, bandwidth term rescaled by the ring traffic 2(w-1)/w,
  latency kept: 14.0% and 14.8%). The ends (2 and 8) have one side only and borrow the nearest
  count, rescaled: 10.7-17.2%, mostly below 2 MiB, where latency does not follow the ring's step
  count (on the H100 eight workers are faster than four below 2 MiB). Measured and dropped for the
  ends: extrapolating linearly in log2(workers) from the two nearest counts (times or logs of
  times: 15-30%, the H100's 2/2 small sizes +90%); latency linear in log2(workers) with the
  nearest count's rescaled bandwidth term (13-32%); 2 workers as 2 x send/recv of half the
  message (25-43%); rescaling the latency by (w-1) too, or not rescaling the bandwidth (1.5-5x
  the error). Every count that tensor parallelism uses within a node (2, 4, 8) is measured and
  used as fitted.
- Across nodes (DGX counts with fewer devices per node than workers): every measured placement
  spans two nodes with 1-8 GPUs each; the bandwidth grows with the GPUs (and NICs) per node,
  not by the ring factor, so a held-out count misses by 14-81% (interpolated between the
  placements beside it, 4/2 and 8/4; borrowed, 2/1 and 16/8), and
  octaves held out miss where the times step (4/2 and 16/8 above 16 MiB). Only 16/8 matters to
  tensor parallelism, and it is measured.
- The A40 setup measured send/recv only: its all-reduce stays on the datasheet interconnect.
"""


def update_profiles(sections: dict[str, CollectivesSection]) -> None:
    for setup, name in SHIPPED.items():
        path = hwprofiles_dir() / f"{name}.yaml"
        text = with_sections(
            path.read_text(),
            {"collectives": sections[setup].model_dump(mode="json")},
            header=SECTION_HEADERS["collectives"],
        )
        write_atomic(path, text)
        validate(HardwareProfile, load_mapping(path), str(path))
        print(f"wrote the {setup} section to {path.name}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--table",
        type=Path,
        help="collectives table (default: the shipped benchmarks/data/gpu-kernels/collectives.csv.gz)",
    )
    ap.add_argument(
        "--update-profiles",
        action="store_true",
        help="write the fitted sections into the shipped GPU profiles (no evaluation)",
    )
    args = ap.parse_args(argv)
    table_path = args.table or MEASURED_TABLE
    try:
        table = read_collectives_table(table_path)
    except InfersimError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.update_profiles:
        update_profiles({setup: fit_collectives(table, setup, source=SOURCE) for setup in SHIPPED})
        return 0
    text, _ = report(table, FitOptions())
    write_atomic(OUT, text)
    print(f"wrote {OUT.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
