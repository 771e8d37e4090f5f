"""Fuzz: hardware profiles and model configs (catalog YAML and Hugging Face config.json) given
as files, through `sim roofline` and `sim run`, and the flags of `sim roofline` and `sim medusa`."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import yaml
from fuzz_harness import EXAMPLES, FUZZ, TINY_WORKLOAD, check, digest, invoke, write_yaml
from fuzz_values import NUMBERS, STRINGS, mutated
from hypothesis import given, settings
from hypothesis import strategies as st

from infersim.simulator.paths import catalog_dir, hwprofiles_dir

HARDWARE = yaml.safe_load((hwprofiles_dir() / "a100-80gb-pcie.yaml").read_text())
MODEL = yaml.safe_load((catalog_dir() / "models" / "llama-2-7b.yaml").read_text())
HF_CONFIG = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}

ROOFLINE = ["roofline", "--batch", "1,4", "--seq", "128", "--phase", "prefill,decode"]


def _both_commands(flag: str, path: Path, inputs: list[Path], tmp: Path) -> None:
    """The file through `sim roofline` (a table, no folder) and `sim run` (a run folder)."""
    blame = [path.name, path.parent.name, flag]
    before = digest(inputs)
    check(invoke([*ROOFLINE, flag, path]), blame=blame, inputs=inputs, before=before)
    wl = write_yaml(tmp / "wl.yaml", TINY_WORKLOAD)
    out = tmp / "run"
    check(
        invoke(["run", "-w", wl, "-o", out, "-q", "--no-plots", flag, path]),
        blame=blame + ["wl.yaml"],
        inputs=inputs,
        before=before,
        run_dir=out,
    )


@FUZZ
@given(mutated(HARDWARE, ("efficiency.linear.compute", "overheads.kernel_launch_us", "peak_tflops.fp8")))
def test_mutated_hardware_profile(profile):
    with tempfile.TemporaryDirectory() as tmp:
        path = write_yaml(Path(tmp) / "hw.yaml", profile)
        _both_commands("--hardware", path, [path], Path(tmp))


@FUZZ
@given(mutated(MODEL, ("num_kv_heads", "head_dim", "position_offset", "default_dtype")))
def test_mutated_model_file(model):
    with tempfile.TemporaryDirectory() as tmp:
        path = write_yaml(Path(tmp) / "model.yaml", model)
        _both_commands("--model", path, [path], Path(tmp))


@FUZZ
@given(mutated(HF_CONFIG, ("head_dim", "rope_scaling", "attention_bias")))
def test_mutated_hf_config(config):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ckpt"
        folder.mkdir()
        path = folder / "config.json"
        path.write_text(json.dumps(config))
        _both_commands("--model", folder, [path], Path(tmp))


INT_LISTS = st.sampled_from(["1", "1,2", "0", "-1", "1,,2", "a", "1.5", "", "1000000000000", "64,1"])
ROOFLINE_FLAGS = {
    "--batch": INT_LISTS,
    "--seq": INT_LISTS,
    "--candidates": INT_LISTS,
    "--tp": NUMBERS | STRINGS,
    "--phase": st.sampled_from(["prefill", "decode", "verify", "nosuch", "", "decode,verify"]),
    "--dtype": st.sampled_from(["fp16", "bf16", "int4", "fp7", ""]),
    "--kv-dtype": st.sampled_from(["fp16", "int8", "nosuch"]),
    "--model": st.sampled_from(["llama-7b", "llama-2-70b", "opt-1.3b", "nosuch", "missing.yaml"]),
    "--hardware": st.sampled_from(["a100-80gb-pcie", "h100-sxm", "nosuch", "missing.yaml"]),
    "--attention": st.sampled_from(["fused", "unfused", "other"]),
}


def _flag_argv(flags, data, values) -> list[str]:
    argv = []
    for flag in flags:
        argv += [flag, str(data.draw(values[flag], label=flag))]
    return argv


@FUZZ
@given(st.lists(st.sampled_from(sorted(ROOFLINE_FLAGS)), min_size=1, max_size=4, unique=True), st.data())
def test_roofline_flags(flags, data):
    argv = _flag_argv(flags, data, ROOFLINE_FLAGS)
    if "--seq" not in flags:  # the default sweep (7 x 7 settings) is slow for a fuzz case
        argv += ["--seq", "128"]
    check(invoke(["roofline", *argv]), blame=[*flags, "--seq", "missing.yaml"], inputs=[], before={})


MEDUSA_FLAGS = {
    "--batch": NUMBERS | STRINGS,
    "--seq": NUMBERS | STRINGS,
    "--seq-batch": NUMBERS | STRINGS,
    "--candidates": INT_LISTS,
    "--batches": INT_LISTS,
    "--seqs": INT_LISTS,
    "--rate-model": st.sampled_from(["log", "tree", "other"]),
    "--accuracies": st.sampled_from(["vicuna-7b", "nosuch", "missing.yaml"]),
    "--block": st.sampled_from(["model", "paper", "other"]),
}


@settings(FUZZ, max_examples=max(1, EXAMPLES // 5))  # a valid study writes three plots: seconds each
@given(st.lists(st.sampled_from(sorted(MEDUSA_FLAGS)), min_size=1, max_size=3, unique=True), st.data())
def test_medusa_flags(flags, data):
    argv = _flag_argv(flags, data, MEDUSA_FLAGS)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "study"
        res = invoke(["medusa", "--candidates", "1,4", "--batches", "1,2", "--seqs", "128", *argv, "--out", out])
        check(res, blame=[*flags, "missing.yaml", "--candidates", "--batches", "--seqs"], inputs=[], before={})
        if res.rc == 0:
            assert (out / "medusa_study.csv").is_file()
