"""Tensor parallelism over more GPUs than KV heads: the heads replicate (each rank holds
max(1, kv_heads / tp)), in the cost model and in the KV pool alike; degrees that split heads
unevenly are refused in one line."""

import pytest

from infersim.simulator.costmodel import RooflineCostModel
from infersim.simulator.engine.memory import plan_memory
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.validation import check_tensor_parallel
from tests.utils import llama_spec, memory_options

# Llama-3-70B's shape: 80 layers, hidden 8192, 64 query heads, 8 KV heads of 128, FFN 28672
LLAMA3_70B = llama_spec("llama-3-70b-like", 80, 8192, 64, 8, 28672, 128256)
# a 2-KV-head model: 4 layers, hidden 512, 8 query heads of 64
TWO_KV = llama_spec("two-kv", 4, 512, 8, 2, 1024, 1000)


@pytest.mark.parametrize(
    "spec, tp, heads",
    [
        (LLAMA3_70B, 1, 8),
        (LLAMA3_70B, 4, 2),
        (LLAMA3_70B, 8, 1),
        (LLAMA3_70B, 16, 1),
        (TWO_KV, 2, 1),
        (TWO_KV, 4, 1),
        (TWO_KV, 8, 1),
    ],
)
def test_kv_heads_per_gpu(spec, tp, heads):
    assert spec.kv_heads_per_gpu(tp) == heads


def test_kv_bytes_per_gpu_by_hand():
    # 2 (K and V) x 80 layers x heads x 128 x 2 bytes
    assert LLAMA3_70B.bytes_kv_per_token_per_gpu(4, "fp16") == 2 * 80 * 2 * 128 * 2 == 81920
    assert LLAMA3_70B.bytes_kv_per_token_per_gpu(8, "fp16") == 40960
    assert LLAMA3_70B.bytes_kv_per_token_per_gpu(16, "fp16") == 40960  # replicated, not 20480
    assert TWO_KV.bytes_kv_per_token_per_gpu(4, "fp16") == 2 * 4 * 1 * 64 * 2 == 1024  # not 512
    assert TWO_KV.bytes_kv_per_block_per_gpu(16, 4, "fp16") == 16 * 1024


def test_cost_model_counts_whole_replicated_heads_at_tp16():
    ops = {
        o.name: o
        for o in RooflineCostModel(
            LLAMA3_70B, load_hardware("h100-sxm"), tensor_parallel=16, fused_projections=False
        ).layer_ops
    }
    kv_local = 128  # one head of 128 per rank
    assert ops["kv_write"].bytes[1] == 2 * kv_local * (2 + 2)  # K and V written per token, fp16 in and out
    assert ops["qk"].bytes[3] == kv_local * 2  # keys read per cached token
    assert ops["k_proj"].bytes[0] == 8192 * kv_local * 2  # the rank's own copy of one head's weights
    assert ops["k_proj"].flops[1] == 2 * 8192 * kv_local
    assert ops["q_proj"].flops[1] == 2 * 8192 * 8192 / 16  # query heads still split: 4 per rank
    # fused (the default): one GEMM of the rank's 4 query heads and its own K and V head
    fused = {o.name: o for o in RooflineCostModel(LLAMA3_70B, load_hardware("h100-sxm"), tensor_parallel=16).layer_ops}
    assert fused["qkv_proj"].flops[1] == 2 * 8192 * (8192 / 16 + 2 * kv_local)


def test_weights_per_gpu_hold_replicated_kv_projections():
    params = LLAMA3_70B.params_total()
    assert LLAMA3_70B.weight_bytes_per_gpu(8, "fp16") == params * 2 / 8  # one head each: nothing replicated
    # at TP 16 the 8 heads' K and V columns (2 x 8 x 128 per layer) are held twice across the group
    extra = 80 * 2 * 8 * 128 * 8192
    assert LLAMA3_70B.weight_bytes_per_gpu(16, "fp16") == (params + extra) * 2 / 16


def test_kv_pool_block_bytes_use_replicated_heads():
    opts = memory_options(tp=4, swap_space_gb=1, max_batched_tokens=256, max_batch_size=8)
    plan = plan_memory(TWO_KV, load_hardware("a100-80gb-sxm"), opts)
    assert plan.kv_bytes_per_block == 16 * 1024


@pytest.mark.parametrize(
    "spec, tp, problem",
    [
        (LLAMA3_70B, 3, "tensor parallel 3 does not divide"),
        (LLAMA3_70B, 32, None),  # 64 % 32 == 0 and 32 % 8 == 0: allowed
        (
            llama_spec("odd", 1, 768, 12, 4, 1024, 100),
            6,
            "tensor parallel 6 neither divides",
        ),
    ],
)
def test_check_tensor_parallel(spec, tp, problem):
    if problem is None:
        check_tensor_parallel(spec, tp)
        return
    with pytest.raises(InfersimError) as err:
        check_tensor_parallel(spec, tp, source="w.yaml", field="hardware.tensor_parallel")
    assert str(err.value).startswith("w.yaml: field 'hardware.tensor_parallel': ") and problem in str(err.value)


def test_cost_model_refuses_an_uneven_split():
    with pytest.raises(InfersimError, match="does not divide"):
        RooflineCostModel(LLAMA3_70B, load_hardware("h100-sxm"), tensor_parallel=3)


def test_weights_that_fit_the_card_but_not_its_share_name_the_utilisation():
    """Llama-3-8B's 16.1 GB fit an H100 (79.22 GiB visible) but not 19% of it less the 0.25 GiB
    non-torch reserve (15.89 GB): the refusal names serving.gpu_memory_utilization; Llama-3-70B's
    141.1 GB fit no share of it and name the tensor parallelism."""
    from infersim.simulator.models.catalog import load_model

    h100 = load_hardware("h100-sxm")
    with pytest.raises(InfersimError) as exc:
        plan_memory(load_model("llama-3-8b"), h100, memory_options(gpu_memory_utilization=0.19), source="w.yaml")
    assert str(exc.value) == (
        "w.yaml: field 'serving.gpu_memory_utilization': model 'llama-3-8b' (16.1 GB of weights per GPU in fp16) "
        "does not fit in 'h100-sxm' (79.22 GiB visible x 0.19, less 0.25 GiB non-torch); raise "
        "serving.gpu_memory_utilization or "
        "hardware.tensor_parallel, or lower the dtype"
    )
    with pytest.raises(InfersimError, match="141.1 GB of weights per GPU in fp16.*raise hardware.tensor_parallel"):
        plan_memory(load_model("llama-3-70b"), h100, memory_options(), source="w.yaml")


def test_a_derived_pool_must_hold_one_sequence_of_max_model_len():
    """Llama-3-70B at TP 2 on H100 at 85%: 79.22 GiB x 0.85 less the 0.25 GiB non-torch reserve
    (72.03 GB usable), less 70.55 GB of weights and the activation peak of 8,192 batched tokens
    ((4 x 8,192 + 2 x 28,672 / 2) x 2 bytes each, plus 256 fp32 logit rows of 128,256), leaves 130
    blocks of 16 tokens (2.62 MB each at 4 KV heads per GPU): 2,080 tokens, fewer than the 8,192 of
    one full-length request. vLLM refuses to start; so do we.
    A fixed pool (serving.gpu_blocks, the papers' setups) stays the user's what-if."""
    from infersim.simulator.models.catalog import load_model

    m, h100 = load_model("llama-3-70b"), load_hardware("h100-sxm")
    act = 8192 * (4 * 8192 + 2 * 28672 / 2) * 2 + 256 * 128256 * 4
    blocks = int((79.22 * 2**30 * 0.85 - 0.25 * 2**30 - 70_553_706_496 - act) // (16 * 80 * 2 * 4 * 128 * 2))
    assert blocks == 130
    opts = memory_options(tp=2, max_batched_tokens=8192, max_model_len=8192, gpu_memory_utilization=0.85)
    with pytest.raises(InfersimError) as exc:
        plan_memory(m, h100, opts, source="w.yaml")
    assert str(exc.value) == (
        "w.yaml: field 'serving.max_model_len': the KV pool of 'h100-sxm' (79.22 GiB visible x 0.85, less 0.25 GiB "
        "non-torch, less 70.6 GB of llama-3-70b weights per GPU at tensor_parallel=2) holds 2,080 tokens, fewer "
        "than max_model_len 8,192; "
        "raise hardware.tensor_parallel or serving.gpu_memory_utilization, or lower serving.max_model_len"
    )
    at_85 = {"tp": 2, "max_batched_tokens": 8192, "gpu_memory_utilization": 0.85}
    assert plan_memory(m, h100, memory_options(**at_85, max_model_len=2080)).gpu_blocks == 130
    assert plan_memory(m, h100, memory_options(tp=2, max_model_len=8192, gpu_blocks=130)).gpu_blocks == 130
