"""Data-parallel attention with expert parallelism (`hardware.data_parallel_attention: true`,
`hardware.expert_parallel: N`), as SGLang's `--enable-dp-attention --ep-size N` and vLLM's
`--data-parallel-size N --enable-expert-parallel` serve DeepSeek-V3/R1 and Qwen3-MoE.

Each GPU is a replica for routing and KV: its own scheduler and KV pool, attention, dense
layers, shared experts, router and LM head whole (tensor parallel 1) on its own requests' tokens.
The routed experts of every sparse layer are spread over a group of N replicas, E/N whole
experts per GPU, and computed jointly: dispatch all-to-all, each GPU's experts on the copies
routed to them, combine all-to-all (parallel/alltoall.py).

The ranks of a group step in lockstep, since every sparse layer waits for all of them. The
simulator models this in the mean: a rank's iteration is priced as if every rank of its group
ran a batch of its own shape at the same moment, so its sparse layers see N times its tokens,
T N k / N = T k token copies on each GPU, over the E/N experts that GPU holds. A rank whose
batch is smaller or empty does not wait for a busier peer here, and an idle rank's dummy
forward pass (which SGLang and vLLM run to keep the collectives matched) costs nothing; with
balanced load (round-robin routing of similar requests) the ranks' batches are alike and the
mean is the lockstep."""

from __future__ import annotations

import numpy as np

from ..costmodel.moe import RoutedExperts
from ..models.dtypes import weight_bytes_per_element
from .alltoall import AllToAll, AllToAllLinks, combine_bytes_per_copy, dispatch_bytes_per_copy
from .config import ClusterSection
from .cost import PipelineCostModel
from .dp_rules import fail
from .placement import Placement


def dp_attention_weight_bytes_per_gpu(model, ep: int, dtype: str) -> float:
    """One rank's weights: the whole model but its routed experts, of which it holds E/N."""
    moe = model.moe
    experts = model.moe_layers * moe.num_experts * moe.params_expert(model.hidden_size, model.mlp == "gated")
    return model.weight_bytes(dtype) - experts * weight_bytes_per_element(dtype) * (1.0 - 1.0 / ep)


def check_rank_weights_fit(model, hw, opts, ep: int, source: str = "") -> None:
    """A rank whose weights alone fill its GPU's budget is refused naming the group size, the
    one degree that shrinks them (tensor parallelism is fixed at 1 here)."""
    weights = opts.weight_bytes_per_gpu
    if weights >= opts.usable_bytes(hw):
        fail(
            source,
            "hardware.expert_parallel",
            f"{ep} ranks leave {weights / 1e9:.1f} GB of '{model.name}' weights on each GPU ({opts.dtype}), more "
            f"than {opts.budget_label(hw)} gives; raise hardware.expert_parallel or lower the dtype",
        )


def all_to_all(base, ep: int, cluster: ClusterSection, source: str = "") -> AllToAll:
    """The group's dispatch and combine, from the profile's interconnect and the cluster's network."""
    hw, h = base.hardware, base.model.hidden_size
    if base._ar_bw is None and min(ep, cluster.gpus_per_node) > 1:
        fail(
            source,
            "hardware.expert_parallel",
            f"hardware profile '{hw.name}' has no interconnect for the all-to-alls inside a node",
        )
    net = cluster.inter_node
    links = AllToAllLinks(
        ep,
        cluster.gpus_per_node,
        base._ar_bw or 1.0,
        base._ar_latency_s,
        net.bandwidth_gbps * 1e9,
        net.latency_us * 1e-6,
    )
    return AllToAll(
        links,
        base.model.moe.experts_per_token,
        dispatch_bytes_per_copy(h, base.weight_dtype, base.act_dtype),
        combine_bytes_per_copy(h, base.act_dtype),
    )


class DataParallelAttentionCostModel(PipelineCostModel):
    """One rank's iterations: its own attention and dense work (the base model at tensor
    parallel 1), and each sparse layer's routed experts on the group's tokens with the
    dispatch and combine around them."""

    name = "dp_attention"

    def __init__(self, base, placement: Placement, ep: int, source: str = ""):
        super().__init__(base, placement, source)
        self.ep = ep
        self.group_experts = RoutedExperts(base.model, base.hardware, base.weight_dtype, base.act_dtype, ep, ep)
        self.all_to_all = all_to_all(base, ep, placement.cluster, source)

    def routed_expert_time_s(self, tokens) -> np.ndarray:
        """One sparse layer's routed experts on the slowest GPU for a rank of `tokens` (its
        peers alike), with the dispatch before them and the combine after."""
        tokens = np.asarray(tokens, dtype=np.float64)
        return (
            self.all_to_all.dispatch_time_s(tokens)
            + self.group_experts.expert_time_s(self.ep * tokens)
            + self.all_to_all.combine_time_s(tokens)
        )
