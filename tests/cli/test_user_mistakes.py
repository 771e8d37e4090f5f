"""Mistakes a new user makes with the commands that need no PyTorch, each refused in one line
naming the file, field or flag, with exit 2 and every file left as it was: an output file that
exists, a place that cannot be written, an empty phase list, a price that is not a number, a
model or hardware name one typo away, a YAML file that is a folder or empty, a batch limit that
leaves no KV cache."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path

import pytest
from fuzz_harness import TINY_WORKLOAD, invoke, refused_untouched, write_yaml

ROOFLINE = ["roofline", "--batch", "1", "--seq", "128"]


@pytest.mark.parametrize("option,name", [("--csv", "t.csv"), ("--json", "t.json"), ("--plot", "t.png")])
def test_roofline_keeps_an_existing_output_file(tmp_path, option, name):
    (tmp_path / name).write_text("mine\n")
    refused_untouched([*ROOFLINE, option, tmp_path / name], tmp_path, f"{option} {tmp_path / name}: exists", "--force")


def test_roofline_force_replaces_the_file(tmp_path):
    (tmp_path / "t.csv").write_text("mine\n")
    res = invoke([*ROOFLINE, "--csv", tmp_path / "t.csv", "--force"])
    assert res.rc == 0, res.stderr
    assert (tmp_path / "t.csv").read_text().startswith("model,hardware,phase,")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]  # no temporary file left


def test_a_file_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    refused_untouched([*ROOFLINE, "--csv", tmp_path / "t.csv"], tmp_path, f"{tmp_path / 't.csv'}: cannot write there")


def test_roofline_empty_phase_list(tmp_path):
    refused_untouched([*ROOFLINE, "--phase", " , "], tmp_path, "--phase: empty", "prefill, decode, verify")


@pytest.fixture
def wl(tmp_path):
    return write_yaml(tmp_path / "wl.yaml", TINY_WORKLOAD)


@pytest.mark.parametrize("price", ["nan", "inf", "-1"])
def test_plan_price_must_be_a_finite_number(wl, tmp_path, price):
    argv = ["plan", "-w", wl, "--slo", "ttft_p99=2s", "--price", f"a100-80gb-pcie={price}", "-o", tmp_path / "p"]
    refused_untouched(argv, tmp_path, "--price", f"a100-80gb-pcie={price}", "a finite number >= 0")


def test_plan_file_price_must_not_be_negative(wl, tmp_path):
    plan = write_yaml(tmp_path / "plan.yaml", {"slo": {"ttft_p99": "2s"}, "prices": {"a100-80gb-pcie": -1.8}})
    argv = ["plan", "-w", wl, "--plan", plan, "-o", tmp_path / "p"]
    refused_untouched(argv, tmp_path, "plan.yaml: field 'prices.a100-80gb-pcie'", "greater than or equal to 0")


def test_plan_disaggregation_flag_is_named_without_a_plan_file(wl, tmp_path):
    argv = ["plan", "-w", wl, "--slo", "ttft_p99=2s", "--disaggregation", "1", "-o", tmp_path / "p"]
    line = refused_untouched(argv, tmp_path, "--disaggregation: field 'disaggregation.gpus'", "two replicas or more")
    assert "plan file" not in line


@pytest.mark.parametrize(
    "serving,needles",
    [
        ({"max_batch_size": 10**12}, ["field 'serving.max_batch_size'", "1,000,000,000,000 sequences"]),
        ({"max_batched_tokens": 10**12}, ["field 'serving.max_batched_tokens'", "1,000,000,000,000 batched tokens"]),
        ({"block_size": 10**9}, ["field 'serving.block_size'", "one KV block of 1,000,000,000 tokens"]),
    ],
)
def test_no_kv_cache_names_the_limit_at_fault_not_the_weights(tmp_path, serving, needles):
    spec = dict(TINY_WORKLOAD, serving={**TINY_WORKLOAD["serving"], **serving})
    wl = write_yaml(tmp_path / "big.yaml", spec)
    line = refused_untouched(["run", "-w", wl, "-o", tmp_path / "r"], tmp_path, "big.yaml: ", *needles)
    assert "does not fit" not in line


def test_a_fixed_kv_pool_does_not_let_weights_larger_than_the_card_run(tmp_path, monkeypatch):
    """The built-in chatbot workload fixes its KV pool (128 GPU blocks, as AdaptiveLLM's setup
    gives it); another model's weights must still fit on the card: Llama-3-70B's 141 GB on one
    80 GB H100 is refused up front, naming the weights and what to change."""
    monkeypatch.chdir(tmp_path)
    argv = ["run", "-w", "chatbot", "--model", "llama-3-70b", "--hardware", "h100-sxm", "-n", "5"]
    refused_untouched(
        argv, tmp_path, "model 'llama-3-70b' (141.1 GB of weights per GPU in fp16) does not fit", "tensor_parallel"
    )


@pytest.mark.parametrize(
    "argv,needles",
    [
        (["models", "lama-7b"], ["unknown model 'lama-7b' (did you mean 'llama-7b'?)"]),
        (["hardware", "h100-sx"], ["unknown hardware profile 'h100-sx' (did you mean 'h100-sxm'?)"]),
        (
            ["hardware", "h100-sxm:datashet"],
            ["unknown variant ':datashet' of hardware profile 'h100-sxm'", "did you mean 'h100-sxm:datasheet'?"],
        ),
        ([*ROOFLINE, "--hardware", "a100-80gb-pci:datasheet"], ["--hardware", "did you mean 'a100-80gb-pcie'?"]),
        (["run", "-w", "chatbott"], ["unknown workload 'chatbott' (did you mean 'chatbot'?)"]),
    ],
)
def test_a_typo_gets_the_nearest_name(tmp_path, monkeypatch, argv, needles):
    monkeypatch.chdir(tmp_path)
    refused_untouched(argv, tmp_path, *needles)


def test_a_name_far_from_every_entry_gets_no_guess(tmp_path):
    line = refused_untouched(["models", "no-such-model"], tmp_path, "unknown model 'no-such-model'; known:")
    assert "did you mean" not in line


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda p: p.mkdir(), "is a folder; name a YAML file"),
        (lambda p: p.write_text("\n"), "the file is empty"),
        (lambda p: p.write_text("# only a comment\n"), "holds nothing but comments"),
    ],
)
def test_workload_file_that_is_a_folder_or_empty(tmp_path, make, needle):
    make(tmp_path / "wl.yaml")
    refused_untouched(
        ["run", "-w", tmp_path / "wl.yaml", "-o", tmp_path / "r"], tmp_path, f"{tmp_path / 'wl.yaml'}: {needle}"
    )


def test_model_folder_without_config_json(tmp_path):
    (tmp_path / "ckpt").mkdir()
    refused_untouched(["models", tmp_path / "ckpt"], tmp_path, f"{tmp_path / 'ckpt'}: is a folder without config.json")


def test_calibrate_refuses_a_folder_as_out_even_with_force(tmp_path):
    (tmp_path / "prof").mkdir()
    table = Path(__file__).parents[1] / "data" / "linear_ops_a100_llama3_8b.csv"
    argv = ["calibrate", "--hardware", "a100-80gb-sxm", "--out", tmp_path / "prof", "--force", table]
    refused_untouched(argv, tmp_path, f"{tmp_path / 'prof'}: is a folder")


def test_flags_that_would_be_ignored_are_refused(wl, tmp_path):
    """A flag that only means something beside another is refused without it, not dropped."""
    argv = ["plan", "-w", wl, "--slo", "ttft_p99=2s", "--attainment", "0.9", "-o", tmp_path / "p"]
    refused_untouched(argv, tmp_path, "--attainment goes with --disaggregation")
    grid = write_yaml(tmp_path / "grid.yaml", {"parameters": {"serving.max_batch_size": [4, 8]}})
    argv = ["sweep", "-w", wl, "-s", grid, "--trials", "5", "-o", tmp_path / "s"]
    refused_untouched(argv, tmp_path, "--trials", "grid.yaml is a grid")
    argv = ["medusa", "--accuracies", "vicuna-7b", "--out", tmp_path / "m"]
    refused_untouched(argv, tmp_path, "--accuracies", "--rate-model tree")


def test_offload_policy_typo_names_the_file_and_field(tmp_path):
    spec = dict(TINY_WORKLOAD, offload={"policy": "infinigenn"})
    wl = write_yaml(tmp_path / "off.yaml", spec)
    refused_untouched(
        ["run", "-w", wl, "-o", tmp_path / "r"], tmp_path, "off.yaml: field 'offload.policy'", "'infinigen'?"
    )


def test_sweep_says_why_its_configurations_failed(wl, tmp_path):
    typo = write_yaml(tmp_path / "typo.yaml", {"parameters": {"serving.max_batch_sise": [4, 8]}})
    res = invoke(["sweep", "-w", wl, "-s", typo, "-o", tmp_path / "s", "--workers", "1", "--no-plots"])
    assert res.rc == 3, res.stderr  # every configuration failed
    assert "failed (2): configuration: field 'serving.max_batch_sise': Extra inputs are not permitted" in res.stdout


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--scheduler", "fcfs,fcfss", "--scheduler: unknown scheduler 'fcfss' (did you mean 'fcfs'?)"),
        ("--preemption", "swapp", "--preemption: unknown preemption policy 'swapp' (did you mean 'swap'?)"),
    ],
)
def test_plan_policy_typo_is_named_by_its_flag(wl, tmp_path, flag, value, needle):
    refused_untouched(["plan", "-w", wl, "--slo", "ttft_p99=2s", flag, value, "-o", tmp_path / "p"], tmp_path, needle)


def test_plan_option_error_without_a_plan_file_names_the_workload_alone(wl, tmp_path):
    argv = ["plan", "-w", wl, "--slo", "ttft_p99=2s", "--option", "serving.foo=1", "-o", tmp_path / "p"]
    line = refused_untouched(argv, tmp_path, f"{wl} as a100-80gb-pcie: field 'serving.foo'")
    assert "plan file" not in line


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--scheduler", "fcfss", "--scheduler: unknown scheduler 'fcfss' (did you mean 'fcfs'?)"),
        ("--model", "llama-2-7", "--model: unknown model 'llama-2-7' (did you mean 'llama-2-7b'?)"),
        ("--hardware", "h100-sxm:datashet", "--hardware: unknown variant ':datashet'"),
    ],
)
def test_run_override_typo_is_named_by_its_flag(wl, tmp_path, flag, value, needle):
    line = refused_untouched(["run", "-w", wl, flag, value, "-o", tmp_path / "r"], tmp_path, needle)
    assert "wl.yaml" not in line  # the file does not hold the value


def test_plan_probe_larger_than_its_cap_is_refused_not_capped(wl, tmp_path):
    argv = ["plan", "-w", wl, "--slo", "ttft_p99=2s", "-n", "1000000", "-o", tmp_path / "p"]
    refused_untouched(argv, tmp_path, "--requests: 1,000,000 requests per probe", "search.max_requests (30,000)")
    plan = write_yaml(tmp_path / "plan.yaml", {"slo": {"ttft_p99": "2s"}, "search": {"requests": 40000}})
    argv = ["plan", "-w", wl, "--plan", plan, "-o", tmp_path / "p"]
    refused_untouched(argv, tmp_path, "plan.yaml: field 'search.requests': 40,000 requests per probe")


def test_a_trace_too_large_for_memory_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """A trace without requests.count replays every row: 200,000 rows need 256 MiB + 200,000 x
    512 B + 4 KB = 0.371 GB, more than the 0.3 GB this test makes available."""
    monkeypatch.setattr("infersim.simulator.validation.host_available_bytes", lambda: 300_000_000)
    (tmp_path / "big.csv").write_text("ts,p,o\n" + "0,5,6\n" * 200_000)
    requests = {"trace": {"file": "big.csv", "arrival_column": "ts", "prompt_column": "p", "output_column": "o"}}
    wl = write_yaml(tmp_path / "wl.yaml", dict(TINY_WORKLOAD, requests=requests))
    refused_untouched(
        ["run", "-w", wl, "-o", tmp_path / "r"],
        tmp_path,
        "wl.yaml: field 'requests.trace': 200,000 requests would need about 0.371 GB of memory, more than "
        "the 0.3 GB available",
    )


def test_draft_model_typo_names_the_file_and_field(tmp_path):
    draft = {"model": "llama-69m", "acceptance": {"kind": "iid", "alpha": 0.8}}
    spec = dict(TINY_WORKLOAD, speculation={"method": "draft", "drafts": [draft]})
    wl = write_yaml(tmp_path / "spec.yaml", spec)
    refused_untouched(
        ["run", "-w", wl, "-o", tmp_path / "r"],
        tmp_path,
        "spec.yaml: field 'speculation.drafts.0.model': unknown model 'llama-69m' (did you mean 'llama-68m'?)",
    )


@pytest.mark.parametrize(
    "acceptance, needle",
    [
        (
            {"kind": "iid", "alpha": 1.3},
            "field 'speculation.drafts.0.acceptance.inline.alpha': Input should be less than",
        ),
        ({"table": "opt-13b"}, "field 'speculation.drafts.0.acceptance.table.draft': Field required"),
        (0.8, "field 'speculation.drafts.0.acceptance': give {kind: iid|positional|empirical|mixture, ...} or a"),
    ],
)
def test_acceptance_errors_speak_of_the_form_given(tmp_path, acceptance, needle):
    """An inline model's error is its own, not mixed with a table entry's missing fields."""
    draft = {"model": "llama-68m", "acceptance": acceptance}
    wl = write_yaml(tmp_path / "spec.yaml", dict(TINY_WORKLOAD, speculation={"method": "draft", "drafts": [draft]}))
    line = refused_untouched(["run", "-w", wl, "-o", tmp_path / "r"], tmp_path, needle)
    assert line.count("field '") == 1, line


def test_requests_beyond_a_traces_rows_name_the_flag(tmp_path):
    (tmp_path / "t.csv").write_text("ts,p,o\n" + "0,5,6\n" * 30)
    requests = {"trace": {"file": "t.csv", "arrival_column": "ts", "prompt_column": "p", "output_column": "o"}}
    wl = write_yaml(tmp_path / "wl.yaml", dict(TINY_WORKLOAD, requests=requests))
    refused_untouched(
        ["run", "-w", wl, "-n", "50", "-o", tmp_path / "r"],
        tmp_path,
        "wl.yaml: field 'requests.count' (set by --requests): 50 requests, more than the 30 rows of t.csv after "
        "start_row 0",
    )
