"""`sim run` with pipeline parallelism: the stage timeline and its plot in the run folder, and
bad splits refused in one line naming the file and the field, before anything is written."""

from __future__ import annotations

import json

import numpy as np
from fuzz_harness import TINY_WORKLOAD, invoke, write_yaml

from infersim.simulator.metrics.rundir import read_columns


def test_pipelined_run_writes_its_stage_timeline(tmp_path):
    wl = dict(TINY_WORKLOAD, hardware={**TINY_WORKLOAD["hardware"], "pipeline_parallel": 2})
    out = tmp_path / "run"
    res = invoke(["run", "-w", write_yaml(tmp_path / "pp2.yaml", wl), "-o", out])
    assert res.rc == 0, res.stderr
    assert "pp=2" in res.stdout
    t = read_columns(out / "stages.parquet")
    assert set(t) == {"replica", "stage", "virtual_engine", "t_start_s", "t_end_s"}
    assert set(t["stage"]) == {0, 1} and set(t["virtual_engine"]) <= {0, 1}
    for s in (0, 1):  # a stage takes one batch at a time
        a, b = t["t_start_s"][t["stage"] == s], t["t_end_s"][t["stage"] == s]
        assert np.all(b > a) and np.all(a[1:] >= b[:-1])
    assert (out / "plots" / "stages.png").is_file()
    summary = json.loads((out / "summary.json").read_text())
    busy = summary["pipeline"]["replicas"][0]["stage_busy_s"]
    assert np.allclose(busy, [np.sum((t["t_end_s"] - t["t_start_s"])[t["stage"] == s]) for s in (0, 1)], rtol=1e-12)


def test_bad_split_is_one_line_and_writes_nothing(tmp_path):
    wl = dict(TINY_WORKLOAD, hardware={**TINY_WORKLOAD["hardware"], "pipeline_parallel": 40})
    res = invoke(["run", "-w", write_yaml(tmp_path / "pp40.yaml", wl), "-o", tmp_path / "r"])
    assert res.rc == 2 and len(res.error_lines) == 1 and "Traceback" not in res.stderr
    assert "pp40.yaml: field 'hardware.pipeline_parallel'" in res.error_lines[0]
    assert "40 stages exceed llama-2-7b's 32 layers" in res.error_lines[0]
    assert not (tmp_path / "r").exists()
