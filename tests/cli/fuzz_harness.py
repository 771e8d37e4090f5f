"""What the fuzz tests share: `sim` run in process, and the property every input must satisfy.

The property: exit 0 with a complete run folder, or exit 2 with one line on stderr naming the
file or flag at fault; never a traceback, never a partial or temporary folder, never a
change to a file the user gave."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

import yaml
from hypothesis import HealthCheck, settings

from infersim.cli.main import main

# Every fuzz test runs this many generated cases, the same ones in every run (derandomize);
# INFERSIM_FUZZ_EXAMPLES=1000 searches deeper.
EXAMPLES = int(os.environ.get("INFERSIM_FUZZ_EXAMPLES", 25))
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

RUN_FILES = ("config.yaml", "requests.parquet", "series.parquet", "summary.json")

# A valid workload small enough that a fuzz case simulates in milliseconds.
TINY_WORKLOAD = {
    "name": "tiny",
    "model": "llama-2-7b",
    "hardware": {"profile": "a100-80gb-pcie", "replicas": 1, "tensor_parallel": 1},
    "serving": {
        "scheduler": "fcfs",
        "preemption": "recompute",
        "max_batch_size": 16,
        "block_size": 16,
        "gpu_memory_utilization": 0.9,
        "swap_space_gb": 4.0,
    },
    "requests": {
        "count": 6,
        "arrival": {"type": "poisson", "rate": 5.0},
        "prompt_tokens": {"type": "uniform", "low": 4, "high": 64},
        "output_tokens": {"type": "fixed", "value": 8},
    },
    "seed": 0,
}


@dataclass
class Outcome:
    rc: int
    stderr: str
    stdout: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip() and not line.startswith("notice:")]


def invoke(argv: list[str]) -> Outcome:
    """`sim ARGV` in this process, its output captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse's usage errors
            rc = exc.code if isinstance(exc.code, int) else 1
    return Outcome(rc, err.getvalue(), out.getvalue())


def digest(paths: list[Path]) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


def write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False) if not isinstance(data, str) else data)
    return path


def check(
    outcome: Outcome, *, blame: list[str], inputs: list[Path], before: dict[str, str], run_dir: Path | None = None
) -> None:
    """The fuzz property. `blame`: the file names and flags an error may name (at least one)."""
    assert "Traceback" not in outcome.stderr, outcome.stderr
    if outcome.rc in (0, 3):  # 3: completed, but no request (run) or configuration (sweep) succeeded
        for name in RUN_FILES if run_dir is not None else ():
            assert (run_dir / name).is_file(), f"incomplete run folder: no {name}"
    else:
        assert outcome.rc == 2, f"exit {outcome.rc}: {outcome.stderr[-2000:]}"
        lines = outcome.error_lines
        assert len(lines) == 1, f"not one line: {outcome.stderr!r}"
        assert any(b in lines[0] for b in blame), f"names none of {blame}: {lines[0]}"
        if run_dir is not None:
            assert not run_dir.exists(), f"a failed run left {run_dir}"
    if run_dir is not None:
        leftovers = [p.name for p in run_dir.parent.iterdir() if p.name.startswith(".") and "tmp" in p.name]
        assert not leftovers, f"temporary folders left: {leftovers}"
    assert digest(inputs) == before, "an input file was changed"


def refused(argv: list, *needles: str) -> str:
    """`sim ARGV` ends in exit 2 with one line on stderr holding every needle; returns the line."""
    res = invoke(argv)
    assert res.rc == 2, res.stderr
    assert len(res.error_lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for n in needles:
        assert n in res.error_lines[0], res.error_lines[0]
    return res.error_lines[0]


def tree(folder: Path) -> dict[str, str]:
    """Every file (sha256) and folder ("dir") under `folder`: what a refusal must leave as it was."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def refused_untouched(argv: list, folder: Path, *needles: str) -> str:
    """`refused`, and nothing under `folder` written, changed or removed."""
    before = tree(folder)
    line = refused(argv, *needles)
    assert tree(folder) == before, "a refused command changed the files"
    return line
