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
