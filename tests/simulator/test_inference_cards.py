"""The GPUs people own (T4, L4, A10, L40S, RTX 4090, A100) with the weight-only quantised
checkpoints they run on them: dtypes a card cannot run are refused, int4 weights are priced with
their group scales, hand-checked decode times."""

import pytest
import yaml

from infersim.cli.main import main
from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.models.catalog import load_model
from infersim.simulator.models.dtypes import kv_dtype_for
from tests.utils import one_line_error, requests_section, write_yaml

NO_BF16_CARDS = ["t4", "v100"]


def card_workload(model: str, profile: str, dtype: str) -> dict:
    """Four short requests of `model` in `dtype` on one `profile` card."""
    return {
        "model": model,
        "hardware": {"profile": profile},
        "serving": {"dtype": dtype},
        "requests": requests_section(4, 8, 4),
    }


@pytest.mark.parametrize("card", NO_BF16_CARDS)
def test_bf16_refused_on_cards_without_bf16_tensor_cores(card):
    hw = load_hardware(card)
    assert "bf16" not in hw.peak_tflops
    with pytest.raises(InfersimError, match="bf16 needs bf16 tensor cores.*use fp16"):
        hw.require_dtype("bf16", "serving.dtype")
    hw.require_dtype("fp16", "serving.dtype")  # fp16 runs


def test_bf16_on_t4_workload_is_one_line_exit_2(tmp_path, capsys):
    wl = write_yaml(tmp_path / "t4.yaml", card_workload("llama-2-7b", "t4", "bf16"))
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "r"), "-q"]) == 2
    err = one_line_error(capsys)
    assert "t4.yaml" in err and "serving.dtype" in err and "'t4'" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("dtype", "advice"), [("fp16", True), ("int4", False)])
def test_a_model_too_big_for_the_card_is_told_to_lower_the_dtype_only_when_one_is_lower(
    tmp_path, capsys, dtype, advice
):
    """Llama-3-70B on one RTX 4090 (24 GB): 141.1 GB of weights in fp16, 39.8 GB in int4, neither
    fits; int4 is the smallest dtype, so its refusal names only the parallel degrees."""
    wl = write_yaml(tmp_path / "big.yaml", card_workload("llama-3-70b", "rtx-4090", dtype))
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "r"), "-q"]) == 2
    err = one_line_error(capsys)
    assert "big.yaml" in err and "does not fit" in err and "raise hardware.tensor_parallel" in err
    assert ("lower the dtype" in err) is advice
    assert not (tmp_path / "r").exists()


def test_roofline_bf16_on_t4_exits_2(capsys):
    assert main(["roofline", "--model", "llama-3-8b", "--hardware", "t4", "--dtype", "bf16", "--phase", "decode"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--dtype" in err and "bf16" in err


def test_int4_decode_at_batch_1_reads_the_quantised_weights_on_the_datasheet_roofline():
    """Llama-3-8B int4 on an L4 (300 GB/s): a batch-1 decode step reads the 6,979,584,000 layer
    weights at 0.51953 bytes (3.626 GB), the 16-bit LM head (1.051 GB) and one embedding row:
    4.677 GB / 300 GB/s = 15.6 ms, against 50.0 ms at fp16 (3.2x)."""
    m, hw = load_model("llama-3-8b"), load_hardware("l4:datasheet")
    step = BatchShape.decode([16])
    layers = 6_979_584_000 * (0.5 + 2.5 / 128)
    lm_head = 128_256 * 4_096 * 2
    t4 = RooflineCostModel(m, hw, dtype="int4").iteration_time_s(step)
    t16 = RooflineCostModel(m, hw, dtype="fp16").iteration_time_s(step)
    assert t4 == pytest.approx((layers + lm_head) / 300e9, rel=0.01)
    assert t4 == pytest.approx(15.6e-3, rel=0.01)
    assert t16 / t4 == pytest.approx(3.2, abs=0.05)


def test_quantised_weights_keep_a_16_bit_kv_cache():
    """FP8, AWQ and GPTQ checkpoints keep their KV cache in the activations' 16 bits (vLLM's and
    SGLang's kv_cache_dtype "auto" is the model's dtype, bf16 or fp16 in such a checkpoint's
    config); an explicit kv_dtype wins, as `--kv-cache-dtype fp8` does there."""
    assert kv_dtype_for("int4") == "fp16" and kv_dtype_for("int8") == "fp16"
    assert kv_dtype_for("fp8") == "fp16" and kv_dtype_for("bf16") == "bf16"
    assert kv_dtype_for("fp8", "fp8") == "fp8" and kv_dtype_for("int4", "fp8") == "fp8"
    for dtype in ("fp8", "int4"):
        assert RooflineCostModel(load_model("llama-3-8b"), load_hardware("l4"), dtype=dtype).kv_dtype == "fp16"


@pytest.mark.parametrize("kv_dtype,block_bytes,blocks", [(None, 2 * 2**20, 5_426), ("fp8", 2**20, 10_853)])
def test_llama_3_8b_fp8_kv_pool_on_an_l4_by_hand(tmp_path, kv_dtype, block_bytes, blocks):
    """24 GB x 0.9 - 0.25 GiB non-torch - 9,080,938,496 B of fp8 weights (the layers' GEMM
    weights at 1 byte, embedding and LM head at 2) - 869,531,648 B of activations = 11.381 GB.
    By default the cache is 16-bit: blocks of 32 layers x 2 x 1,024 x 2 B x 16 = 2 MiB, 5,426 of
    them (86,816 tokens); `serving.kv_dtype: fp8` halves the block and holds 10,853 (173,648)."""
    wl = card_workload("llama-3-8b", "l4", "fp8")
    wl["serving"]["kv_dtype"] = kv_dtype
    assert (
        main(["run", "-w", str(write_yaml(tmp_path / "fp8.yaml", wl)), "-o", str(tmp_path / "r"), "-q", "--no-plots"])
        == 0
    )
    memory = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["memory"]
    assert memory["weight_bytes_per_gpu"] == 9_080_938_496
    assert memory["activation_bytes_per_gpu"] == 869_531_648
    assert memory["kv_bytes_per_block"] == 32 * 2 * 1_024 * (1 if kv_dtype else 2) * 16 == block_bytes
    free = 24e9 * 0.9 - 0.25 * 2**30 - 9_080_938_496 - 869_531_648
    assert memory["gpu_blocks"] == int(free // block_bytes) == blocks


def test_llama_3_8b_int4_kv_pool_on_an_l4_by_hand(tmp_path):
    """24 GB x 0.9 - 0.25 GiB non-torch - 5,727,466,496 B of int4 weights - 869,531,648 B of
    activations (8,192 batched tokens, the model's context, x (4 x 4,096 + 2 x 14,336) x 2 B, and
    256 x 128,256 x 4 B of logits) = 14.735 GB over 16-token fp16 blocks of 32 layers x 2 x 1,024 x 2 B x 16 = 2 MiB: 7,025 blocks
    (112,400 tokens). With the KV cache in int4, as the weights were, it held 28,103."""
    wl = write_yaml(tmp_path / "int4.yaml", card_workload("llama-3-8b", "l4", "int4"))
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "r"), "-q", "--no-plots"]) == 0
    memory = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["memory"]
    assert memory["weight_bytes_per_gpu"] == 5_727_466_496
    assert memory["kv_bytes_per_block"] == 32 * 2 * 1_024 * 2 * 16
    act = 8_192 * (4 * 4_096 + 2 * 14_336) * 2 + 256 * 128_256 * 4
    assert memory["activation_bytes_per_gpu"] == act
    free = 24e9 * 0.9 - 0.25 * 2**30 - 5_727_466_496 - act
    assert memory["gpu_blocks"] == int(free // (2 * 2**20)) == 7_025
