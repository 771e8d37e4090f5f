"""`sim medusa-train`: train (or find cached) Medusa heads on a zoo target, print their
measured top-i accuracies, optionally write them as a simulator catalog entry."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import check_folder_option, check_out_file
from infersim.simulator.progress import log_line
from infersim.simulator.validation import check_threads


def add_parser(sub, help: str) -> None:
    """`sim medusa-train`'s flags; `help` is the one-line summary the command registry keeps."""
    p = sub.add_parser(
        "medusa-train",
        help=help,
        description="Medusa-1 heads on the frozen target, self-distilled from its own greedy "
        "continuations of training-file prompts (loss weights 0.8^k); cached beside the "
        "zoo, keyed by the target's weight hash. Prints per-head top-i accuracies on "
        "held-out text. See docs/executor-medusa.md.",
    )
    p.add_argument(
        "--model", default="zoo-target", help="target: a zoo name or a Llama checkpoint folder (default zoo-target)"
    )
    p.add_argument("--heads", type=int, default=None, help="number of heads (default 4)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 500)")
    p.add_argument(
        "--shared-lm-head",
        action="store_true",
        help="heads share the target's (frozen) LM head instead of each having its own copy",
    )
    p.add_argument("--retrain", action="store_true", help="train again even if cached")
    p.add_argument("--root", default=None, help="cache folder for heads (default: <zoo>/medusa)")
    p.add_argument(
        "--catalog-out",
        default=None,
        help="also write the accuracies as a simulator table (e.g. simulator/catalog/medusa/zoo-target.yaml; default: none)",
    )
    p.add_argument("--force", action="store_true", help="replace --catalog-out if it exists")
    p.add_argument("--catalog-name", default=None, help="table name (default: the model name)")
    p.add_argument(
        "--tree-nodes", type=int, default=16, help="nodes of the greedy tree stored with the table (default 16)"
    )
    p.add_argument("--json", action="store_true", help="print medusa.json instead of a table")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.heads is not None and args.heads < 1:
        raise InfersimError(f"--heads must be at least 1, got {args.heads}")
    if args.steps is not None and args.steps < 1:
        raise InfersimError(f"--steps must be at least 1, got {args.steps}")
    if args.tree_nodes < 2:
        raise InfersimError(f"--tree-nodes must be at least 2, got {args.tree_nodes}")
    check_threads(args.threads)
    if args.root:
        check_folder_option(args.root, "--root")
    if args.catalog_out:  # before the training, not after it
        check_out_file(args.catalog_out, (".yaml", ".yml"), option="--catalog-out", force=args.force)
    try:
        import torch

        import infersim.executor  # noqa: F401  (sets OMP_WAIT_POLICY before torch's first use)
        from infersim.executor.models import load_model
    except ImportError as exc:
        raise InfersimError(f'Medusa training needs PyTorch and transformers ({exc}): pip install ".[executor]"')
    from .catalog import write_catalog
    from .store import ensure_heads
    from .train import DEFAULT_RECIPE

    torch.set_num_threads(args.threads)
    recipe = DEFAULT_RECIPE
    if args.heads is not None:
        recipe = dataclasses.replace(recipe, num_heads=args.heads)
    if args.steps is not None:
        recipe = dataclasses.replace(recipe, steps=args.steps)
    if args.shared_lm_head:
        recipe = dataclasses.replace(recipe, shared_lm_head=True)
    lm = load_model(args.model, "cpu", "fp32")
    trained_now: list[str] = []  # ensure_heads logs only when it trains

    def log(msg: str) -> None:
        trained_now.append(msg)
        log_line(msg)

    _, meta, folder = ensure_heads(
        lm, recipe, root=Path(args.root).expanduser() if args.root else None, retrain=args.retrain, log=log
    )
    if args.catalog_out:
        out = write_catalog(
            Path(args.catalog_out), meta, args.catalog_name or Path(str(args.model)).name, args.tree_nodes
        )
        print(f"wrote {out}")
    if args.json:
        print(json.dumps(meta, indent=2, sort_keys=True))
        return 0
    _print(meta, folder, cached=not trained_now)
    return 0


def _print(meta: dict, folder, cached: bool = False) -> None:
    from .accuracy import top_i

    con = Console()
    lm_head = "sharing the target's LM head" if meta.get("shared_lm_head") else "each with its own LM head"
    con.print(
        f"Medusa heads for [bold]{meta['target']}[/] ({meta['num_heads']} heads, {lm_head}, "
        f"{meta.get('parameters_per_head', 0) / 1e3:.0f}k parameters each) in {folder}"
    )
    con.print(
        ("loaded from the cache; " if cached else "")
        + f"trained in {meta['train_seconds']:.0f} s (+{meta['data_seconds']:.0f} s self-distillation data) "
        f"on {meta['train_positions']} positions; final loss {meta['final_loss']:.3f}"
    )
    for reading, what in (
        ("greedy", "on the target's greedy continuation of held-out prompts"),
        ("text", "teacher-forced on held-out text"),
    ):
        acc = top_i(meta["accuracies"][reading]["per_rank"])
        t = Table(title=f"top-i accuracy, {what}")
        t.add_column("head")
        cols = [i for i in (1, 2, 3, 5, 10) if i <= acc.shape[1]]  # all ten do not fit a terminal
        for i in cols:
            t.add_column(f"top-{i}", justify="right")
        for k, row in enumerate(acc):
            t.add_row(str(k + 1), *[f"{row[i - 1]:.3f}" for i in cols])
        con.print(t)
