"""`sim sweep`: explore a space of serving configurations (grid or Optuna), resumable."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console

from infersim.analysis.sweep import SweepOptions, build_params, load_space, pareto_mask, run_sweep
from infersim.simulator.errors import InfersimError
from infersim.simulator.validation import positive_int

from .catalog import show_catalog
from .commands import COMMANDS
from .run import add_memory_flag, add_out_flags, backend_options


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help=COMMANDS["sweep"].help,
        description="Simulate every configuration of a space (any dotted workload path is a parameter), as a grid "
        "or with Optuna, and write one table (results.parquet/.csv) with one row per configuration, a "
        "Pareto front and sensitivity plots. Each result is its own file: run the same command again "
        "to resume a sweep that was interrupted.",
    )
    p.add_argument("--workload", "-w", required=True, help="built-in workload name or a workload YAML file")
    p.add_argument("--space", "-s", required=True, type=Path, help="the space YAML (see examples/sweep/)")
    add_out_flags(p, "sweep folder (default: sweeps/<space name>)", replaces=False)
    p.add_argument("--workers", type=int, default=None, help="parallel simulations (default: one per core)")
    p.add_argument(
        "--backend", choices=("local", "ray"), default="local", help="local processes or a Ray cluster (default local)"
    )
    p.add_argument("--address", default=None, help="Ray cluster address (default: start a local Ray instance)")
    p.add_argument(
        "--trials", type=int, default=None, help="Optuna: number of configurations (default: the space's optuna.trials)"
    )
    p.add_argument("--retry-failed", action="store_true", help="simulate failed configurations again")
    p.add_argument(
        "--no-plots", action="store_true", help="skip the plots (an earlier summary's, now out of date, are removed)"
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress or table")
    add_memory_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.trials is not None:
        positive_int(args.trials, "--trials")
    if args.workers is not None:
        positive_int(args.workers, "--workers")
    space = load_space(args.space)
    if args.trials is not None and space.method != "optuna":
        raise InfersimError(f"--trials is the trial budget of an Optuna space; {args.space} is a {space.method}")
    res = run_sweep(
        args.workload,
        space,
        args.out,
        run=backend_options(args),
        options=SweepOptions(
            retry_failed=args.retry_failed, trials=args.trials, plots=not args.no_plots, force=args.force
        ),
        source=str(args.space),
    )
    if not args.quiet:
        _print(res, space)
    if len(res.table) and res.failed == len(res.table):
        # nothing to compare (a misspelt parameter path fails every configuration): say so by status
        if args.quiet:
            reason = res.table["error"].astype(str).value_counts().index[0]
            print(f"every configuration failed ({res.failed}); the first reason: {reason}", file=sys.stderr)
        return 3
    return 0


def _print(res, space) -> None:
    c = Console()
    df = res.table
    tp, lat = space.pareto.throughput, space.pareto.latency
    params = [p.path for p in build_params(space)]
    if len(df) and tp in df.columns and lat in df.columns:
        front = df[pareto_mask(df[[tp, lat]].astype(float).to_numpy(), [True, False])].sort_values(lat)
        columns = params + [tp, lat]
        rows = [
            (
                str(row["index"]),
                *(f"{row[col]:.4g}" if isinstance(row[col], float) else str(row[col]) for col in columns),
            )
            for _, row in front.head(15).iterrows()
        ]
        # every value whole, as the catalogs print theirs: a table where it fits, else a block per
        # configuration, led by its index in results.csv
        show_catalog(
            f"Pareto front: {tp} (up) against {lat} (down)",
            ["index", *(_heading(col, params) for col in columns)],
            rows,
            numeric_from=0,
            console=c,
        )
    c.print(
        f"{len(df)} configuration{'s' if len(df) != 1 else ''}: {res.computed} simulated now, {res.cached} already done, "
        f"{res.failed} failed; {res.backend}; {res.wall_s:.1f} s"
    )
    if res.failed:  # the reasons, not only their count: a misspelt parameter path fails every configuration
        reasons = df.loc[df["status"] == "failed", "error"].astype(str).value_counts()
        for reason, n in reasons.head(3).items():
            c.print(f"failed ({n}): {reason}", markup=False, highlight=False, soft_wrap=True)
    c.print(
        f"table: {res.sweep_dir / 'results.parquet'} (and results.csv, pareto.csv, sensitivity.csv, report.md, plots/)"
    )


def _heading(column: str, params: list[str]) -> str:
    """A parameter's last path part (`max_batch_size`); where other parameters end the same way
    (two drafts' `alpha`), its path past the part they all share (`0.acceptance.alpha`)."""
    if column not in params:
        return column
    last = column.split(".")[-1]
    alike = [p.split(".") for p in params if p.split(".")[-1] == last]
    if len(alike) == 1:
        return last
    shared = len(os.path.commonprefix(alike))
    return ".".join(column.split(".")[shared:])
