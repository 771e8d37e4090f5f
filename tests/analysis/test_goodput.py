"""Goodput of colocated vs disaggregated deployments (`sim plan --disaggregation`): DistServe's
direction on two small configurations of llama-2-7b on two A100s (the docs' examples with short
runs), the attainment count by hand, the deployments a GPU count gives, and bad input."""

import json
from pathlib import Path

import numpy as np
import pytest

from infersim.analysis.goodput import build_deployments, slo_attainment
from infersim.analysis.goodput_config import GoodputSection
from infersim.cli.main import main
from infersim.simulator.errors import InfersimError
from tests.utils import one_line_error, write_yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "disaggregation"


def _plan(tmp_path, workload: str, slo: dict, start_rate: float) -> dict:
    plan = write_yaml(
        tmp_path / "plan.yaml",
        {
            "slo": slo,
            "disaggregation": {"gpus": 2, "attainment": 0.9},
            "search": {"requests": 100, "min_duration_s": 8, "tolerance": 0.2, "start_rate": start_rate},
        },
    )
    out = tmp_path / "out"
    assert (
        main(["plan", "-w", str(EXAMPLES / workload), "--plan", str(plan), "-o", str(out), "-q", "--workers", "1"]) == 0
    )
    assert (out / "goodput.md").exists() and (out / "goodput.png").exists()
    return json.loads((out / "goodput.json").read_text())


def _per_gpu(res: dict, kind: str) -> float:
    return max(d["goodput_rps"] / d["gpus"] for d in res["deployments"] if d["kind"] == kind)


def test_disaggregation_wins_with_long_prompts_and_tight_slos(tmp_path):
    res = _plan(tmp_path, "long-prompts.yaml", {"ttft_p90": "300ms", "tpot_p90": "15ms"}, 2.0)
    assert res["winner"] == "disaggregated"
    assert _per_gpu(res, "disaggregated") > 1.1 * _per_gpu(res, "colocated")


def test_colocation_wins_with_short_prompts_and_loose_tpot(tmp_path):
    res = _plan(tmp_path, "short-prompts.yaml", {"ttft_p90": "1s", "tpot_p90": "150ms"}, 32.0)
    assert res["winner"] == "colocated"
    assert _per_gpu(res, "colocated") > 1.3 * _per_gpu(res, "disaggregated")


def test_attainment_counts_requests_meeting_every_slo():
    req = {
        "arrival_s": np.zeros(4),
        "first_scheduled_s": np.zeros(4),
        "first_token_s": np.array([0.1, 0.5, 0.1, 0.1]),
        "finish_s": np.array([1.1, 1.5, 5.1, 0.1]),
        "output_tokens": np.array([11.0, 11.0, 11.0, 1.0]),
        "aborted": np.zeros(4),
    }
    # TPOTs 0.1, 0.1, 0.5 and none (one token): request 1 misses TTFT, request 2 misses TPOT
    assert slo_attainment(req, {"ttft_s": 0.2, "tpot_s": 0.2}) == 0.5
    req["aborted"][0] = 1
    assert slo_attainment(req, {"ttft_s": 0.2, "tpot_s": 0.2}) == 0.25


def test_deployments_of_the_same_gpus():
    deps = build_deployments(GoodputSection(gpus=8, tensor_parallel=2))
    assert [d.label for d in deps] == [
        "colocated 4x tp2",
        "disaggregated 1P:3D tp2",
        "disaggregated 2P:2D tp2",
        "disaggregated 3P:1D tp2",
    ]
    assert {d.gpus for d in deps} == {8}
    with pytest.raises(InfersimError, match="disaggregation.splits"):
        build_deployments(GoodputSection(gpus=4, splits=["1:2"]))
    with pytest.raises(InfersimError, match="disaggregation.gpus"):
        build_deployments(GoodputSection(gpus=3, tensor_parallel=2))


@pytest.mark.parametrize(
    "argv,field",
    [
        (["--disaggregation", "1", "--slo", "ttft_p90=1s"], "disaggregation.gpus"),
        (["--disaggregation", "2", "--slo", "itl_p90=1s"], "itl_p90"),
        (["--disaggregation", "2"], "SLO"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, argv, field):
    out = tmp_path / "out"
    rc = main(["plan", "-w", str(EXAMPLES / "long-prompts.yaml"), "-o", str(out), "-q", *argv])
    assert rc == 2
    assert field in one_line_error(capsys)
    assert not out.exists()


LLAMA3_70B_TP4 = {
    "name": "chat-70b",
    "model": "llama-3-70b",
    "hardware": {"profile": "h100-sxm", "tensor_parallel": 4},
    "requests": {
        "count": 60,
        "arrival": {"type": "poisson", "rate": 4.0},
        "prompt_tokens": {"type": "fixed", "value": 400},
        "output_tokens": {"type": "fixed", "value": 40},
    },
}


def test_disaggregated_pools_replace_the_workloads_parallelism():
    """The pools carry replicas and tensor parallelism; a workload sized at TP 4 validates as
    each deployment (it was refused: 'with disaggregated, give replicas and tensor_parallel per pool')."""
    from infersim.analysis.sweep import resolve_config
    from infersim.simulator.workload.schema import WorkloadSpec

    deps = build_deployments(GoodputSection(gpus=8, tensor_parallel=4))
    assert [d.label for d in deps] == ["colocated 2x tp4", "disaggregated 1P:1D tp4"]
    spec = WorkloadSpec.model_validate(resolve_config(LLAMA3_70B_TP4, deps[1].overrides))
    d = spec.hardware.disaggregated
    assert (spec.hardware.tensor_parallel, d.prefill.tensor_parallel, d.decode.tensor_parallel) == (1, 4, 4)


def test_tp_defaults_to_the_workloads_and_follows_the_flag(tmp_path, capsys):
    wl = write_yaml(tmp_path / "chat-70b.yaml", LLAMA3_70B_TP4)
    plan = write_yaml(tmp_path / "plan.yaml", {"search": {"requests": 60, "min_duration_s": 4, "tolerance": 0.5}})
    out = tmp_path / "out"
    base = ["plan", "-w", str(wl), "--plan", str(plan), "-q", "--workers", "1", "--slo", "ttft_p90=2s,tpot_p90=100ms"]
    assert main([*base, "--disaggregation", "8", "-o", str(out)]) == 0
    res = json.loads((out / "goodput.json").read_text())
    assert [d["label"] for d in res["deployments"]] == ["colocated 2x tp4", "disaggregated 1P:1D tp4"]
    assert all(d["status"] == "ok" and d["goodput_rps"] > 0 for d in res["deployments"])
    # no link given: each TP 4 pool's four per-GPU adapters at the cluster's 50 GB/s
    assert (res["kv_link"]["bandwidth_gbps"], res["kv_link"]["adapters"]) == (200.0, 4)
    assert "KV link 200 GB/s = 4 x 50 GB/s per-GPU adapters, 5 µs" in (out / "goodput.md").read_text()
    # one H100 cannot hold Llama-3-70B's 141 GB: refused before any search, nothing written
    assert main([*base, "--disaggregation", "4", "--tp", "1", "-o", str(tmp_path / "b")]) == 2
    err = one_line_error(capsys)
    assert "chat-70b.yaml as colocated 4x tp1" in err and "141.1 GB of weights per GPU" in err
    assert main([*base, "--disaggregation", "8", "--tp", "2,4", "-o", str(tmp_path / "c")]) == 2
    assert "--tp" in one_line_error(capsys)
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
