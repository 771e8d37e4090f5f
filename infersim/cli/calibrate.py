"""`sim calibrate`: fit a hardware profile's kernel time models from measured tables (see
docs/profiling.md, "sim calibrate")."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from infersim.simulator.calibration.calibrate import PROFILE_SUFFIXES, CalibrateOptions, calibrate
from infersim.simulator.metrics.rundir import check_out_file

from .commands import COMMANDS


def add_parser(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help=COMMANDS["calibrate"].help,
        description="Reads measured kernel tables (per-layer operator medians as microsoft/vidur publishes them, "
        "vidur's own mlp.csv, or the generic CSV of docs/profiling.md), fits the GEMM time model "
        "(memory- and compute-bound limits, the corner between them, tile and wave quantisation, a launch "
        "floor) and one time model per elementwise kernel (norm, activation, rotary, residual add, "
        "embedding; a launch floor, a rate, and the token count that fills the GPU) "
        "against the base profile's peaks, and writes the base profile with a `calibration:` section "
        "recording each fitted value's source, rows and fit error, and beside it the GEMM rows' medians "
        "(PROFILE.gemm-shapes.csv.gz: GEMMs of a measured width take the measured/model ratio).",
    )
    p.add_argument("tables", nargs="+", metavar="TABLE.csv", help="measured tables (kind recognised by the header)")
    p.add_argument(
        "--hardware",
        required=True,
        metavar="PROFILE",
        help="base profile (name or YAML path): peaks, memory and links the fit keeps",
    )
    p.add_argument(
        "--device",
        default=None,
        help="the tables' device label to fit (e.g. a100); needed when a table holds several devices "
        "or has no device column",
    )
    p.add_argument(
        "--source",
        default=None,
        help="who measured the tables, recorded with every fitted value (default: the file names)",
    )
    p.add_argument("--out", required=True, metavar="PROFILE.yaml", help="profile to write")
    p.add_argument(
        "--name",
        default=None,
        help="the profile's name, as commands print it (default: the --out file's stem); a name other than the "
        "base profile's drops the base's aliases",
    )
    p.add_argument(
        "--plot",
        default=None,
        metavar="FIT.png",
        help="also draw the fit on its own rows (predicted / measured against tokens, one panel per kernel kind, "
        "+-5%% and +-10%% bands) to this PNG or SVG",
    )
    p.add_argument(
        "--force", action="store_true", help="replace --out (its .gemm-shapes.csv.gz and --plot) if they exist"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_out_file(args.out, PROFILE_SUFFIXES, option="--out", force=args.force)  # as typed: `x.yaml/` is a folder
    opts = CalibrateOptions(
        tables=[Path(t) for t in args.tables],
        hardware=args.hardware,
        device=args.device,
        source=args.source,
        out=Path(args.out),
        force=args.force,
        plot=Path(args.plot) if args.plot else None,
        name=args.name,
    )
    result = calibrate(opts)
    for line in result.summary_lines():
        print(line)
    for note in result.notes:
        print(note, file=sys.stderr)
    return 0
