"""`sim plan` with data-parallel attention: a candidate is a group of N one-GPU ranks sharing the
experts, so its probes run whole groups, its replicas are groups and its GPUs groups x N; it
is listed beside the tensor-parallel candidates, and a size dp_rules refuses ends the plan in
one line naming the plan file's field (or the flag)."""

import math

import pandas as pd
import pytest

from infersim.analysis.plan import (
    CandidateResult,
    PlanFile,
    PlanFlags,
    PlanResult,
    Probe,
    SearchSection,
    _replicas_text,
    _Search,
    build_candidates,
    check_candidates,
    parse_slo,
    plan,
    verdict,
)
from infersim.analysis.sweep_backends import BackendOptions
from infersim.cli.main import main
from infersim.simulator.errors import InfersimError
from infersim.simulator.workload.schema import WorkloadSpec
from tests.utils import requests_section

# Qwen1.5-MoE-A2.7B (14.3B parameters, 60 experts) is the smallest mixture of experts in the
# catalog; dp_rules accepts groups of 2 and 4 (60 experts, 8-GPU nodes). Fixed lengths make the
# mean output exactly 40 tokens.
MODEL = "qwen1.5-moe-a2.7b"
WORKLOAD = """\
name: moe-plan
model: qwen1.5-moe-a2.7b
hardware: {profile: h100-sxm, tensor_parallel: 2, expert_parallel: 2}
serving: {max_model_len: 2048}
requests:
  count: 100
  arrival: {type: poisson, rate: 20.0}
  prompt_tokens: {type: fixed, value: 300}
  output_tokens: {type: fixed, value: 40}
seed: 3
"""
SLO = "ttft_p99=300ms,tpot_p99=25ms"
TARGET = 300.0
PRICE = 3.0
# small probes: the test checks the layout's accounting, not the goodput's precision
SEARCH = SearchSection(requests=60, tolerance=0.3, min_duration_s=3, max_requests=2000)


def _spec(**hardware) -> WorkloadSpec:
    hw = {"profile": "h100-sxm", **hardware}
    return WorkloadSpec.model_validate({"model": MODEL, "hardware": hw, "requests": requests_section(10, 100, 10)})


@pytest.fixture
def workload(tmp_path):
    p = tmp_path / "moe-plan.yaml"
    p.write_text(WORKLOAD)
    return str(p)


def test_dp_attention_layouts_sit_beside_tp_layouts_with_their_labels_and_overrides():
    spec = _spec(tensor_parallel=2, expert_parallel=2)
    options = {"serving.max_batch_size": [64, 128], "hardware.expert_parallel": [2]}
    cands = build_candidates(spec, ["h100"], [2], options, {"h100-sxm": PRICE}, None, [2, 4])
    assert [c.label for c in cands] == [
        "h100-sxm tp2 max_batch_size=64",
        "h100-sxm tp2 max_batch_size=128",
        "h100-sxm dp-attn 2 max_batch_size=64",
        "h100-sxm dp-attn 2 max_batch_size=128",
        "h100-sxm dp-attn 4 max_batch_size=64",
        "h100-sxm dp-attn 4 max_batch_size=128",
    ]
    tp, dp4 = cands[0], cands[4]
    # beside DP layouts a TP layout runs without DP attention, whatever the workload says
    assert tp.overrides["hardware.data_parallel_attention"] is False and tp.dp_attention == 0
    # the layout fixes TP 1, PP 1 and EP N: the option's expert_parallel applies to TP layouts only
    assert dp4.overrides == {
        "hardware.profile": "h100",
        "hardware.tensor_parallel": 1,
        "hardware.pipeline_parallel": 1,
        "hardware.data_parallel_attention": True,
        "hardware.expert_parallel": 4,
        "hardware.replicas": 4,
        "serving.max_batch_size": 64,
    }
    assert (dp4.dp_attention, dp4.tensor_parallel, dp4.pipeline_parallel, dp4.price) == (4, 1, 1, PRICE)
    # without DP layouts the labels are what they were
    assert [c.label for c in build_candidates(spec, ["h100-sxm"], [1], {}, {})] == ["h100-sxm"]


def test_a_group_is_the_unit_of_probes_gpus_and_text():
    spec = _spec()
    tp1, cand = build_candidates(spec, ["h100-sxm"], [], {}, {}, None, [4])
    assert (tp1.label, cand.label) == ("h100-sxm tp1", "h100-sxm dp-attn 4")  # the workload's layout stays
    search = _Search(cand, spec.model_dump(mode="json"), ".", parse_slo(SLO), SEARCH, None, 0, {"type": "poisson"})
    hw = search.task(Probe(rate=10.0, replicas=3, requests=90))["config"]["hardware"]
    assert (hw["replicas"], hw["expert_parallel"], hw["router"]) == (12, 4, "least_outstanding")
    one_group = search.task(Probe(rate=10.0, replicas=1, requests=30))["config"]["hardware"]
    assert (one_group["replicas"], one_group["router"]) == (4, "least_outstanding")  # 4 ranks behind a router

    dp = CandidateResult("h100-sxm dp-attn 8", "h100-sxm", 1, {}, PRICE, goodput_rps=40.0, dp_attention=8)
    tp = CandidateResult("h100-sxm tp8", "h100-sxm", 8, {}, PRICE, goodput_rps=30.0)
    assert dp.gpus_per_replica == 8 == tp.gpus_per_replica
    dp.replicas, dp.gpus, dp.verified = 2, 16, True
    assert _replicas_text(dp) == "16 GPUs = 2 × DP-attn 8"
    res = PlanResult("w", MODEL, parse_slo(SLO), 80.0, SearchSection(), 0, [tp, dp])
    assert "(2 groups × DP-attn 8)" in verdict(res)[0]


def test_option_form_makes_a_group_and_mismatched_degrees_are_reported(tmp_path):
    """`--option hardware.data_parallel_attention=true` crossed with --tp 1,2: the TP 1 candidate
    becomes a group of the workload's expert_parallel ranks; TP 2 cannot run DP attention and is
    a failed row; a grid of nothing but such pairs is refused in one line."""
    spec = _spec(expert_parallel=4)
    base = spec.model_dump(mode="json")
    cands = build_candidates(spec, ["h100-sxm"], [1, 2], {"hardware.data_parallel_attention": [True]}, {})
    check_candidates(cands, base, "wl.yaml", SEARCH, 1, False)
    one, two = cands
    assert (one.dp_attention, one.overrides["hardware.replicas"], one.refused) == (4, 4, "")
    assert two.refused == (
        "data_parallel_attention needs tensor_parallel 1 and pipeline_parallel 1, not 2 and 1 (each rank is one GPU)"
    )
    only_bad = build_candidates(spec, ["h100-sxm"], [2], {"hardware.data_parallel_attention": [True]}, {})
    with pytest.raises(
        InfersimError, match="^wl.yaml: field 'hardware.data_parallel_attention': data_parallel_attention needs"
    ):
        check_candidates(only_bad, base, "wl.yaml", SEARCH, 1, False)


def test_a_small_moe_plan_lists_dp_attention_beside_tp_with_gpus_by_hand(workload):
    res = plan(
        workload,
        slos=parse_slo(SLO),
        plan_file=PlanFile(search=SEARCH),
        flags=PlanFlags(data_parallel_attention=[2], prices={"h100-sxm": PRICE}, target_rate=TARGET),
        run=BackendOptions(workers=2, quiet=True),
    )
    by = {c.label: c for c in res.candidates}
    assert set(by) == {"h100-sxm tp2", "h100-sxm dp-attn 2"}
    tp, dp = by["h100-sxm tp2"], by["h100-sxm dp-attn 2"]
    for c in (tp, dp):
        assert c.status == "ok" and c.verified and c.mean_output_tokens == 40.0
        assert c.replicas_initial == math.ceil(TARGET / c.goodput_rps)
        assert c.gpus == c.replicas * 2  # a TP 2 replica and a group of 2 ranks are 2 GPUs each
        # price x GPUs x 1e6 / (3600 x target x 40 output tokens)
        assert math.isclose(c.cost_per_m_output_tokens, PRICE * c.gpus * 1e6 / (3600 * TARGET * 40), rel_tol=1e-12)
    # the probes of the group ran one group per replica, and its verification as many groups
    assert {p.replicas for p in dp.probes if p.kind != "verify"} == {1}
    assert [p.replicas for p in dp.probes if p.kind == "verify"] == [dp.replicas]
    # the numbers of this seed: 80 req/s per TP 2 replica (4 for 300 req/s), 113 per group (3)
    assert (tp.replicas, tp.gpus, dp.replicas, dp.gpus) == (4, 8, 3, 6)
    assert res.best() is dp


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("sim plan: error: "), err
    return err.removeprefix("sim plan: error: ")


def test_sizes_dp_rules_refuses_end_the_plan_in_one_line(workload, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["plan", "-w", workload, "--slo", SLO, "-o", str(out), "-q"]
    pf = tmp_path / "plan.yaml"
    pf.write_text("data_parallel_attention: [2, 8]\n")
    assert main(args + ["--plan", str(pf)]) == 2
    assert _one_line(capsys) == (
        f"{pf}: field 'data_parallel_attention': dp-attn 8: field 'hardware.expert_parallel': 8 does not "
        f"divide the 60 experts of '{MODEL}'"
    )
    assert main(args + ["--dp-attention", "3"]) == 2  # divides 60, not the 8-GPU nodes
    assert _one_line(capsys) == (
        "--dp-attention: dp-attn 3: field 'hardware.expert_parallel': 3 neither divides "
        "hardware.cluster.gpus_per_node 8 nor is a multiple of it"
    )
    assert main(args + ["--dp-attention", "1"]) == 2
    assert _one_line(capsys) == (
        "--dp-attention: dp-attn 1: field 'hardware.expert_parallel': data_parallel_attention needs at least 2 "
        "ranks sharing the experts"
    )
    dense = tmp_path / "dense.yaml"
    dense.write_text(WORKLOAD.replace(MODEL, "llama-2-7b").replace(", expert_parallel: 2", ""))
    assert main(["plan", "-w", str(dense), "--slo", SLO, "-o", str(out), "-q", "--dp-attention", "2"]) == 2
    assert _one_line(capsys) == (
        "--dp-attention: dp-attn 2: field 'hardware.data_parallel_attention': needs a mixture-of-experts model; "
        "'llama-2-7b' has no experts"
    )
    assert main(args + ["--dp-attention", "2", "--disaggregation", "4"]) == 2
    assert "--dp-attention" in _one_line(capsys)
    assert main(args + ["--dp-attention", "2,x"]) == 2
    assert _one_line(capsys) == "bad --dp-attention '2,x': give integers, e.g. 1,2"
    assert not out.exists()


def test_the_overlap_option_multiplies_the_dp_attention_candidates_only():
    """`--option hardware.two_batch_overlap=false,true,auto` beside --tp 2 and --dp-attention 2:
    one TP candidate (the option means nothing there, so it runs without it and keeps its label)
    and three groups; a workload that sets the overlap itself leaves the TP candidate without it."""
    spec = _spec(tensor_parallel=2, expert_parallel=2)
    options = {"hardware.two_batch_overlap": [False, True, "auto"]}
    cands = build_candidates(spec, ["h100-sxm"], [2], options, {}, None, [2])
    assert [c.label for c in cands] == [
        "h100-sxm tp2",
        "h100-sxm dp-attn 2 two_batch_overlap=False",
        "h100-sxm dp-attn 2 two_batch_overlap=True",
        "h100-sxm dp-attn 2 two_batch_overlap=auto",
    ]
    assert "hardware.two_batch_overlap" not in cands[0].overrides
    assert [c.overrides["hardware.two_batch_overlap"] for c in cands[1:]] == [False, True, "auto"]
    check_candidates(cands, spec.model_dump(mode="json"), "wl.yaml", SEARCH, 1, False)
    assert [c.refused for c in cands] == [""] * 4
    dp_workload = _spec(replicas=2, expert_parallel=2, data_parallel_attention=True, two_batch_overlap=True)
    tp, dp = build_candidates(dp_workload, ["h100-sxm"], [2], {}, {}, None, [2])
    assert tp.overrides["hardware.two_batch_overlap"] is False and "hardware.two_batch_overlap" not in dp.overrides
    check_candidates([tp, dp], dp_workload.model_dump(mode="json"), "wl.yaml", SEARCH, 1, False)
    assert (tp.refused, dp.refused) == ("", "")


def test_a_small_moe_plan_with_the_overlap_counts_gpus_by_hand(workload, tmp_path):
    """The smallest MoE of the catalog on the plan's short workload, `--option
    hardware.two_batch_overlap=false,true --dp-attention 2` through the command line: a TP 2
    replica and a group of 2 ranks are 2 GPUs each, GPUs = replicas x 2 in every row, and the
    candidates are the TP one and the group without and with the overlap."""
    out = tmp_path / "out"
    pf = tmp_path / "plan.yaml"
    pf.write_text("search: {requests: 60, tolerance: 0.3, min_duration_s: 3, max_requests: 2000}\n")
    args = ["plan", "-w", workload, "--slo", SLO, "-o", str(out), "-q", "--plan", str(pf), "--dp-attention", "2"]
    args += ["--option", "hardware.two_batch_overlap=false,true", "--target-rate", str(TARGET), "--workers", "2"]
    assert main(args) == 0
    rows = {r["configuration"]: r for r in pd.read_csv(out / "configurations.csv").to_dict("records")}
    assert set(rows) == {
        "h100-sxm tp2",
        "h100-sxm dp-attn 2 two_batch_overlap=False",
        "h100-sxm dp-attn 2 two_batch_overlap=True",
    }
    for r in rows.values():
        assert r["status"] == "ok" and r["gpus_per_replica"] == 2 and r["gpus"] == r["replicas"] * 2
        assert r["replicas_initial"] == math.ceil(TARGET / r["goodput_rps"])
    # without the overlap the group is the plan's own (80 req/s per TP 2 replica, 113 per group);
    # with it a group sustains 47.6 req/s: two ranks on one node exchange their copies over NVLink
    # in little time, and every step reads its weights twice, so ceil(300 / 47.6) = 7 groups
    tp, plain, tbo = (
        rows[f"h100-sxm {k}"] for k in ("tp2", "dp-attn 2 two_batch_overlap=False", "dp-attn 2 two_batch_overlap=True")
    )
    assert (tp["gpus"], plain["gpus"], tbo["replicas"], tbo["gpus"]) == (8, 6, 7, 14)
    assert round(tbo["goodput_rps"], 1) == 47.6
