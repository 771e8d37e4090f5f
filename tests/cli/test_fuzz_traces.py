"""Fuzz: request trace files (CSV and JSONL): empty, header-only, unsorted, negative,
non-numeric, huge values, missing columns, and the trace mapping of the workload file."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from fuzz_harness import FUZZ, check, digest, invoke, write_yaml
from fuzz_values import mutated
from hypothesis import given
from hypothesis import strategies as st

CELLS = st.one_of(
    st.integers(0, 50),
    st.floats(0, 50, allow_nan=False),
    st.sampled_from(
        [-1, -0.5, 0, 10**12, 10**30, 1e300, math.nan, math.inf, "", "x", "1e3", "NaN", "-inf", "2023-11-16T18:15:46Z"]
    ),
)
COLUMNS = ["t", "p", "o"]
HEADERS = st.sampled_from([COLUMNS, ["t", "p"], ["t", "p", "o", "extra"], ["o", "t", "p"], ["T", "p", "o"]])

TRACE_WORKLOAD = {
    "name": "trace",
    "requests": {"trace": {"file": "trace.csv", "arrival_column": "t", "prompt_column": "p", "output_column": "o"}},
}


def _csv_text(header: list[str] | None, rows: list[list]) -> str:
    if header is None:
        return ""  # a 0-byte file
    lines = [",".join(header)] + [",".join("" if c is None else str(c) for c in row[: len(header)]) for row in rows]
    return "\n".join(lines) + "\n"


def _trace_case(workload: dict, trace_name: str, trace_text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / trace_name
        trace.write_text(trace_text)
        wl = write_yaml(Path(tmp) / "wl.yaml", workload)
        out = Path(tmp) / "run"
        before = digest([wl, trace])
        res = invoke(["run", "-w", wl, "-o", out, "-q", "--no-plots"])
        check(res, blame=["wl.yaml", trace_name], inputs=[wl, trace], before=before, run_dir=out)


@FUZZ
@given(st.none() | HEADERS, st.lists(st.lists(CELLS, min_size=4, max_size=4), max_size=8))
def test_csv_trace(header, rows):
    _trace_case(TRACE_WORKLOAD, "trace.csv", _csv_text(header, rows))


@FUZZ
@given(st.lists(st.dictionaries(st.sampled_from(COLUMNS + ["extra"]), CELLS, max_size=4), max_size=8), st.booleans())
def test_jsonl_trace(records, garbage_line):
    text = "\n".join(json.dumps(r) for r in records) + ("\n{not json" if garbage_line else "\n")
    wl = json.loads(json.dumps(TRACE_WORKLOAD))
    wl["requests"]["trace"]["file"] = "trace.jsonl"
    _trace_case(wl, "trace.jsonl", text)


VALID_ROWS = [[0.0, 12, 5], [0.5, 30, 8], [0.25, 7, 3], [1.5, 64, 12]]  # unsorted on purpose


@FUZZ
@given(
    mutated(
        TRACE_WORKLOAD,
        (
            "requests.count",
            "requests.duration_s",
            "requests.trace.start_row",
            "requests.trace.time_unit",
            "requests.trace.time_scale",
            "requests.trace.prompt_column_kind",
            "requests.trace.format",
        ),
    )
)
def test_mutated_trace_mapping(workload):
    _trace_case(workload, "trace.csv", _csv_text(COLUMNS, VALID_ROWS))
