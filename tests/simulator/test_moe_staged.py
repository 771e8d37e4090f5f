"""Mixture-of-experts models on staged replicas (pipeline stages, tensor-parallel groups across
nodes), checked against hand calculations: each stage's dense and sparse layers, the weights a
stage holds, and decode and prefill times of DeepSeek-V3 on 2 x 8 H100 and Mixtral-8x22B on
2 x 4 and 1 x 8 H100 against a roofline worked out from the checkpoints' config numbers."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.models.catalog import load_model
from infersim.simulator.parallel.config import ClusterSection
from infersim.simulator.parallel.cost import PipelineCostModel
from infersim.simulator.parallel.memory import stage_weight_bytes
from infersim.simulator.parallel.placement import check_parallel
from infersim.simulator.simulation import simulate
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import HardwareSection, WorkloadSpec
from tests.utils import poisson, requests_section

BW = 3350e9  # H100 SXM datasheet bytes/s; linear and elementwise efficiencies 1.0 on the datasheet profile
FP8_PEAK, BF16_PEAK = 1979e12, 989.5e12
ATTN_COMPUTE, ATTN_MEMORY = 0.75, 0.8  # the profile's attention efficiencies (FlashAttention-3; paged decode)


@dataclass(frozen=True)
class Config:
    """The numbers of a checkpoint's config.json a hand calculation needs."""

    hidden: int
    dense_layers: int  # leading dense layers (DeepSeek's first_k_dense_replace)
    vocab: int
    dense_intermediate: int
    experts: int
    top_k: int
    expert_intermediate: int
    shared_intermediate: int
    kv_per_token_layer: int  # cached elements per token and layer, all heads
    kv_split: bool  # whether the cache splits over the ranks (MLA's latent does not)
    attn_flops_per_pair: int  # per head: query-key plus attention-value multiply-adds
    heads: int

    def attention_gemms(self, tp: int) -> list[tuple[float, float]]:
        """(inputs, outputs) per rank of each attention projection."""
        h = self.hidden
        if not self.kv_split:  # MLA: q_a and kv_a whole on every rank, q_b, kv_b, o split by heads
            return [(h, 1536), (1536, 128 * 192 / tp), (h, 512 + 64), (512, 128 * 256 / tp), (128 * 128 / tp, h)]
        return [(h, (h + self.kv_per_token_layer) / tp), (h / tp, h)]  # fused q, k, v; o


DEEPSEEK_V3 = Config(7168, 3, 129280, 18432, 256, 8, 2048, 2048, 512 + 64, False, 192 + 128, 128)
MIXTRAL_8X22B = Config(6144, 0, 32768, 0, 8, 2, 16384, 0, 2 * 8 * 128, True, 128 + 128, 48)


def touched(c: Config, tokens: float) -> float:
    """Distinct experts a batch of `tokens` picks under uniform top-k routing: E (1 - (1 - k/E)^T)."""
    return c.experts * (1 - (1 - c.top_k / c.experts) ** tokens)


def gemm_s(tokens, n_in, n_out, weights_read, wb, peak) -> float:
    """max(2 FLOPs per weight per token at the peak, the weights read plus 16-bit inputs and outputs)."""
    return max(2 * tokens * n_in * n_out / peak, (weights_read * wb + tokens * (n_in + n_out) * 2) / BW)


def layer_s(c: Config, tp: int, sparse: bool, tokens: int, kv_read: float, pairs: float, wb: float) -> float:
    """One layer on one rank: the attention projections, the attention (FLOPs over the query-key
    pairs, the cached keys read), the MLP (dense, or router, shared experts and the experts the
    batch touched, each expert split over the ranks), and the norms, residual adds and the
    weighted sum of the k expert outputs (16-bit passes over the tokens)."""
    h, peak = c.hidden, FP8_PEAK if wb == 1 else BF16_PEAK
    t = sum(gemm_s(tokens, i, o, i * o, wb, peak) for i, o in c.attention_gemms(tp))
    t += max(
        2 * c.attn_flops_per_pair * c.heads / tp * pairs / (ATTN_COMPUTE * BF16_PEAK), kv_read / (ATTN_MEMORY * BW)
    )
    passes = 2 * 2 * h + 2 * 3 * h  # two norms (read, write), two residual adds (two reads, a write)
    if sparse:
        w, s = c.expert_intermediate / tp, c.shared_intermediate / tp
        t += gemm_s(tokens, h, c.experts, h * c.experts, wb, peak)
        if s:
            t += gemm_s(tokens, h, 2 * s, h * 2 * s, wb, peak) + gemm_s(tokens, s, h, s * h, wb, peak)
            passes += 3 * s
        copies, n = tokens * c.top_k, touched(c, tokens)
        t += gemm_s(copies, h, 2 * w, n * h * 2 * w, wb, peak) + gemm_s(copies, w, h, n * w * h, wb, peak)
        passes += (c.top_k + 1) * h + c.top_k * 3 * w  # the weighted sum; the experts' activation
    else:
        d = c.dense_intermediate / tp
        t += gemm_s(tokens, h, 2 * d, h * 2 * d, wb, peak) + gemm_s(tokens, d, h, d * h, wb, peak)
        passes += 3 * d
    return t + tokens * passes * 2 / BW


def hand_iteration_s(c: Config, hw, p, tokens: int, logits: int, kv_read: float, pairs: float, wb: float) -> float:
    """Stages one after another: each stage's own layers (dense and sparse by the model's
    layout), two all-reduces per layer, the embedding on the first stage and the final norm and
    16-bit LM head on the last, and the hand-off between stages (hidden state and residual,
    16-bit) at the profile's measured send/recv."""
    coll = hw.collectives
    ar_bytes = tokens * c.hidden * 2
    if p.tp_crosses_nodes:  # the node's all-reduce, two network hops and the ring through 50 GB/s adapters
        hop = next(f for f in coll.send_recv if f.devices_per_node == 1).segments[0].latency_us * 1e-6
        ar = float(coll.all_reduce_time_s(ar_bytes, 8)) + 2 * hop + 2 * (p.tp - 1) / p.tp * ar_bytes / 50e9
    else:
        ar = float(coll.all_reduce_time_s(ar_bytes, p.tp))
    total = 0.0
    for a, b in p.layer_ranges:
        total += sum(layer_s(c, p.tp, i >= c.dense_layers, tokens, kv_read, pairs, wb) for i in range(a, b))
        total += (b - a) * 2 * ar
    total += tokens * c.hidden * 2 * 3 / BW  # embedding rows written; final norm read and written
    total += gemm_s(logits, c.hidden, c.vocab / p.tp, c.hidden * c.vocab / p.tp, 2, BF16_PEAK)
    send = next(f for f in coll.send_recv if f.devices_per_node == 1)
    for s in range(p.pp - 1):
        nbytes = 2 * tokens * c.hidden * 2
        total += float(send.time_s(nbytes)) if p.boundary_crosses_nodes(s) else float(coll.send_recv_time_s(nbytes))
    return total


def staged(name, tp, pp, gpus_per_node, dtype):
    model, hw = load_model(name), load_hardware("h100-sxm:datasheet")
    p = check_parallel(
        model, HardwareSection(tensor_parallel=tp, pipeline_parallel=pp, cluster={"gpus_per_node": gpus_per_node})
    )
    base = RooflineCostModel(model, hw, dtype=dtype, tensor_parallel=tp)
    return model, hw, p, (PipelineCostModel(base, p) if p.staged else base)


def test_deepseek_stages_hold_their_own_dense_and_sparse_layers():
    """61 layers on 2 stages: 31 + 30 (vLLM's split); the first 3 are dense, so stage 0 holds 28
    sparse layers and stage 1 all 30 of its own. A sparse layer's 256 experts make it 17x a
    dense layer's weights (1.45 GB against 86 MB per GPU in fp8 at TP 8), and the stages'
    weights add up to the replica's."""
    model, _, p, _ = staged("deepseek-v3", 8, 2, 8, "fp8")
    c = DEEPSEEK_V3
    assert p.layers == (31, 30) and p.layer_ranges == ((0, 31), (31, 61)) and p.sparse_layers(model) == (28, 30)
    dense, sparse = model.layer_weight_bytes_per_gpu(8, "fp8")
    h = c.hidden
    experts = c.experts * 3 * h * c.expert_intermediate + c.experts * h + 3 * h * c.shared_intermediate  # + router
    assert sparse - dense == pytest.approx((experts - 3 * h * c.dense_intermediate) / 8, rel=1e-12)
    w = stage_weight_bytes(model, p, "fp8")
    assert sum(w) == pytest.approx(model.weight_bytes_per_gpu(8, "fp8"), rel=1e-12)
    embedding = c.vocab * c.hidden * 2 / 8
    assert w[0] == pytest.approx(3 * dense + 28 * sparse + embedding, rel=1e-12)
    # per GPU: 41.1 GB on stage 0, 43.8 GB on stage 1 (the LM head and two more sparse layers)
    assert (round(w[0] / 1e9, 1), round(w[1] / 1e9, 1)) == (41.1, 43.8)
    assert (round(sparse / 1e9, 2), round(dense / 1e6)) == (1.45, 86)


def test_a_staged_moe_replica_adds_up_to_the_roofline_of_the_whole_model():
    """Within a node (TP 4 x PP 2 on 16-GPU nodes) a stage's all-reduces are the node's, so the
    stages together are the one-replica roofline exactly: every layer is priced once, dense and
    sparse where the model has them, routed experts included."""
    for name in ("deepseek-v3", "mixtral-8x22b"):
        model, hw, p, cm = staged(name, 4, 2, 16, "fp8")
        base = cm.base
        for shape in (BatchShape.decode([700] * 16), BatchShape.prefill([512, 300])):
            stages, _ = cm.stage_times_s(shape)
            assert stages.sum() == pytest.approx(base.iteration_time_s(shape), rel=1e-12)


CASES = {
    # (model, tp, pp, gpus per node, dtype): 2 x 8 H100 as vLLM serves DeepSeek-V3 across two nodes
    "deepseek-v3 tp8 x pp2": ("deepseek-v3", DEEPSEEK_V3, 8, 2, 8, "fp8"),
    "deepseek-v3 tp16": ("deepseek-v3", DEEPSEEK_V3, 16, 1, 8, "fp8"),
    "mixtral-8x22b tp4 x pp2 (2 x 4)": ("mixtral-8x22b", MIXTRAL_8X22B, 4, 2, 4, "bf16"),
    "mixtral-8x22b tp8 (1 x 8)": ("mixtral-8x22b", MIXTRAL_8X22B, 8, 1, 8, "bf16"),
}


def _kv_bytes(c: Config, tp: int, contexts: int) -> float:
    """Cached keys one rank reads for `contexts` tokens of one layer, 2 bytes each: the cache stays
    16-bit under fp8 weights as under bf16 (vLLM's `kv_cache_dtype: auto`)."""
    per_rank = c.kv_per_token_layer / tp if c.kv_split else c.kv_per_token_layer
    return per_rank * contexts * 2


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("batch", [1, 64])
def test_decode_step_against_a_roofline_by_hand(case, batch):
    """A decode step over 1,024-token contexts (its TPOT): the weights each stage reads (at
    batch 64 most experts: 222 of DeepSeek's 256, all 8 of Mixtral's), the cached keys, two
    all-reduces per layer and the hand-off, within 1% of the hand sum (which leaves out the
    rotary, the KV write, the small latent norms and the top-k selection)."""
    name, c, tp, pp, g, dtype = CASES[case]
    model, hw, p, cm = staged(name, tp, pp, g, dtype)
    wb = 1 if dtype == "fp8" else 2
    kv = _kv_bytes(c, tp, batch * 1025)
    hand = hand_iteration_s(c, hw, p, batch, batch, kv, batch * 1025, wb)
    assert cm.iteration_time_s(BatchShape.decode([1024] * batch)) == pytest.approx(hand, rel=0.01)


@pytest.mark.parametrize("case", list(CASES))
def test_prefill_of_2k_tokens_against_a_roofline_by_hand(case):
    """A 2,048-token prompt alone (its TTFT): each GEMM at the larger of its FLOPs at the FP8 (or
    BF16) peak and its bytes (DeepSeek's experts see 64 tokens each, so they stay memory bound
    at TP 8), the attention over the 2,048^2 query-key pairs the roofline counts, the
    all-reduces of 2,048 x hidden and the hand-off, within 1% of the hand sum."""
    name, c, tp, pp, g, dtype = CASES[case]
    model, hw, p, cm = staged(name, tp, pp, g, dtype)
    wb = 1 if dtype == "fp8" else 2
    T = 2048
    hand = hand_iteration_s(c, hw, p, T, 1, 0.0, T * T, wb)
    assert cm.iteration_time_s(BatchShape.prefill([T])) == pytest.approx(hand, rel=0.01)


def test_deepseek_on_two_h100_nodes_serves_deterministically():
    """DeepSeek-V3 in fp8 on 2 x 8 H100, TP 8 x PP 2 and TP 16: both run (neither was accepted
    before), give identical results twice, and TP 8 x PP 2's decode is the faster at batch 1
    (its all-reduces stay inside a node)."""
    results = {}
    for tp, pp in ((8, 2), (16, 1)):
        spec = WorkloadSpec.model_validate(
            {
                "model": "deepseek-v3",
                "hardware": {"profile": "h100-sxm", "tensor_parallel": tp, "pipeline_parallel": pp},
                "serving": {"dtype": "fp8"},
                "requests": requests_section(4, 2048, 16, poisson(0.2)),
                "seed": 3,
            }
        )
        a = simulate(spec, build_requests(spec, "."))
        b = simulate(spec, build_requests(spec, "."))
        assert np.array_equal(a.requests["finish_s"], b.requests["finish_s"])
        assert a.metrics.counters["iterations"] > 0
        results[(tp, pp)] = a.requests
    tpot = {k: float(np.mean((r["finish_s"] - r["first_token_s"]) / 15)) for k, r in results.items()}
    assert tpot[(8, 2)] < tpot[(16, 1)]


def test_default_cluster_places_tp16_across_two_nodes():
    p = check_parallel(load_model("deepseek-v3"), HardwareSection(tensor_parallel=16))
    assert p.tp_crosses_nodes and p.staged and p.nodes == 2 and p.cluster == ClusterSection()
