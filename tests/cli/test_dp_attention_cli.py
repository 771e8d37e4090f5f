"""`sim run` with data-parallel attention: a bad group ends in one line naming the file and the
field, exit 2, nothing written (tests/cli/test_examples.py runs the shipped example)."""

from __future__ import annotations

from pathlib import Path

import yaml
from fuzz_harness import refused_untouched, write_yaml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "parallel" / "deepseek-v3-h100-dp16-ep16.yaml"


def test_a_group_that_does_not_divide_the_replicas_is_refused(tmp_path):
    data = yaml.safe_load(EXAMPLE.read_text())
    data["hardware"]["replicas"] = 12
    wl = write_yaml(tmp_path / "wl.yaml", data)
    refused_untouched(
        ["run", "-w", wl, "-o", tmp_path / "r"],
        tmp_path,
        "wl.yaml: field 'hardware.replicas': 12 is not a multiple of hardware.expert_parallel 16",
    )


def test_two_batch_overlap_without_data_parallel_attention_is_refused(tmp_path):
    data = yaml.safe_load(EXAMPLE.read_text())
    data["hardware"] = {"profile": "h100-sxm", "tensor_parallel": 8, "replicas": 2, "two_batch_overlap": True}
    wl = write_yaml(tmp_path / "wl.yaml", data)
    refused_untouched(
        ["run", "-w", wl, "-o", tmp_path / "r"],
        tmp_path,
        "wl.yaml: field 'hardware.two_batch_overlap': overlaps the expert all-to-alls of data-parallel attention",
    )


def test_two_batch_overlap_must_be_a_boolean(tmp_path):
    data = yaml.safe_load(EXAMPLE.read_text())
    data["hardware"]["two_batch_overlap"] = "sometimes"
    wl = write_yaml(tmp_path / "wl.yaml", data)
    refused_untouched(["run", "-w", wl, "-o", tmp_path / "r"], tmp_path, "hardware.two_batch_overlap")
