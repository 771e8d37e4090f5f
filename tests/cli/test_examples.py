"""Every file in examples/ works in a fresh clone: workloads run a few requests through `sim run`,
sweep spaces and plan files validate; the built-in trace replays run a few requests too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from infersim.cli.main import main
from infersim.simulator.workload.builder import list_workloads

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FILES = sorted(EXAMPLES.rglob("*.yaml"))


def _kind(path: Path) -> str:
    keys = set(yaml.safe_load(path.read_text()))
    return "workload" if "requests" in keys else "space" if "parameters" in keys else "plan"


def _run_few(workload: str, out: Path, n: int = 6) -> dict:
    assert main(["run", "-w", workload, "-n", str(n), "-o", str(out), "-q", "--no-plots"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] == n and summary["finished"] == n
    return summary


def test_examples_cover_every_kind():
    assert {_kind(p) for p in FILES} == {"workload", "space", "plan"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_example_validates_and_runs(path, tmp_path):
    kind = _kind(path)
    if kind == "workload":
        _run_few(str(path), tmp_path / "run")
    elif kind == "space":
        from infersim.analysis.sweep import load_space

        assert load_space(path).parameters
    else:
        from infersim.analysis.plan import load_plan_file

        load_plan_file(path)


@pytest.mark.parametrize("name", [n for n in list_workloads() if n.startswith("replay-")])
def test_trace_replay_runs(name, tmp_path):
    _run_few(name, tmp_path / "run")
