"""`sim zoo build|list`: the executor's model zoo (small causal LMs trained offline on the
Python standard library's source; see executor/zoo/)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from infersim.executor.zoo import DEFAULT_ZOO
from infersim.executor.zoo.shipped import MANIFEST, ship
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import check_folder_option, check_out_dir
from infersim.simulator.progress import log_line, quiet_log

from .commands import COMMANDS


def add_parser(sub) -> None:
    p = sub.add_parser(
        "zoo",
        help=COMMANDS["zoo"].help,
        description="The model zoo: a byte-level BPE tokenizer and small causal LMs (a Llama target, "
        "Llama drafts distilled from it, a small OPT) trained on the Python standard "
        "library's source, deterministic and cached ($INFERSIM_ZOO or ~/.cache/infersim/zoo).",
    )
    zsub = p.add_subparsers(dest="zoo_command", metavar="ACTION")
    zsub.required = True
    b = zsub.add_parser("build", help="train whatever of the zoo is not cached yet (a few minutes on 2 cores)")
    b.add_argument("models", nargs="*", help="only these models (and the models they are distilled from)")
    b.add_argument("--root", default=None, help="cache folder (default $INFERSIM_ZOO or ~/.cache/infersim/zoo)")
    b.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    b.set_defaults(func=run)
    sh = zsub.add_parser(
        "ship",
        help="build the zoo and the default Medusa heads of zoo-target and write them as "
        "the weights shipped with the package (executor/zoo/shipped/)",
    )
    sh.add_argument(
        "--root", default=None, help="cache folder to build in (default $INFERSIM_ZOO or ~/.cache/infersim/zoo)"
    )
    sh.add_argument(
        "--out",
        default=None,
        help="where to write the shipped zoo (default: the package's executor/zoo/shipped folder, replaced); "
        "an existing folder is replaced only when it holds a shipped zoo or with --force",
    )
    sh.add_argument("--force", action="store_true", help="replace --out even when it holds no shipped zoo")
    sh.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    sh.set_defaults(func=run)
    ls = zsub.add_parser("list", help="the zoo's models, where they are, and their measured numbers")
    ls.add_argument("--root", default=None, help="cache folder")
    ls.add_argument("--json", action="store_true", help="print the zoo manifest as JSON")
    ls.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:  # imported here, not on first use deep inside the zoo, so that their absence is one line
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401

        from infersim.executor.zoo import DEFAULT_ZOO
        from infersim.executor.zoo.build import build_zoo, zoo_dir
    except ImportError as exc:
        raise InfersimError(f'the zoo needs PyTorch, transformers and tokenizers ({exc}): pip install ".[executor]"')
    root = check_folder_option(args.root, "--root") if args.root else None
    if args.zoo_command == "ship":
        out = None
        if args.out:  # before the build, and never a folder of the user's: ship() replaces it whole
            out = Path(args.out).expanduser()
            check_out_dir(out, force=args.force or (out / MANIFEST).is_file())
        return _ship(root, out, args.quiet)
    if args.zoo_command == "build":
        log = quiet_log if args.quiet else log_line
        d = build_zoo(DEFAULT_ZOO, root=root, names=args.models or None, log=log)
        _print_table(d, args)
        return 0
    d = zoo_dir(DEFAULT_ZOO, root)
    if args.json:
        f = d / "zoo.json"
        print(f.read_text() if f.exists() else json.dumps({"key": d.name, "models": {}}))
        return 0
    _print_table(d, args)
    return 0


def _ship(root, out, quiet: bool) -> int:
    """Build (or find cached) the default zoo and zoo-target's default Medusa heads beside it,
    then copy them with their build key and checksums to the shipped folder."""
    from infersim.executor.medusa.store import ensure_heads
    from infersim.executor.models import load_model
    from infersim.executor.zoo.build import build_zoo

    log = quiet_log if quiet else log_line
    d = build_zoo(DEFAULT_ZOO, root=root, log=log)
    ensure_heads(load_model(str(d / "zoo-target"), "cpu", "fp32"), log=log)
    out = ship(d, out)
    print(f"shipped zoo {d.name}: {sum(p.stat().st_size for p in out.rglob('*') if p.is_file()) / 1e6:.1f} MB in {out}")
    return 0


def _print_table(d, args) -> None:
    t = Table(title=f"model zoo: {d}")
    for col in ("name", "role", "architecture", "params", "train s", "held-out ppl", "accept s=4", "built"):
        t.add_column(col, justify="left" if col in ("name", "role", "architecture") else "right")
    for r in DEFAULT_ZOO.models:
        f = d / r.name / "zoo.json"
        m = json.loads(f.read_text()) if f.exists() else {}
        acc = (m.get("greedy_acceptance_s4") or {}).get("acceptance")
        t.add_row(
            r.name,
            r.role,
            f"{r.arch} {r.layers} x {r.hidden}",
            f"{m['parameters'] / 1e6:.2f}M" if m else "-",
            f"{m['train_seconds']:.0f}" if m else "-",
            f"{m['heldout_perplexity']:.2f}" if m else "-",
            f"{acc:.3f}" if acc is not None else "-",
            "yes" if m else "no",
        )
    Console(width=None if sys.stdout.isatty() else 120).print(t)
