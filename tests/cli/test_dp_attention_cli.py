"""`sim run` with data-parallel attention: a bad group ends in one line naming the file and the
field, exit 2, nothing written (tests/cli/test_examples.py runs the shipped example)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fuzz_harness import refused_untouched, write_yaml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "parallel" / "deepseek-v3-h100-dp16-ep16.yaml"


@pytest.mark.parametrize(
    "hardware,message",
    [
        ({"replicas": 12}, "wl.yaml: field 'hardware.replicas': 12 is not a multiple of hardware.expert_parallel 16"),
        (
            {
                "data_parallel_attention": False,
                "expert_parallel": 1,
                "tensor_parallel": 8,
                "replicas": 2,
                "two_batch_overlap": True,
            },
            "wl.yaml: field 'hardware.two_batch_overlap': overlaps the expert all-to-alls of data-parallel attention",
        ),
        ({"two_batch_overlap": "sometimes"}, "hardware.two_batch_overlap"),
    ],
)
def test_a_bad_group_is_refused(tmp_path, hardware, message):
    data = yaml.safe_load(EXAMPLE.read_text())
    data["hardware"].update(hardware)
    wl = write_yaml(tmp_path / "wl.yaml", data)
    refused_untouched(["run", "-w", wl, "-o", tmp_path / "r"], tmp_path, message)
