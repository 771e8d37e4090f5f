"""`sim medusa`: Medusa Appendix G.3, predicted speedup of tree decoding vs candidate count,
batch size and sequence length (Figs. 21-23), from the roofline cost model."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from infersim.analysis.medusa_study import (
    MedusaStudyOptions,
    MedusaSweeps,
    best_candidates,
    standard_sweeps,
    study_notes,
    write_study,
)
from infersim.analysis.roofline import check_batch_memory
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import check_out_dir, claimed_dir

from .commands import COMMANDS
from .roofline import POW2_BATCHES, POW2_SEQ_LENS, add_cost_options, parse_ints, resolve_cost_options
from .run import add_out_flags

POW2_CANDIDATES = "1,2,4,8,16,32,64,128,256"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "medusa",
        help=COMMANDS["medusa"].help,
        description="Predict Medusa's speedup = acceleration rate / overhead, where overhead is the time of one "
        "verification pass over the candidate tokens divided by a plain decode step (roofline cost "
        "model). Prints the candidate sweep at --batch/--seq and writes medusa_study.csv and three "
        "plots into --out: rate, speedup and normalized latency vs candidates (Fig. 21), speedup per "
        "batch size (Fig. 22) and per sequence length (Fig. 23).",
    )
    add_cost_options(p)
    p.add_argument("--batch", type=int, default=1, help="sequences per step for the candidate sweep (default 1)")
    p.add_argument(
        "--seq",
        type=int,
        default=1024,
        help="cached tokens per sequence for the candidate and batch sweeps (default 1024)",
    )
    p.add_argument(
        "--candidates",
        default=POW2_CANDIDATES,
        help=f"comma list of candidate tokens per step, the root included (default {POW2_CANDIDATES})",
    )
    p.add_argument(
        "--rate-model",
        choices=("log", "tree"),
        default="log",
        help="log: the paper's fit, rate = 0.477 ln(candidates), at least 1; tree: expected accepted "
        "length of a sparse tree from head accuracies (default log)",
    )
    p.add_argument(
        "--accuracies",
        default=None,
        help="head-accuracy table for --rate-model tree: a built-in name or a YAML file "
        "(default vicuna-7b: the Medusa paper's head accuracies, mc_sim_7b_63 tree)",
    )
    p.add_argument(
        "--block",
        choices=("model", "paper"),
        default="model",
        help="model: whole-model iterations; paper: the paper's simplified block, one layer of "
        "q/k/v_proj, QK^T, PV, up/gate/down_proj (default model)",
    )
    p.add_argument(
        "--attention",
        choices=("fused", "unfused"),
        default=None,
        help="attention kernel: default unfused for --block paper (Table 5 traffic), fused for model",
    )
    p.add_argument(
        "--batches",
        default=POW2_BATCHES,
        help=f"comma list of batch sizes for the Fig. 22 sweep (default {POW2_BATCHES})",
    )
    p.add_argument(
        "--seqs",
        default=POW2_SEQ_LENS,
        help=f"comma list of sequence lengths for the Fig. 23 sweep (default {POW2_SEQ_LENS})",
    )
    p.add_argument("--seq-batch", type=int, default=4, help="batch size of the Fig. 23 sweep (default 4, as the paper)")
    add_out_flags(p, "output folder for the CSV and plots (default medusa-study/)", replaces=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = args.out or Path("medusa-study")
    check_out_dir(out, force=args.force, command="medusa")
    if args.accuracies is not None and args.rate_model != "tree":
        raise InfersimError("--accuracies is the head-accuracy table of --rate-model tree; add --rate-model tree")
    cands = parse_ints(args.candidates, "candidates")
    batch = parse_ints(str(args.batch), "batch")[0]
    seq = parse_ints(str(args.seq), "seq")[0]
    seq_batch = parse_ints(str(args.seq_batch), "seq-batch")[0]
    batches = parse_ints(args.batches, "batches")
    check_batch_memory([batch, seq_batch, *batches], "--batch/--batches/--seq-batch", args.no_memory_check)
    cost = resolve_cost_options(args)
    sweeps = MedusaSweeps(
        batch=batch,
        seq_len=seq,
        candidates=cands,
        batches=batches,
        seq_lens=parse_ints(args.seqs, "seqs"),
        seq_sweep_batch=seq_batch,
    )
    model, hardware = cost.pop("model"), cost.pop("hardware")
    options = MedusaStudyOptions(
        rate_model=args.rate_model,
        accuracies=args.accuracies or "vicuna-7b",
        block=args.block,
        attention=args.attention,
        **cost,
    )
    df = standard_sweeps(model, hardware, sweeps, options)
    main = df[df["sweep"] == "candidates"]
    first = main.iloc[0]
    console = Console()
    best_q = int(main.loc[main["speedup"].idxmax(), "candidates"])
    table = Table(
        title=f"Medusa on {first['model']} / {first['hardware']}: batch {batch}, seq {seq}, "
        f"{args.block} block, {first['attention']} attention, {args.rate_model} rate"
    )
    for col in ("candidates", "rate", "decode ms", "verify ms", "overhead", "speedup"):
        table.add_column(col, justify="right")
    for _, r in main.iterrows():
        style = "bold green" if int(r["candidates"]) == best_q else None
        table.add_row(
            str(r["candidates"]),
            f"{r['acceleration_rate']:.3f}",
            f"{r['decode_time_s'] * 1e3:.4g}",
            f"{r['verify_time_s'] * 1e3:.4g}",
            f"{r['overhead']:.3f}",
            f"{r['speedup']:.3f}",
            style=style,
        )
    console.print(table)
    top = main[main["candidates"] == best_q].iloc[0]
    console.print(
        f"best at batch {batch}, seq {seq}: {best_q} candidates, speedup {top['speedup']:.3f}x "
        f"(rate {top['acceleration_rate']:.3f} / overhead {top['overhead']:.3f})",
        style="bold",
    )

    for sweep, by, title in (
        ("batch", "batch", f"best per batch size (seq {seq})"),
        ("seq_len", "seq_len", f"best per sequence length (batch {seq_batch})"),
    ):
        best = best_candidates(df[df["sweep"] == sweep])
        t = Table(title=title)
        for col in (by.replace("_len", ""), "best candidates", "speedup", "overhead"):
            t.add_column(col, justify="right")
        for _, r in best.iterrows():
            t.add_row(str(r[by]), str(r["candidates"]), f"{r['speedup']:.3f}", f"{r['overhead']:.3f}")
        console.print(t)
    for note in study_notes(model, hardware, options, df):
        console.print(note, style="yellow")

    with claimed_dir(out, command="medusa", force=args.force) as folder:
        paths = write_study(df, folder)
    console.print(
        f"wrote {paths['csv']} ({len(df)} rows), {paths['fig21'].name}, {paths['fig22'].name}, "
        f"{paths['fig23'].name} in {paths['csv'].parent}"
    )
    return 0
