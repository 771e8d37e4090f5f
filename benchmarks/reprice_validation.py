"""Re-price saved validations with this code: the fit refitted from each validation's
calibration runs (the iteration fit of a plain case, the round fit of a speculative one), the
simulation and comparison redone on its executed run, nothing executed. For each case the saved verdict (validation.json, as the code that ran it
judged it) beside the re-priced one.

    python benchmarks/reprice_validation.py DIR [DIR ...] [--out OUT] [--cases NAME ...]

DIR: a folder of saved validations (`validate-<case>/` or `<case>/`, as `sim validate --out`
and the matrix write them) or one validation folder itself. Each case's exec/ (and its repeats)
and calibration/ are copied under OUT/<case>/ (default: a temporary folder), which gets the
re-priced fit, sim/ and validation.json; the saved folders are only read.
Prints a Markdown table and writes it to OUT/reprice.md."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from infersim.analysis.validate.cases import get_case
from infersim.analysis.validate.execute import CaseOptions
from infersim.analysis.validate.run import SPECULATIVE_MODES, validate_case

REPRICED_MODES = {"plain", *SPECULATIVE_MODES}

HEADER = (
    "| case | device | per-iteration (round) MAPE saved -> re-priced | bias | total bias | throughput error | "
    "mean e2e error | swap / recompute cost | targets missed |\n|---|---|---|---|---|---|---|---|---|"
)


def saved_validations(dirs: list[Path], names: set[str]) -> list[tuple[str, Path]]:
    """(case name, folder) of every plain or speculative validation under dirs (an offload case
    fits its own cost model, which this does not re-price)."""
    found = []
    for d in dirs:
        for v in [d / "validation.json"] if (d / "validation.json").is_file() else sorted(d.glob("*/validation.json")):
            res = json.loads(v.read_text())
            if res.get("status") != "ran" or res.get("mode") not in REPRICED_MODES:
                continue
            if names and res["case"] not in names:
                continue
            found.append((res["case"], v.parent))
    return found


def summary(res: dict) -> dict:
    """The numbers the table shows, from a validation.json."""
    # the checks as the verdict judged them (a CPU run's per-iteration MAPE at its local speed)
    judged = (res.get("judged") or {}).get("checks") or res["checks"]
    checks = {c["metric"]: c for c in judged}
    cm = res["comparison"]["cost_model"]
    return {
        "other": {m: c["value"] for m, c in checks.items() if " cost (" in m},
        "mape": checks["per-iteration latency MAPE"]["value"],
        "bias": cm["bias"],
        "total_bias": cm["total_bias"],
        "throughput": checks["throughput (output tok/s)"]["value"],
        "e2e": checks["mean end-to-end latency"]["value"],
        "missed": sum(not c["ok"] for c in judged),
        "targets": len(judged),
    }


def reprice(case: str, src: Path, out: Path) -> dict:
    """The case re-priced from src's runs into out (a copy of exec/, its repeats and calibration/)."""
    saved = json.loads((src / "validation.json").read_text())
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for d in [src / "calibration", *sorted(src.glob("exec*"))]:
        shutil.copytree(d, out / d.name, ignore=shutil.ignore_patterns("speculative-fit.json", "executor-fit.json"))
    opts = CaseOptions(
        device=saved["device"],
        threads=saved.get("threads", 1),
        seed=saved["seed"],
        requests=saved["requests"],
        report=False,
        reuse_runs=True,
    )
    return validate_case(get_case(case), saved["model"], out, opts)


def costs(before: dict, after: dict) -> str:
    """The swap and recompute cost errors, saved -> re-priced ('' for a case without them)."""
    return "; ".join(
        f"{m.split(' cost')[0]} {before['other'][m]:+.1%} -> {after['other'].get(m, float('nan')):+.1%}"
        for m in before["other"]
    )


def row(case: str, device: str, before: dict, after: dict) -> str:
    def pair(key: str, fmt: str = "{:+.1%}") -> str:
        return f"{fmt.format(before[key])} -> {fmt.format(after[key])}"

    return (
        f"| {case} | {device} | {pair('mape', '{:.1%}')} | {pair('bias')} | {pair('total_bias')} | "
        f"{pair('throughput')} | {pair('e2e')} | {costs(before, after)} | "
        f"{before['missed']} -> {after['missed']} of {after['targets']} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="folders of saved validations")
    ap.add_argument(
        "--out", type=Path, default=None, help="where the re-priced copies go (default: a temporary folder)"
    )
    ap.add_argument("--cases", nargs="*", default=[], help="only these cases")
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="reprice-"))
    found = saved_validations(args.dirs, set(args.cases))
    if not found:
        print("no saved plain or speculative validations found", file=sys.stderr)
        return 2
    lines = [HEADER]
    for case, src in found:
        saved = json.loads((src / "validation.json").read_text())
        new = reprice(case, src, out / src.name)
        lines.append(row(case, saved["device"], summary(saved), summary(new)))
        print(lines[-1], flush=True)
    (out / "reprice.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"re-priced copies in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
