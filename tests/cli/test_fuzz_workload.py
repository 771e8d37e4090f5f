"""Fuzz: mutated workload YAML files and hostile `sim run` flags. Every case ends in a complete
run folder (exit 0) or one line naming the file or flag (exit 2); see fuzz_harness.check."""

from __future__ import annotations

import tempfile
from pathlib import Path

from fuzz_harness import FUZZ, TINY_WORKLOAD, check, digest, invoke, write_yaml
from fuzz_values import NUMBERS, STRINGS, mutated
from hypothesis import given
from hypothesis import strategies as st

OPTIONAL_FIELDS = (
    "requests.duration_s",
    "requests.max_prompt_tokens",
    "requests.max_output_tokens",
    "serving.gpu_blocks",
    "serving.cpu_blocks",
    "serving.max_model_len",
    "serving.max_batched_tokens",
    "serving.watermark",
    "serving.chunked_prefill",
    "serving.kv_dtype",
    "hardware.host_link",
    "requests.arrival.cv",
    "requests.prompt_tokens.mean",
    "description",
)

ARRIVALS = st.sampled_from(
    [
        {"type": "burst"},
        {"type": "closed_loop", "clients": 2},
        {"type": "gamma", "rate": 3.0, "cv": 2.0},
        {"type": "poisson", "rate": 1e9},
    ]
)


def _run_case(data) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        wl = write_yaml(Path(tmp) / "wl.yaml", data)
        out = Path(tmp) / "run"
        before = digest([wl])
        res = invoke(["run", "-w", wl, "-o", out, "-q", "--no-plots"])
        check(res, blame=["wl.yaml"], inputs=[wl], before=before, run_dir=out)


@FUZZ
@given(mutated(TINY_WORKLOAD, OPTIONAL_FIELDS))
def test_mutated_workload_file(data):
    _run_case(data)


@FUZZ
@given(mutated(TINY_WORKLOAD, OPTIONAL_FIELDS), ARRIVALS)
def test_mutated_workload_with_other_arrivals(data, arrival):
    if isinstance(data.get("requests"), dict):
        data["requests"]["arrival"] = arrival
    _run_case(data)


FLAG_VALUES = {
    "--seed": NUMBERS | STRINGS,
    "--rate": NUMBERS | STRINGS,
    "--requests": st.sampled_from([-1, 0, 1, 5, 40, 10**9, 10**12, "1e3", "x"]),
    "--model": st.sampled_from(["llama-2-7b", "opt-1.3b", "nosuch", "", "missing.yaml"]),
    "--hardware": st.sampled_from(["a100-80gb-pcie", "h100-sxm", "nosuch", "missing.yaml"]),
    "--scheduler": st.sampled_from(["fcfs", "fairness", "nosuch", ""]),
    "--preemption": st.sampled_from(["recompute", "swap", "cost_aware", "nosuch"]),
    "--tp": st.sampled_from([-1, 0, 1, 2, 3, 64, 10**6, "x"]),
    "--replicas": st.sampled_from([0, 1, 3, 10**9, "x"]),
    "--dtype": st.sampled_from(["fp16", "bf16", "fp8", "int4", "int3", ""]),
    "--kv-dtype": st.sampled_from(["fp16", "fp8", "int3", ""]),
}


@FUZZ
@given(st.dictionaries(st.sampled_from(sorted(FLAG_VALUES)), st.just(None), min_size=1, max_size=3), st.data())
def test_run_flags(flags, data):
    argv = []
    for flag in flags:
        argv += [flag, str(data.draw(FLAG_VALUES[flag], label=flag))]
    with tempfile.TemporaryDirectory() as tmp:
        wl = write_yaml(Path(tmp) / "wl.yaml", TINY_WORKLOAD)
        out = Path(tmp) / "run"
        before = digest([wl])
        res = invoke(["run", "-w", wl, "-o", out, "-q", "--no-plots", *argv])
        check(res, blame=["wl.yaml", *flags, "missing.yaml"], inputs=[wl], before=before, run_dir=out)


# Values every flag here refuses, so `sim exec`, `sim validate` and `sim profile` stop before
# loading a model or measuring anything.
REFUSED_FLAGS = {
    "exec": {
        "--seed": ["-1", str(2**64)],
        "--rate": ["nan", "inf", "-2"],
        "--requests": ["0", "-3", "1000000000000"],
        "--gpu-blocks": ["0", "-1"],
        "--cpu-blocks": ["-1"],
        "--threads": ["-2"],
    },
    "validate": {"--seed": ["-1"], "--requests": ["0", "1000000000000"], "--threads": ["0"], "--repeats": ["0"]},
    "profile": {"--seed": ["-1", str(2**64)], "--threads": ["-1"]},
}


@FUZZ
@given(st.sampled_from(sorted(REFUSED_FLAGS)), st.data())
def test_refused_flags_of_the_executor_commands(command, data):
    flags = data.draw(st.lists(st.sampled_from(sorted(REFUSED_FLAGS[command])), min_size=1, max_size=3, unique=True))
    argv = []
    for flag in flags:
        argv += [flag, data.draw(st.sampled_from(REFUSED_FLAGS[command][flag]), label=flag)]
    with tempfile.TemporaryDirectory() as tmp:
        wl = write_yaml(Path(tmp) / "wl.yaml", TINY_WORKLOAD)
        out = Path(tmp) / "out"
        head = {
            "exec": ["exec", "-w", wl, "-m", "zoo-target", "--fast"],
            "validate": ["validate", "-w", wl],
            "profile": ["profile", "--quick"],
        }[command]
        before = digest([wl])
        res = invoke([*head, *argv, "--out", out, "-q"])
        assert res.rc != 0
        check(res, blame=flags, inputs=[wl], before=before, run_dir=out)
