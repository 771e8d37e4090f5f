"""What a reproduction's headline numbers were on the datasheet roofline and what they are now.

A reproduction keeps the rows of its run on the pure datasheet roofline (every efficiency 1.0,
no launch overhead, unfused projections) beside its own CSV as `<stem>.datasheet.csv.gz`.
Each script names its headline quantities once, as functions of its rows; this module
evaluates them on both runs and writes the comparison section of the report, so a re-run on a
refined cost model restates what moved without anyone editing the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

REFERENCE_SUFFIX = ".datasheet.csv.gz"


@dataclass(frozen=True)
class Headline:
    """One quantity of a report: `value(rows)` gives it from the rows of the script's CSV `table`
    (its stem; None: the report's main CSV)."""

    label: str
    value: Callable[[pd.DataFrame], float | str]
    fmt: str = "{:.2f}"
    table: str | None = None


def reference_path(out: Path, stem: str) -> Path:
    return out / f"{stem}{REFERENCE_SUFFIX}"


def _cell(h: Headline, rows: pd.DataFrame) -> tuple[str, float | None]:
    try:
        v = h.value(rows)
    except (KeyError, IndexError, ValueError):  # a quantity the other run did not produce
        return "-", None
    if isinstance(v, str):
        return v, None
    return h.fmt.format(v), float(v)


def moved_section(
    tables: dict[str, pd.DataFrame],
    out: Path,
    headlines: list[Headline],
    heading: str = "## What moved against the datasheet roofline",
) -> str:
    """The report's comparison section: `tables` maps each CSV's stem to this run's rows, the first
    being the main one ('' when a datasheet run's rows are not there)."""
    refs = {stem: reference_path(out, stem) for stem in tables}
    if not all(p.exists() for p in refs.values()):
        return ""
    old_rows = {stem: pd.read_csv(p) for stem, p in refs.items()}
    main = next(iter(tables))
    kept = ", ".join(f"`{p.name}`" for p in refs.values())
    lines = [
        heading,
        "",
        f"The same study on the pure datasheet roofline (every efficiency 1.0, no kernel launch cost, "
        f"unfused Q/K/V and gate/up projections), kept in {kept}, against this run on the calibrated "
        f"profiles (fitted GEMM and elementwise models, fused projections):",
        "",
        "| quantity | datasheet roofline | calibrated | calibrated / datasheet |",
        "|---|---|---|---|",
    ]
    for h in headlines:
        stem = h.table or main
        (old, a), (new, b) = _cell(h, old_rows[stem]), _cell(h, tables[stem])
        ratio = f"{b / a:.2f}" if a and b is not None else "-"
        lines.append(f"| {h.label} | {old} | {new} | {ratio} |")
    return "\n".join(lines) + "\n"
