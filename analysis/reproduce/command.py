"""The command line every reproduction starts from."""

from __future__ import annotations

import argparse
import os


def reproduction_parser(module: str, doc: str, quick_help: str, *, jobs: bool = False) -> argparse.ArgumentParser:
    """`python -m MODULE` with the first paragraph of `doc` as its description, --quick (a
    reduced set, `quick_help` says which) and --out (default docs/findings); with `jobs`, --jobs
    (worker processes)."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--out", default="docs/findings", help="output folder (default docs/findings)")
    if jobs:
        ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: all cores)")
    return ap
