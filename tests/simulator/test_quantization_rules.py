"""Quantised weights per architecture as vLLM runs them (simulator/catalog/quantization.yaml):
FP8 refused on Volta and run weight-only through FP8 Marlin on Turing and Ampere (dense and
fused-MoE experts alike), int4 / int8 through Volta's exllama kernel at its measured share of the
bandwidth, Marlin elsewhere; each rule sourced, each priced number checked by hand on the
datasheet roofline (efficiencies 1.0, no launch overheads)."""

from pathlib import Path

import numpy as np
import pytest

from infersim.cli.main import main
from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.costmodel.moe import RoutedExperts
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import list_hardware, load_hardware
from infersim.simulator.hardware.quantization import (
    QUANTISED,
    load_weight_rules,
    require_weight_dtype,
    weight_rule,
    weight_rules,
)
from infersim.simulator.models.catalog import load_model
from tests.utils import one_line_error, write_yaml

GATE_UP = 2 * 4096 * 11008  # Llama-2-7B's gate and up projections, weights per layer
INT4_BYTES = 0.5 + 2.5 / 128  # a 4-bit weight and its share of the group's fp16 scale and zero point
DECODE_1 = BatchShape.decode(np.full(1, 100))
PREFILL_4096 = BatchShape.prefill([4096])


def gate_up(card: str, dtype: str, batch: BatchShape):
    model = RooflineCostModel(load_model("llama-2-7b"), load_hardware(card), dtype=dtype)
    return {row.name: row for row in model.breakdown(batch)}["gate_up_proj"]


def test_every_rule_names_a_public_source_and_a_reason():
    for name, rule in weight_rules().items():
        assert "https://" in rule.source, name
        assert rule.why, name
        assert (rule.kernel is None) == rule.refused


@pytest.mark.parametrize("card", [c for c in list_hardware() if load_hardware(c).compute_capability is not None])
def test_every_shipped_card_has_one_rule_per_dtype_and_kind_of_layer(card):
    cc = load_hardware(card).compute_capability
    for dtype in QUANTISED:
        for experts in (False, True):
            matches = [r for r in weight_rules().values() if r.covers(dtype, cc, experts)]
            assert len(matches) == 1, (card, dtype, experts)


def test_architectures_get_the_kernels_vllm_runs():
    kernel = lambda dtype, cc, experts=False: weight_rule(dtype, cc, experts).kernel  # noqa: E731
    assert weight_rule("fp8", 7.0).refused and weight_rule("fp8", 7.0, True).refused  # Volta
    assert kernel("fp8", 7.5) == kernel("fp8", 8.6) == "FP8 Marlin (W8A16)"  # Turing, Ampere
    assert kernel("fp8", 8.0, True).startswith("fused Marlin MoE")  # Ampere fp8 MoE runs
    assert kernel("fp8", 8.9).startswith("FP8 W8A8") and kernel("fp8", 10.0, True).startswith("FP8 W8A8")
    assert kernel("int4", 7.0).startswith("GPTQ exllama") and kernel("int4", 7.0, True).startswith("MoE WNA16")
    assert kernel("int4", 7.5).startswith("Marlin") and kernel("int4", 9.0, True).startswith("Marlin")
    assert weight_rule("fp16", 8.0) is None and weight_rule("int4", 6.1) is None  # outside the table


@pytest.mark.parametrize("model", ["llama-2-7b", "mixtral-8x7b"])
def test_fp8_on_volta_is_refused_in_one_line_naming_model_card_and_dtype(capsys, model):
    assert main(["roofline", "--model", model, "--hardware", "v100", "--dtype", "fp8", "--phase", "decode"]) == 2
    err = one_line_error(capsys)
    assert "--dtype" in err and f"model '{model}'" in err and "'v100'" in err and "fp8 weights" in err
    assert "compute capability 7.0" in err and "https://" in err and "use fp16, int8, int4" in err


def test_fp8_on_turing_runs_weight_only_through_fp8_marlin(capsys):
    """The T4 has neither FP8 tensor cores nor bf16; vLLM runs FP8 checkpoints there as W8A16.
    Llama-2-7B's gate/up at batch 1: 90,177,536 one-byte weights + (4,096 + 22,016) x 2
    activation bytes = 90,229,760 bytes at 320 GB/s = 281.97 us; at 4,096 tokens 2 x 4,096 x
    90,177,536 FLOPs at the 16-bit 65 TFLOP/s = 11.365 ms. The int8 weight-only pricing exactly."""
    assert main(["roofline", "--model", "llama-2-7b", "--hardware", "t4", "--dtype", "fp8", "--phase", "decode"]) == 0
    row = gate_up("t4:datasheet", "fp8", DECODE_1)
    assert row.bytes == GATE_UP + (4096 + 2 * 11008) * 2 == 90_229_760
    assert row.memory_time_s == pytest.approx(90_229_760 / 320e9, rel=1e-12)
    prefill = gate_up("t4:datasheet", "fp8", PREFILL_4096)
    assert prefill.compute_time_s == pytest.approx(2 * 4096 * GATE_UP / 65e12, rel=1e-12)
    for batch in (DECODE_1, PREFILL_4096):
        assert gate_up("t4:datasheet", "fp8", batch).time_s == gate_up("t4:datasheet", "int8", batch).time_s


def test_int4_on_volta_is_priced_as_exllama():
    """vLLM's exllamav2-derived GPTQ kernel streams weights at 0.48 of Marlin's rate and computes
    at Marlin's 0.9 of fp16. Llama-2-7B's gate/up on the V100 (900 GB/s, 112 TFLOP/s): at batch
    1, 90,177,536 x 0.51953125 + 52,224 = 46,902,272 bytes at 0.48 x 900 GB/s = 108.57 us, 1.85x
    faster than fp16's 200.45 us (the bytes alone would say 3.85x); at 4,096 tokens 738.73 GFLOP
    at 0.9 x 112 TFLOP/s = 7.329 ms against fp16's 6.596 ms."""
    row = gate_up("v100:datasheet", "int4", DECODE_1)
    assert row.bytes == GATE_UP * INT4_BYTES + (4096 + 2 * 11008) * 2 == 46_902_272
    assert row.memory_time_s == pytest.approx(46_902_272 / (0.48 * 900e9), rel=1e-12)
    assert row.memory_time_s == pytest.approx(108.57e-6, rel=1e-4)
    fp16 = gate_up("v100:datasheet", "fp16", DECODE_1)
    assert fp16.memory_time_s / row.memory_time_s == pytest.approx(1.846, abs=1e-3)
    prefill = gate_up("v100:datasheet", "int4", PREFILL_4096)
    assert prefill.compute_time_s == pytest.approx(2 * 4096 * GATE_UP / (0.9 * 112e12), rel=1e-12)
    assert gate_up("v100:datasheet", "fp16", PREFILL_4096).compute_time_s == pytest.approx(6.596e-3, rel=1e-3)


def test_the_16_bit_lm_head_streams_at_the_full_bandwidth():
    """vLLM keeps the LM head in 16 bits (cuBLAS): Llama-2-7B's 32,000 x 4,096 head at batch 1,
    262,144,000 weight bytes + (4,096 + 32,000) x 2 = 262,216,192 bytes at 900 GB/s = 291.35 us,
    under int4 as under fp16; on the fitted V100 profile too (within the compute term the head still
    takes at the quantised GEMMs' 0.9 share, a millionth of a batch-1 step)."""
    for card in ("v100:datasheet", "v100"):
        rows = {
            dtype: {
                r.name: r
                for r in RooflineCostModel(load_model("llama-2-7b"), load_hardware(card), dtype=dtype).breakdown(
                    DECODE_1
                )
            }
            for dtype in ("int4", "fp16")
        }
        assert rows["int4"]["lm_head"].time_s == pytest.approx(rows["fp16"]["lm_head"].time_s, rel=1e-6)
    head = rows["int4"]["lm_head"]
    assert head.bytes == 2 * 32_000 * 4096 + (4096 + 32_000) * 2 == 262_216_192
    datasheet = {
        r.name: r
        for r in RooflineCostModel(load_model("llama-2-7b"), load_hardware("v100:datasheet"), dtype="int4").breakdown(
            DECODE_1
        )
    }
    assert datasheet["lm_head"].memory_time_s == pytest.approx(262_216_192 / 900e9, rel=1e-12)


def test_int4_on_turing_keeps_marlin_pricing():
    """Marlin runs on sm75 since its Turing port: the quantised bytes at the full bandwidth,
    0.9 of the 16-bit rate. 46,902,272 bytes at 320 GB/s = 146.57 us."""
    row = gate_up("t4:datasheet", "int4", DECODE_1)
    assert row.memory_time_s == pytest.approx(46_902_272 / 320e9, rel=1e-12)
    prefill = gate_up("t4:datasheet", "int4", PREFILL_4096)
    assert prefill.compute_time_s == pytest.approx(2 * 4096 * GATE_UP / (0.9 * 65e12), rel=1e-12)


def experts(card: str, dtype: str) -> RoutedExperts:
    model = load_model("mixtral-8x7b")
    hw = load_hardware(card)
    return RoutedExperts(model, hw, dtype, "fp16", 1, 1)


def test_fp8_moe_on_ampere_runs_the_experts_weight_only_through_marlin_moe():
    """Mixtral-8x7B in fp8 on an A100 is served (vLLM's Fp8MoEMethod runs fused Marlin MoE there):
    the experts at the 16-bit 312 TFLOP/s with one-byte weights, the int8 weight-only experts
    exactly; on an H100 at the FP8 1,979 TFLOP/s."""
    require_weight_dtype(load_hardware("a100-80gb-sxm"), "fp8", "serving.dtype", load_model("mixtral-8x7b"))
    fp8, int8 = experts("a100-80gb-sxm:datasheet", "fp8"), experts("a100-80gb-sxm:datasheet", "int8")
    assert fp8._device.peak_flops == 312e12 and fp8._device.bandwidth_bytes_per_s == 2039e9
    tokens = np.array([1.0, 64.0, 4096.0])
    assert np.array_equal(fp8.expert_time_s(tokens), int8.expert_time_s(tokens))
    assert experts("h100-sxm:datasheet", "fp8")._device.peak_flops == 1979e12


def test_int4_moe_on_volta_runs_moe_wna16_at_the_full_bandwidth():
    """Volta's int4 experts run MoE WNA16 (Triton), no published figure: Marlin's 0.9 of the
    16-bit rate, the full 900 GB/s; its dense layers run exllama at 0.48 of it."""
    e = experts("v100:datasheet", "int4")
    assert e._device.peak_flops == pytest.approx(0.9 * 112e12, rel=1e-15)
    assert e._device.bandwidth_bytes_per_s == 900e9
    dense = RooflineCostModel(load_model("mixtral-8x7b"), load_hardware("v100:datasheet"), dtype="int4")
    row = {r.name: r for r in dense.breakdown(DECODE_1)}["qkv_proj"]
    assert row.memory_time_s == pytest.approx(row.bytes / (0.48 * 900e9), rel=1e-12)


def test_a_profile_without_compute_capability_keeps_the_peak_rules():
    """A profile of your own without `compute_capability`: FP8 refused without an fp8 or bf16
    peak, int4 priced as Marlin (0.9 of fp16, the full bandwidth)."""
    hw = load_hardware("v100").model_copy(update={"compute_capability": None})
    with pytest.raises(InfersimError, match="fp8 needs FP8 tensor cores, or Ampere or later"):
        require_weight_dtype(hw, "fp8", "serving.dtype", load_model("llama-2-7b"))
    e = RoutedExperts(load_model("mixtral-8x7b"), hw, "int4", "fp16", 1, 1)
    assert e._device.peak_flops == pytest.approx(0.9 * 112e12, rel=1e-15) and e._device.bandwidth_bytes_per_s == 900e9


RULE = {"dtype": "int4", "layers": "dense", "kernel": "k", "certainty": "code", "why": "w", "source": "https://x"}


def test_overlapping_rules_are_an_error_naming_the_file_and_both_rules(tmp_path):
    path = write_yaml(
        tmp_path / "rules.yaml", {"a": {**RULE, "min_cc": 7.0, "below_cc": 8.0}, "b": {**RULE, "min_cc": 7.5}}
    )
    with pytest.raises(InfersimError, match="rules.yaml: rules 'a' and 'b' overlap for int4 dense layers"):
        load_weight_rules(path)


def test_a_refusal_with_a_price_is_an_error(tmp_path):
    path = write_yaml(tmp_path / "rules.yaml", {"r": {**RULE, "min_cc": 7.0, "kernel": None, "compute_share": 0.5}})
    with pytest.raises(InfersimError, match="rules.yaml: r"):
        load_weight_rules(path)


def test_the_documented_table_names_every_rule():
    """docs/moe-and-fp8.md's dtype x architecture table cites each rule by name."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "moe-and-fp8.md").read_text()
    table = doc[doc.index("### Quantised weights by architecture") :]
    assert all(f"`{name}`" in table for name in weight_rules())
