"""`sim roofline --dp-attention N` and `--pp N`: the title names the layout, the tables show the
all-to-all rows with their link, each stage with its hand-off, and what two-batch overlap hides;
a layout `sim run` refuses is refused in one line naming the flag, with the rule `sim run` gives."""

from __future__ import annotations

import pytest
from fuzz_harness import TINY_WORKLOAD, invoke, refused, write_yaml

V3 = ["roofline", "--model", "deepseek-v3", "--hardware", "h100-sxm:datasheet", "--dtype", "fp8", "--seq", "1024"]
LITE = ["roofline", "--model", "deepseek-v2-lite", "--hardware", "h100-sxm:datasheet", "--seq", "512"]


def test_dp_attention_table_names_the_layout_and_the_all_to_alls():
    res = invoke([*V3, "--dp-attention", "16", "--batch", "32", "--phase", "decode"])
    assert res.rc == 0, res.stderr
    out = " ".join(res.stdout.split())  # the title wraps at 80 columns
    assert "DP attention 16 x EP 16" in out and "batch 32 per rank" in out
    for row in ("dispatch (node+net)", "routed_experts", "combine (node+net)"):
        assert row in out


def test_pipeline_table_shows_each_stage_and_the_hand_off():
    res = invoke([*LITE, "--tp", "2", "--pp", "2", "--batch", "4", "--phase", "prefill"])
    assert res.rc == 0, res.stderr
    out = " ".join(res.stdout.split())
    assert "tp 2 x pp 2" in out and "stage 0 of 2" in out and "stage 1 of 2" in out
    assert "handoff (node)" in out and "allreduce (node)" in out
    assert "one batch through 2 stages" in out


def test_two_batch_overlap_says_what_overlaps():
    res = invoke([*V3, "--dp-attention", "16", "--two-batch-overlap", "on", "--batch", "1,256", "--all"])
    assert res.rc == 0, res.stderr
    out = " ".join(res.stdout.split())
    assert "micro-batches of 128 and 128 tokens" in out and "sparse layer all-to-alls, a + b" in out
    assert "the group splits this step; per sparse layer the all-to-alls hide under the compute" in out
    assert "a rank of one token cannot split into two micro-batches" in out
    assert "without overlap" in out


@pytest.mark.parametrize(
    "flags,needles",
    [
        (["--dp-attention", "3"], ["--dp-attention: 3 does not divide the 256 experts of 'deepseek-v3'"]),
        (["--dp-attention", "1"], ["--dp-attention:", "at least 2 ranks"]),
        (["--dp-attention", "16", "--tp", "2"], ["--tp: 2 with data_parallel_attention: each rank is one GPU"]),
        (["--dp-attention", "16", "--pp", "2"], ["--pp: 2 with data_parallel_attention: each rank is one GPU"]),
        (["--dp-attention", "16", "--ep", "8"], ["--ep: 8 with --dp-attention 16"]),
        (["--two-batch-overlap", "on"], ["--two-batch-overlap:", "give --dp-attention N"]),
        (["--pp", "62"], ["--pp: 62 stages exceed deepseek-v3's 61 layers"]),
        (["--pp", "0"], ["--pp: expected a whole number >= 1"]),
        (["--tp", "8", "--ep", "4", "--pp", "2"], ["--ep: 4 must equal the tensor-parallel degree (8)"]),
    ],
)
def test_impossible_layouts_refused_in_one_line(flags, needles):
    refused([*V3, "--batch", "1", *flags], *needles)


def test_a_dense_model_has_no_dp_attention_as_sim_run_says(tmp_path):
    rule = "needs a mixture-of-experts model; 'llama-2-7b' has no experts"
    dp = dict(
        TINY_WORKLOAD,
        hardware={**TINY_WORKLOAD["hardware"], "replicas": 2, "expert_parallel": 2, "data_parallel_attention": True},
    )
    refused(
        ["run", "-w", write_yaml(tmp_path / "dp.yaml", dp), "-o", tmp_path / "r"],
        "hardware.data_parallel_attention",
        rule,
    )
    refused(
        ["roofline", "--model", "llama-2-7b", "--dp-attention", "2", "--batch", "1", "--seq", "128"],
        "--dp-attention",
        rule,
    )
    assert not (tmp_path / "r").exists()


def test_tensor_parallel_without_an_interconnect_refused_as_sim_run_says():
    # one check (HardwareProfile.require_tensor_parallel) for both commands, naming the flag here
    refused(
        ["roofline", "--model", "llama-7b", "--hardware", "cpu-reference", "--tp", "2", "--batch", "1"],
        "--tp: tensor parallel 2 needs an interconnect and hardware profile 'cpu-reference' gives none",
    )
