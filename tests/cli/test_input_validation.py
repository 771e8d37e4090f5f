"""Issue #20's findings, each reproduced: bad input ends in one line naming the file or flag
and exit 2, before anything is written."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fuzz_harness import TINY_WORKLOAD, invoke, refused, write_yaml


@pytest.fixture
def wl(tmp_path):
    return write_yaml(tmp_path / "wl.yaml", TINY_WORKLOAD)


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--seed", "-1", "--seed: a seed is a whole number"),
        ("--rate", "nan", "--rate: expected a finite number"),
        ("--rate", "inf", "--rate: expected a finite number"),
        ("--requests", "0", "--requests"),
    ],
)
def test_run_flags_refused(wl, tmp_path, flag, value, needle):
    refused(["run", "-w", wl, "-o", tmp_path / "r", flag, value], needle)
    assert not (tmp_path / "r").exists()


def test_huge_request_count_refused_with_estimate_and_override(wl, tmp_path):
    line = refused(
        ["run", "-w", wl, "-o", tmp_path / "r", "-n", "1000000000000"],
        "field 'requests.count'",
        "512 TB",
        "--no-memory-check",
    )
    assert "1,000,000,000,000 requests" in line
    big = dict(TINY_WORKLOAD, requests={**TINY_WORKLOAD["requests"], "count": "1e12"})
    refused(["run", "-w", write_yaml(tmp_path / "big.yaml", big)], "big.yaml: field 'requests.count'", "512 TB")


def test_non_finite_rate_in_yaml(tmp_path):
    text = tmp_path / "x.yaml"
    write_yaml(text, TINY_WORKLOAD)
    text.write_text(text.read_text().replace("rate: 5.0", "rate: .inf"))
    refused(["run", "-w", text], "x.yaml: field 'requests.arrival", "finite")


def test_one_tensor_parallel_rule_for_run_plan_roofline(tmp_path):
    tp3 = dict(TINY_WORKLOAD, hardware={**TINY_WORKLOAD["hardware"], "tensor_parallel": 3})
    wl = write_yaml(tmp_path / "tp3.yaml", tp3)
    rule = "tensor parallel 3 does not divide llama-2-7b's 32 attention heads"
    refused(["run", "-w", wl, "-o", tmp_path / "r"], "tp3.yaml: field 'hardware.tensor_parallel'", rule)
    ok = write_yaml(tmp_path / "ok.yaml", TINY_WORKLOAD)
    refused(
        ["plan", "-w", ok, "--slo", "ttft_p99=2s", "--tp", "3", "-o", tmp_path / "p"], "hardware.tensor_parallel", rule
    )
    refused(["roofline", "--model", "llama-2-7b", "--tp", "3"], "--tp", rule)
    assert not (tmp_path / "r").exists() and not (tmp_path / "p").exists()


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_plan_target_rate_refused(wl, tmp_path, value):
    refused(["plan", "-w", wl, "--slo", "ttft_p99=2s", "--target-rate", value, "-o", tmp_path / "p"], "--target-rate")


def test_huge_roofline_and_medusa_batches_refused(tmp_path):
    refused(["roofline", "--batch", "1000000000000", "--seq", "128"], "--batch", "64 TB", "--no-memory-check")
    refused(["medusa", "--batch", "1000000000000", "--out", tmp_path / "m"], "--batch", "--no-memory-check")
    assert not (tmp_path / "m").exists()


def test_missing_workload_file_is_not_an_unknown_name(tmp_path):
    refused(["run", "-w", "nonexist.yaml"], "nonexist.yaml: file not found")


@pytest.mark.parametrize("text,needle", [("", "the file is empty"), ("t,p,o\n", "no rows")])
def test_empty_and_header_only_trace(tmp_path, text, needle):
    (tmp_path / "trace.csv").write_text(text)
    wl = write_yaml(
        tmp_path / "wl.yaml",
        {
            "requests": {
                "trace": {"file": "trace.csv", "arrival_column": "t", "prompt_column": "p", "output_column": "o"}
            }
        },
    )
    refused(["run", "-w", wl, "-o", tmp_path / "r"], "trace.csv", needle)


def test_count_with_duration_prints_the_rule(tmp_path):
    spec = dict(TINY_WORKLOAD, requests={**TINY_WORKLOAD["requests"], "count": 50, "duration_s": 2.0})
    wl = write_yaml(tmp_path / "wl.yaml", spec)
    res = invoke(["run", "-w", wl, "-o", tmp_path / "r", "-q", "--no-plots"])
    assert res.rc == 0, res.stderr
    notice = [line for line in res.stderr.splitlines() if line.startswith("notice:")]
    assert len(notice) == 1 and "requests.duration_s 2 s ended arrivals after" in notice[0]
    assert "of the 50 requests of requests.count" in notice[0]


def test_sweep_space_refused_before_anything_is_written_then_rerun(wl, tmp_path):
    out = tmp_path / "sw"
    empty = write_yaml(tmp_path / "empty.yaml", {"parameters": {"x": []}})
    refused(["sweep", "-w", wl, "-s", empty, "-o", out], "empty.yaml: field 'parameters'", "'x' has no values")
    bad = write_yaml(
        tmp_path / "bad.yaml",
        {"parameters": {"serving.max_batch_size": {"low": 1.0, "high": 8.0}}, "fixed": {"requests.count": 3}},
    )  # continuous: Optuna only
    refused(["sweep", "-w", wl, "-s", bad, "-o", out], "bad.yaml: parameter 'serving.max_batch_size'", "a grid needs")
    # each form's own error, not every form's: a reversed range, a bare value
    reversed_range = write_yaml(
        tmp_path / "rev.yaml", {"parameters": {"serving.max_batch_size": {"low": 8, "high": 4}}}
    )
    refused(
        ["sweep", "-w", wl, "-s", reversed_range, "-o", out],
        "rev.yaml: field 'parameters.serving.max_batch_size.range.high': high must be >= low",
    )
    # a bound no member of int | float accepts: one field, without the union's member labels
    word = write_yaml(tmp_path / "word.yaml", {"parameters": {"serving.max_batch_size": {"low": 8, "high": "lots"}}})
    line = refused(
        ["sweep", "-w", wl, "-s", word, "-o", out],
        "word.yaml: field 'parameters.serving.max_batch_size.range.high': Input should be a valid integer",
    )
    assert "high.int" not in line and "high.float" not in line and line.count("field '") == 1
    scalar = write_yaml(tmp_path / "scalar.yaml", {"parameters": {"serving.max_batch_size": 16}})
    line = refused(
        ["sweep", "-w", wl, "-s", scalar, "-o", out], "scalar.yaml: field 'parameters.serving.max_batch_size'"
    )
    assert line.endswith(": give a list of values, {values: [...]}, or a range {low, high} (with num or step)")
    huge = write_yaml(
        tmp_path / "huge.yaml", {"parameters": {"serving.max_batch_size": {"low": 1, "high": 10**9, "num": 10**9}}}
    )
    refused(["sweep", "-w", wl, "-s", huge, "-o", out], "1,000,000,000 configurations", "--no-memory-check")
    assert not out.exists()
    good = write_yaml(
        tmp_path / "bad.yaml", {"parameters": {"serving.max_batch_size": [8, 4]}, "fixed": {"requests.count": 3}}
    )
    res = invoke(["sweep", "-w", wl, "-s", good, "-o", out, "-q", "--no-plots", "--workers", "1"])
    assert res.rc == 0, res.stderr
    assert (out / "results.parquet").is_file()


BLOCK_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "tokenizers"):
            raise ImportError(f"No module named {name!r}")
sys.meta_path.insert(0, _NoTorch())
from infersim.cli.main import main
sys.exit(main(["zoo", "list"]))
"""


def test_zoo_list_without_torch_is_one_line():
    proc = subprocess.run([sys.executable, "-c", BLOCK_TORCH], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "the zoo needs PyTorch" in lines[0] and "pip install" in lines[0]
