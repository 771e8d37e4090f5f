"""Data-parallel attention with expert parallelism, checked against hand calculations: the
dispatch and combine all-to-alls of DeepSeek-V3 at EP 8 and EP 16, a rank's weights and KV
pool beside tensor-parallel attention's, and a decode step at batch 32 per rank against a
roofline worked out from the checkpoint's config numbers."""

from __future__ import annotations

import numpy as np
import pytest

from infersim.simulator.costmodel import BatchShape
from infersim.simulator.errors import InfersimError
from infersim.simulator.simulation import Simulation, simulate
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import WorkloadSpec
from tests.simulator.test_moe_staged import (
    ATTN_COMPUTE,
    ATTN_MEMORY,
    BF16_PEAK,
    BW,
    DEEPSEEK_V3,
    FP8_PEAK,
    _kv_bytes,
    gemm_s,
    layer_s,
    touched,
)
from tests.utils import poisson, requests_section

H = DEEPSEEK_V3.hidden
DISPATCH_COPY = H + 4 * H / 128  # fp8 values and one float32 scale per 128
COMBINE_COPY = 2 * H  # bf16
NVLINK, NVLINK_LATENCY = 450e9, 10e-6  # the H100/H200 profiles' NVLink 4, per direction; default latency
NETWORK, NETWORK_LATENCY = 50e9, 5e-6  # the default cluster: one 400 Gb/s NDR adapter per GPU


def dp_spec(ep: int, profile: str = "h100-sxm:datasheet", replicas: int | None = None, **hardware) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {
            "model": hardware.pop("model", "deepseek-v3"),
            "hardware": {
                "profile": profile,
                "replicas": replicas or ep,
                "expert_parallel": ep,
                "data_parallel_attention": True,
                **hardware,
            },
            "serving": {"dtype": "fp8", "max_model_len": 8192, "chunked_prefill": True, "max_batched_tokens": 2048},
            "requests": requests_section(32, 600, 40, poisson(4.0)),
            "seed": 5,
        }
    )


def build(spec: WorkloadSpec) -> Simulation:
    return Simulation(spec, build_requests(spec, "."))


@pytest.mark.parametrize(
    "ep,profile,dispatch_us,combine_us",
    [
        # one node: 7 of every token's 8 copies leave the GPU over NVLink
        # dispatch 128 x 7 x 7,392 B = 6.62 MB at 450 GB/s = 14.72 us + 10 us; combine 12.85 MB = 28.54 + 10
        (8, "h200:datasheet", 10 + 128 * 7 * DISPATCH_COPY / NVLINK * 1e6, 10 + 128 * 7 * COMBINE_COPY / NVLINK * 1e6),
        # two nodes: 3.5 copies to the node's 7 peers over NVLink, 4 to the other node's 8 through the
        # 50 GB/s adapter, which sets the time: 128 x 4 x 7,392 B = 3.78 MB = 75.69 us + 5 us
        (
            16,
            "h100-sxm:datasheet",
            5 + 128 * 4 * DISPATCH_COPY / NETWORK * 1e6,
            5 + 128 * 4 * COMBINE_COPY / NETWORK * 1e6,
        ),
    ],
)
def test_all_to_all_bytes_and_time_for_deepseek_v3(ep, profile, dispatch_us, combine_us):
    a2a = build(dp_spec(ep, profile)).cost_model.all_to_all
    in_node, across = a2a.remote_copies_per_token()
    assert (in_node, across) == ((7.0, 0.0) if ep == 8 else (3.5, 4.0))
    assert (a2a.dispatch_bytes_per_copy, a2a.combine_bytes_per_copy) == (7392.0, 14336.0)
    assert a2a.dispatch_time_s(128) * 1e6 == pytest.approx(dispatch_us, rel=1e-12)
    assert a2a.combine_time_s(128) * 1e6 == pytest.approx(combine_us, rel=1e-12)
    assert (round(dispatch_us, 2), round(combine_us, 2)) == ((24.72, 38.54) if ep == 8 else (80.69, 151.8))


def test_a_rank_holds_its_share_of_the_experts_and_a_kv_pool_of_its_own():
    """EP 16: each GPU holds 16 of the 256 experts of each of the 58 sparse layers and everything
    else whole: 59.84 GB of fp8 weights, against TP 16's 42.92 GB. Its pool holds 228,336 tokens
    of MLA's 576-element latents (61 layers, 16-bit: the default cache under fp8 weights), half of
    TP 16's 471,120, but every one of the 16 ranks has one: 3.65M tokens on the 16 GPUs against
    TP 16's 0.47M, since TP 16 keeps the same latent cache on every GPU."""
    c = DEEPSEEK_V3
    dp = build(dp_spec(16))
    tp = build(
        WorkloadSpec.model_validate(
            {**dp.spec.model_dump(), "hardware": {"profile": "h100-sxm:datasheet", "tensor_parallel": 16}}
        )
    )
    experts = 58 * 256 * 3 * H * c.expert_intermediate  # routed expert weights, 1 byte each in fp8
    assert dp.memory.weight_bytes_per_gpu == pytest.approx(dp.model.weight_bytes("fp8") - experts * 15 / 16, rel=1e-12)
    assert round(dp.memory.weight_bytes_per_gpu / 1e9, 2) == 59.84
    block = (
        16 * 61 * (512 + 64) * 2
    )  # tokens x layers x latent elements x 2 bytes, the same on every GPU of either layout
    usable = dp.hardware.memory_bytes() * 0.9 - 0.25 * 2**30
    for sim in (dp, tp):
        m = sim.memory
        assert m.kv_bytes_per_block == block
        assert m.gpu_blocks == int((usable - m.weight_bytes_per_gpu - m.activation_bytes_per_gpu) // block)
    assert (dp.memory.gpu_blocks * 16, tp.memory.gpu_blocks * 16) == (228_336, 471_120)
    assert len(dp.replicas) == 16 and len(tp.replicas) == 1


def test_decode_step_at_batch_32_per_rank_against_a_roofline_by_hand():
    """A rank's decode step over 1,024-token contexts, its 15 peers alike: its own attention,
    dense layers, router, shared expert and 16-bit LM head at tensor parallel 1 on its 32 tokens;
    in each of the 58 sparse layers its GPU's experts on 32 x 8 = 256 token copies (the group's
    512 tokens x 8 / 16), of which its 16 experts see 16 (1 - (1 - 8/256)^512) = 16.0 distinct,
    and the dispatch and combine of its 32 tokens. Within 1% of the hand sum."""
    c, T = DEEPSEEK_V3, 32
    cm = build(dp_spec(16)).cost_model
    kv, pairs = _kv_bytes(c, 1, T * 1025), T * 1025
    w = c.expert_intermediate

    def experts_s(copies, n):
        return gemm_s(copies, H, 2 * w, n * H * 2 * w, 1, FP8_PEAK) + gemm_s(copies, w, H, n * w * H, 1, FP8_PEAK)

    group_touched = 16 * (1 - (1 - 8 / 256) ** (16 * T))
    a2a = (
        5e-6
        + T * 4 * DISPATCH_COPY / NETWORK  # the network share is the slower one at EP 16
        + 5e-6
        + T * 4 * COMBINE_COPY / NETWORK
    )
    # layer_s prices attention as one pass over the cache; at tensor parallel 1 the 128 heads'
    # latent queries (T x 128 x 576, 16-bit) and outputs (T x 128 x 512) are as large as the cache
    # read, so the scores (reading cache and queries) and the weighted sum (writing outputs) count
    # apart, each at the larger of its FLOPs and its bytes
    both = max(2 * 320 * 128 * pairs / (ATTN_COMPUTE * BF16_PEAK), kv / (ATTN_MEMORY * BW))
    scores = max(2 * 192 * 128 * pairs / (ATTN_COMPUTE * BF16_PEAK), (kv + T * 128 * 576 * 2) / (ATTN_MEMORY * BW))
    values = max(2 * 128 * 128 * pairs / (ATTN_COMPUTE * BF16_PEAK), T * 128 * 512 * 2 / (ATTN_MEMORY * BW))
    attention = scores + values - both
    sparse = layer_s(c, 1, True, T, kv, pairs, 1) - experts_s(T * 8, touched(c, T)) + experts_s(T * 8, group_touched)
    sparse += a2a + attention
    dense = layer_s(c, 1, False, T, kv, pairs, 1) + attention
    hand = 3 * dense + 58 * sparse + T * H * 2 * 3 / BW + gemm_s(T, H, c.vocab, H * c.vocab, 2, BF16_PEAK)
    got = cm.iteration_time_s(BatchShape.decode([1024] * T))
    assert got == pytest.approx(hand, rel=0.01)
    assert round(got * 1e3, 1) == 22.8  # ms; TP 16 takes 19.7 ms for a batch of 32, 1/16 of the tokens


@pytest.mark.parametrize(
    "hardware,needle",
    [
        ({"tensor_parallel": 2}, "field 'hardware.tensor_parallel': 2 with data_parallel_attention"),
        ({"pipeline_parallel": 2}, "field 'hardware.pipeline_parallel'"),
        ({"replicas": 24}, "field 'hardware.replicas': 24 is not a multiple of hardware.expert_parallel 16"),
        (
            {"expert_parallel": 1, "replicas": 2},
            "field 'hardware.expert_parallel': data_parallel_attention needs at least 2",
        ),
        (
            {"expert_parallel": 12, "replicas": 12},
            "field 'hardware.expert_parallel': 12 does not divide the 256 experts",
        ),
        ({"model": "llama-2-7b"}, "field 'hardware.data_parallel_attention': needs a mixture-of-experts model"),
        (
            {"disaggregated": {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}, "replicas": 1},
            "field 'hardware.data_parallel_attention': does not combine with hardware.disaggregated",
        ),
    ],
)
def test_bad_groups_are_refused_in_one_line_naming_the_field(hardware, needle):
    spec = dp_spec(hardware.pop("expert_parallel", 16), **hardware)
    with pytest.raises(InfersimError) as err:
        build(spec)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_rank_whose_weights_do_not_fit_names_the_group_size():
    """EP 8 leaves 100.7 GB of DeepSeek-V3 per 80 GB H100 (it fits the 141 GB H200)."""
    with pytest.raises(InfersimError) as err:
        build(dp_spec(8))
    assert "field 'hardware.expert_parallel': 8 ranks leave 100.7 GB of 'deepseek-v3' weights" in str(err.value)
    assert build(dp_spec(8, "h200:datasheet")).memory.gpu_blocks > 0


def test_serving_is_deterministic_and_spreads_requests_over_the_ranks():
    spec = dp_spec(16)
    a, b = simulate(spec, build_requests(spec, ".")), simulate(spec, build_requests(spec, "."))
    assert np.array_equal(a.requests["finish_s"], b.requests["finish_s"])
    assert np.isfinite(a.requests["finish_s"]).all()
    assert a.resolved["parallel"]["data_parallel_attention"] == {"expert_parallel": 16, "groups": 1}


def test_two_groups_side_by_side():
    sim = build(dp_spec(16, replicas=32))
    assert len(sim.replicas) == 32 and sim.spec.hardware.gpus == 32
    assert sim.resolved()["parallel"]["data_parallel_attention"] == {"expert_parallel": 16, "groups": 2}


def test_a_saturated_chat_burst_decodes_faster_with_dp_attention_than_tp16():
    """256 requests of 600 + 100 tokens at once on 16 H100: the last finishes after 3.4 s with
    DP 16 + EP 16 and 18.5 s with TP 16, whose one engine prefills the 153,600 prompt tokens in
    2,048-token chunks across both nodes (about 190 ms each) and whose every GPU reads the whole
    batch's latent cache, where each rank prefills and reads its own 16 sequences."""
    out = {}
    for hardware in ({"replicas": 16, "expert_parallel": 16, "data_parallel_attention": True}, {"tensor_parallel": 16}):
        spec = WorkloadSpec.model_validate(
            {
                "model": "deepseek-v3",
                "hardware": {"profile": "h100-sxm:datasheet", **hardware},
                "serving": {"dtype": "fp8", "max_model_len": 8192, "chunked_prefill": True, "max_batched_tokens": 2048},
                "requests": requests_section(256, 600, 100),
                "seed": 1,
            }
        )
        r = simulate(spec, build_requests(spec, ".")).requests
        out[hardware.get("tensor_parallel", 1)] = float(r["finish_s"].max())
    assert out[1] < out[16], out
