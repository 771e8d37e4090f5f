"""`hardware.all_reduce` and `sim roofline --all-reduce` from the command line: a run with the
custom kernel is deterministic and faster than with NCCL where it applies, and every bad choice
is one line naming the file (or flag) and the field, exit status 2, nothing written."""

from __future__ import annotations

import json

from fuzz_harness import TINY_WORKLOAD, invoke, write_yaml


def _workload(**hardware):
    return dict(TINY_WORKLOAD, hardware={**TINY_WORKLOAD["hardware"], **hardware})


def _latency(tmp_path, name, **hardware):
    out = tmp_path / name
    res = invoke(["run", "-w", write_yaml(tmp_path / f"{name}.yaml", _workload(**hardware)), "-o", out])
    assert res.rc == 0, res.stderr
    return json.loads((out / "summary.json").read_text()), out


def test_custom_kernel_run_is_deterministic_and_faster_than_nccl(tmp_path):
    tp2 = {"profile": "h100-sxm", "tensor_parallel": 2}
    nccl, _ = _latency(tmp_path, "nccl", all_reduce="nccl", **tp2)
    auto, out = _latency(tmp_path, "auto", all_reduce="auto", **tp2)
    again, _ = _latency(tmp_path, "again", all_reduce="auto", **tp2)
    assert auto == again
    assert auto["tpot_s"]["mean"] < nccl["tpot_s"]["mean"]
    assert "all_reduce: auto" in (out / "config.yaml").read_text()


def _one_line(res, text):
    assert res.rc == 2 and len(res.error_lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert text in res.error_lines[0], res.error_lines[0]


def test_unknown_choice_is_one_line(tmp_path):
    path = write_yaml(tmp_path / "bad.yaml", _workload(all_reduce="fast"))
    res = invoke(["run", "-w", path, "-o", tmp_path / "r"])
    _one_line(res, "bad.yaml: field 'hardware.all_reduce'")
    assert not (tmp_path / "r").exists()


def test_custom_where_it_cannot_run_is_refused_up_front(tmp_path):
    pcie = write_yaml(tmp_path / "pcie.yaml", _workload(tensor_parallel=2, all_reduce="custom"))
    res = invoke(["run", "-w", pcie, "-o", tmp_path / "r"])
    _one_line(
        res,
        "pcie.yaml: field 'hardware.all_reduce': custom all-reduce cannot run here: hardware profile 'a100-80gb-pcie'",
    )
    nodes = _workload(profile="h100-sxm", tensor_parallel=8, all_reduce="custom", cluster={"gpus_per_node": 4})
    res = invoke(["run", "-w", write_yaml(tmp_path / "nodes.yaml", nodes), "-o", tmp_path / "r"])
    _one_line(
        res,
        "nodes.yaml: field 'hardware.all_reduce': custom all-reduce cannot run here: the tensor-parallel group spans nodes",
    )
    assert not (tmp_path / "r").exists()


def test_roofline_flag(tmp_path):
    res = invoke(["roofline", "--hardware", "a100-80gb-pcie", "--tp", "4", "--all-reduce", "custom"])
    _one_line(res, "--all-reduce: custom all-reduce cannot run here")
    res = invoke(["roofline", "--all-reduce", "fastest"])
    assert res.rc == 2 and "invalid choice" in res.stderr
    args = ["roofline", "--model", "llama-3-70b", "--hardware", "h100-sxm", "--tp", "8", "--phase", "decode"]
    times = {}
    for kind in ("nccl", "auto"):
        csv = tmp_path / f"{kind}.csv"
        res = invoke([*args, "--batch", "8", "--seq", "1024", "--all-reduce", kind, "--csv", csv])
        assert res.rc == 0, res.stderr
        times[kind] = csv.read_text()
    assert times["nccl"] != times["auto"]
