"""`sim plan` over tensor x pipeline parallelism: candidates cross the degrees, GPUs count
every stage, and a split whose stage does not fit is reported with the stage's numbers."""

import math

import pytest

from infersim.analysis.plan import (
    CandidateResult,
    PlanFile,
    PlanFlags,
    PlanResult,
    SearchSection,
    _Search,
    build_candidates,
    check_candidates,
    parse_slo,
    plan,
    verdict,
)
from infersim.analysis.sweep_backends import BackendOptions
from infersim.simulator.errors import InfersimError
from infersim.simulator.workload.schema import WorkloadSpec
from tests.utils import requests_section

WORKLOAD = """\
name: pp-plan
model: llama-2-70b
hardware: {profile: a100-40gb}
serving: {max_model_len: 2048}
requests:
  count: 100
  arrival: {type: poisson, rate: 1.0}
  prompt_tokens: {type: fixed, value: 200}
  output_tokens: {type: fixed, value: 40}
seed: 2
"""


def test_candidates_cross_tp_and_pp():
    spec = WorkloadSpec.model_validate({"requests": requests_section(1, 1, 1)})
    cands = build_candidates(spec, ["h100-sxm"], [4, 8], {}, {}, [1, 2])
    assert [c.label for c in cands] == [
        "h100-sxm tp4 pp1",
        "h100-sxm tp4 pp2",
        "h100-sxm tp8 pp1",
        "h100-sxm tp8 pp2",
    ]
    assert cands[3].overrides["hardware.pipeline_parallel"] == 2 and cands[3].pipeline_parallel == 2


def test_plan_counts_every_stage_and_reports_a_stage_that_does_not_fit(tmp_path):
    wl = tmp_path / "pp-plan.yaml"
    wl.write_text(WORKLOAD)
    res = plan(
        str(wl),
        slos=parse_slo("ttft_p99=5s,tpot_p99=300ms"),
        plan_file=PlanFile(search=SearchSection(requests=60, tolerance=0.25)),
        flags=PlanFlags(tensor_parallel=[2], pipeline_parallel=[1, 4], prices={"a100-40gb": 1.0}, target_rate=1.0),
        run=BackendOptions(workers=1),
    )
    by = {c.label: c for c in res.candidates}
    # 70B in fp16 is 138 GB: 69 GB per GPU at TP 2 does not fit a 40 GB card, 17 GB at TP 2 x PP 4 does
    bad = by["a100-40gb tp2 pp1"]
    assert bad.status == "failed" and "does not fit" in bad.error
    ok = by["a100-40gb tp2 pp4"]
    assert ok.status == "ok" and ok.gpus_per_replica == 8
    assert ok.gpus == ok.replicas * 8
    # cost at the target: price x GPUs x 1e6 / (3600 x target x mean output tokens)
    assert math.isclose(ok.cost_per_m_output_tokens, 1.0 * ok.gpus * 1e6 / (3600 * 1.0 * 40), rel_tol=1e-9)


def test_the_verdict_names_a_tensor_parallel_group_across_nodes():
    """A candidate whose TP group is larger than the workload's nodes (16 on 8-GPU nodes) is
    ranked like any other, and the verdict says that its all-reduces cross the network."""
    ok = CandidateResult("h100-sxm tp16", "h100-sxm", 16, {}, None, goodput_rps=1.0)
    inside = CandidateResult("h100-sxm tp8 pp2", "h100-sxm", 8, {}, None, goodput_rps=2.0, pipeline_parallel=2)
    res = PlanResult("w", "llama-3.1-405b", parse_slo("tpot_p99=100ms"), None, SearchSection(), 0, [ok, inside])
    notes = [line for line in verdict(res) if "spans" in line]
    assert notes == [
        "h100-sxm tp16: the tensor-parallel group of 16 GPUs spans 2 nodes of 8: its all-reduces cross the "
        "inter-node network (tensor parallel inside a node and pipeline parallel across nodes avoids that)."
    ]


def test_expert_parallel_crossed_with_tp_reports_the_pairs_that_do_not_match():
    """--tp 2,4 with --option hardware.expert_parallel=1,2,4 on Mixtral: EP spreads experts over
    the TP group, so (tp 2, ep 4) and (tp 4, ep 2) cannot run; they become failed rows naming
    why, the four others are searched. A grid of nothing but such pairs is refused in one line."""
    spec = WorkloadSpec.model_validate(
        {"model": "mixtral-8x7b", "hardware": {"profile": "h100-sxm"}, "requests": requests_section(10, 100, 10)}
    )
    base = spec.model_dump(mode="json")
    cands = build_candidates(spec, ["h100-sxm"], [2, 4], {"hardware.expert_parallel": [1, 2, 4]}, {})
    check_candidates(cands, base, "wl.yaml", SearchSection(), 1, False)
    refused = {c.label: c.refused for c in cands if c.refused}
    assert refused == {
        "h100-sxm tp2 expert_parallel=4": "expert_parallel 4 needs tensor_parallel 4 (experts are spread over the "
        "tensor-parallel group)",
        "h100-sxm tp4 expert_parallel=2": "expert_parallel 2 needs tensor_parallel 2 (experts are spread over the "
        "tensor-parallel group)",
    }
    gen = _Search(cands[2], base, ".", parse_slo("tpot_p99=50ms"), SearchSection(), None, 0, {}).run()
    with pytest.raises(StopIteration) as stop:
        next(gen)
    assert stop.value.value.status == "failed" and "needs tensor_parallel 4" in stop.value.value.error
    only_bad = build_candidates(spec, ["h100-sxm"], [2], {"hardware.expert_parallel": [4]}, {})
    with pytest.raises(InfersimError, match="wl.yaml: field 'hardware.expert_parallel': expert_parallel 4 needs"):
        check_candidates(only_bad, base, "wl.yaml", SearchSection(), 1, False)
