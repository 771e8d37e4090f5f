"""FP8 weights and KV cache: priced at the FP8 tensor-core peaks, the KV pool sized at one byte
per element, refused on cards without FP8 tensor cores."""

import numpy as np
import pytest

from infersim.cli.main import main
from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.engine.memory import plan_memory
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.models.catalog import load_model
from infersim.simulator.models.dtypes import bytes_per_element, normalize_dtype
from infersim.simulator.parallel.config import ClusterSection
from infersim.simulator.parallel.memory import stage_weight_bytes
from infersim.simulator.parallel.placement import Placement, stage_layers
from tests.utils import memory_options

FP8_CARDS = {
    "h100-sxm": 1979,
    "h100-pcie": 1513,
    "h200": 1979,
    "l40": 362.05,
    "l4": 242.5,
    "l40s": 733,
    "rtx-4090": 330.3,
    "b200": 4500,
    "mi300x": 2614.9,
    "h20": 296,
}
# Ampere: no FP8 tensor cores, FP8 weights served weight-only (W8A16, FP8 Marlin)
W8A16_CARDS = ["a100-80gb-pcie", "a100-80gb-sxm", "a100-40gb", "a40", "rtx-a6000", "a10"]
# before Ampere: neither FP8 tensor cores nor bf16, and no FP8 KV cache (FP8 weights run on the T4
# through FP8 Marlin and are refused on the V100: tests/simulator/test_quantization_rules.py)
NO_FP8_CARDS = ["v100", "t4"]


def test_fp8_is_one_byte():
    assert bytes_per_element("fp8") == 1.0
    assert normalize_dtype("float8_e4m3fn") == "fp8"


@pytest.mark.parametrize("card, tflops", sorted(FP8_CARDS.items()))
def test_fp8_cards_carry_their_datasheet_peak(card, tflops):
    hw = load_hardware(card)
    assert hw.peak_flops("fp8") == tflops * 1e12
    # twice the fp16 rate, as the datasheets print them: the L40S's are 362.05 and 733 dense
    assert hw.peak_tflops["fp8"] == pytest.approx(2 * hw.peak_tflops["fp16"], rel=0.015)


def test_fp8_kv_pool_holds_twice_the_fp16_blocks():
    m, hw = load_model("llama-2-7b"), load_hardware("h100-sxm")

    def blocks(kv_dtype):
        return plan_memory(m, hw, memory_options(kv_dtype=kv_dtype)).gpu_blocks

    assert blocks("fp8") in (2 * blocks("fp16"), 2 * blocks("fp16") + 1)


def test_fp8_weights_halve_weight_memory_and_double_the_gemm_rate():
    m, hw = load_model("llama-2-7b"), load_hardware("h100-sxm:datasheet")
    fp16 = RooflineCostModel(m, hw, dtype="fp16")
    fp8 = RooflineCostModel(m, hw, dtype="fp8", kv_dtype="fp8")
    prefill = BatchShape.prefill([4096])
    rows16 = {r.name: r for r in fp16.breakdown(prefill)}
    rows8 = {r.name: r for r in fp8.breakdown(prefill)}
    # same FLOPs at the FP8 peak (1979 vs 989.5 TFLOP/s), half the weight bytes
    assert rows8["gate_up_proj"].flops == rows16["gate_up_proj"].flops
    assert rows8["gate_up_proj"].compute_time_s == pytest.approx(rows16["gate_up_proj"].compute_time_s / 2, rel=1e-12)
    # attention computes in 16 bits (the FP8 cache is dequantised): same compute time
    assert rows8["qk"].compute_time_s == rows16["qk"].compute_time_s
    decode = BatchShape.decode(np.full(8, 1000))
    assert fp8.iteration_time_s(decode) < 0.6 * fp16.iteration_time_s(decode)
    # every weight but the 16-bit embedding, final norm and LM head (2 x 32,000 x 4,096 + 4,096)
    edges = 2 * 32_000 * 4_096 + 4_096
    assert m.weight_bytes("fp8") == (m.weight_bytes("fp16") / 2 - edges) + 2 * edges


@pytest.mark.parametrize("card", NO_FP8_CARDS)
def test_fp8_refused_before_ampere(card):
    hw = load_hardware(card)
    assert "fp8" not in hw.peak_tflops and "bf16" not in hw.peak_tflops
    with pytest.raises(InfersimError, match="fp8 needs FP8 tensor cores, or Ampere or later"):
        hw.require_dtype("fp8", "serving.dtype")


@pytest.mark.parametrize("card", W8A16_CARDS)
def test_fp8_on_ampere_is_weight_only(card):
    """One byte per layer weight, GEMMs at the 16-bit rate (vLLM's FP8 Marlin, W8A16): the int8
    weight-only pricing exactly, prefill and decode."""
    hw, m = load_hardware(card), load_model("llama-2-7b")
    hw.require_dtype("fp8", "serving.dtype")
    fp8 = RooflineCostModel(m, hw, dtype="fp8", kv_dtype="fp16")
    int8 = RooflineCostModel(m, hw, dtype="int8", kv_dtype="fp16")
    assert fp8.gemm_dtype == "fp16"
    for batch in (BatchShape.prefill([1024]), BatchShape.decode(np.full(8, 1000))):
        assert fp8.iteration_time_s(batch) == int8.iteration_time_s(batch)


@pytest.mark.parametrize(("field", "card"), [("dtype", "v100"), ("kv_dtype", "t4")])
def test_fp8_refused_in_a_workload_is_one_line_exit_2(tmp_path, capsys, field, card):
    wl = tmp_path / "fp8.yaml"
    wl.write_text(
        f"model: llama-2-7b\nhardware: {{profile: {card}}}\nserving: {{{field}: fp8}}\n"
        "requests:\n  count: 10\n  arrival: {type: poisson, rate: 1}\n"
        "  prompt_tokens: {type: fixed, value: 5}\n  output_tokens: {type: fixed, value: 5}\n"
    )
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "r"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "fp8.yaml" in err and f"serving.{field}" in err and f"'{card}'" in err
    assert not (tmp_path / "r").exists()


def test_fp8_workload_runs_on_h100(tmp_path):
    wl = tmp_path / "fp8.yaml"
    wl.write_text(
        "model: mixtral-8x7b\nhardware: {profile: h100-sxm}\nserving: {dtype: fp8, kv_dtype: fp8}\n"
        "requests:\n  count: 20\n  arrival: {type: poisson, rate: 5}\n"
        "  prompt_tokens: {type: fixed, value: 100}\n  output_tokens: {type: fixed, value: 20}\n"
    )
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "r"), "-q", "--no-plots"]) == 0


def test_fp8_weights_keep_16_bit_activations_in_the_memory_plan():
    """FP8 GEMMs quantise their input per token; the hidden states and the MLP's intermediate
    stay 16-bit, as the cost model prices them. Llama-3-70B FP8 at TP 2 on H100: the activation
    peak of 8,192 batched tokens is (4 x 8,192 + 2 x 28,672 / 2) x 2 bytes each, plus 256 fp32
    logit rows of 128,256."""
    m, hw = load_model("llama-3-70b"), load_hardware("h100-sxm")
    opts = memory_options(dtype="fp8", kv_dtype="fp8", tp=2, max_batched_tokens=8192, max_batch_size=256)
    act = 8192 * (4 * 8192 + 2 * 28672 / 2) * 2 + 256 * 128256 * 4
    plan = plan_memory(m, hw, opts)
    assert plan.activation_bytes_per_gpu == act
    # one byte per layer weight, two per embedding, final norm and LM head weight, over two GPUs
    edges = 2 * 128_256 * 8_192 + 8_192
    weights = (70_553_706_496 - edges + 2 * edges) / 2
    block = 16 * 80 * 2 * 4 * 128 * 1  # 16 tokens x 80 layers x K,V x 4 KV heads per GPU x 128 x 1 byte
    usable = 79.22 * 2**30 * 0.9 - 0.25 * 2**30  # driver-visible total x 0.9, less the non-torch reserve
    assert plan.gpu_blocks == int((usable - weights - act) // block)


def test_fp8_model_reads_its_lm_head_and_embedding_in_16_bits():
    """vLLM's FP8 method quantises linear layers; the LM head and the embedding table keep 16
    bits. Llama-2-7B's decode reads the 32,000 x 4,096 LM head at 2 bytes a weight whatever the
    layers' dtype, and a pipelined replica's stages hold the same bytes as the whole model."""
    m, hw = load_model("llama-2-7b"), load_hardware("h100-sxm:datasheet")
    decode = BatchShape.decode(np.full(1, 1000))
    for dtype in ("fp16", "fp8"):
        rows = {r.name: r for r in RooflineCostModel(m, hw, dtype=dtype).breakdown(decode)}
        assert rows["lm_head"].bytes == pytest.approx(32_000 * 4_096 * 2 + 4_096 * 2 + 32_000 * 2)
    placement = Placement(2, 2, stage_layers(m.num_layers, 2), ClusterSection())
    assert sum(stage_weight_bytes(m, placement, "fp8")) == pytest.approx(m.weight_bytes_per_gpu(2, "fp8"), rel=1e-12)
