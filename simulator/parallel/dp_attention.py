"""Data-parallel attention with expert parallelism (`hardware.data_parallel_attention: true`,
`hardware.expert_parallel: N`), as SGLang's `--enable-dp-attention --ep-size N` and vLLM's
`--data-parallel-size N --enable-expert-parallel` serve DeepSeek-V3/R1 and Qwen3-MoE.

Each GPU is a replica for routing and KV: its own scheduler and KV pool, attention, dense
layers, shared experts, router and LM head whole (tensor parallel 1) on its own requests' tokens.
The routed experts of every sparse layer are spread over a group of N replicas, E/N whole
experts per GPU, and computed jointly: dispatch all-to-all, each GPU's experts on the copies
routed to them, combine all-to-all (parallel/alltoall.py).

Every sparse layer's all-to-alls synchronise the group, so its ranks step in lockstep
(parallel/dp_group.py runs them): each rank's scheduler picks its own batch, and the group's
iteration, the same for every rank, takes the slowest rank's attention and dense work, plus per
sparse layer the slowest GPU's experts on the copies of all ranks' tokens and a dispatch and a
combine as long as the largest rank's sends. A rank with nothing to run makes a dummy pass of one
token through its attention and dense layers (vLLM's `execute_dummy_batch`; SGLang's idle batch)
so that the collectives match; it sends no copies. `iteration_time_s` of one batch prices it as
one rank of a group whose ranks all run that batch (balanced load)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from ..costmodel.batch import BatchShape, BatchTotals
from ..costmodel.moe import RoutedExperts
from ..models.dtypes import lower_dtype_advice, weight_bytes_per_element
from .alltoall import AllToAll, AllToAllLinks, combine_bytes_per_copy, dispatch_bytes_per_copy
from .config import ClusterSection
from .cost import PipelineCostModel
from .dp_rules import fail
from .placement import Placement

# an idle rank's dummy pass: one new token, no cache (vLLM's _dummy_run(1))
DUMMY_PASS = BatchShape.of([1], [0]).totals()
TOTALS = [f.name for f in fields(BatchTotals)]


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
            f"than {opts.budget_label(hw)} gives; raise hardware.expert_parallel{lower_dtype_advice(opts.dtype)}",
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

    def group_iteration_time_s(self, shapes: list[BatchShape | None]) -> float:
        """One lockstep iteration of a group whose rank i runs `shapes[i]` (None: a dummy pass)."""
        totals = [DUMMY_PASS if s is None else s.totals() for s in shapes]
        return float(self._group_times([_as_row(t) for t in totals], _real_tokens(shapes, totals))[0])

    def group_decode_step_times_s(self, contexts: list, steps: int) -> np.ndarray:
        """group_iteration_time_s of `steps` consecutive decode steps, every rank decoding its
        sequences of `contexts[i]` tokens (None: a dummy pass each step); the same totals and
        arithmetic as step by step, so identical."""
        totals, real = [], []
        for ctx in contexts:
            if ctx is None:
                totals.append(_as_row(DUMMY_PASS, steps))
                real.append(np.zeros(steps))
            else:
                totals.append(self._decode_totals(ctx, steps))
                real.append(np.full(steps, float(len(ctx))))
        return self._group_times(totals, np.vstack(real))

    def _group_times(self, totals: list[BatchTotals], real_tokens: np.ndarray) -> np.ndarray:
        """Lockstep iteration times, shape (steps,), from each rank's totals (arrays of steps) and
        tokens sent to the experts, shape (ranks, steps): the slowest rank's own work, with the
        routed experts on the group's copies and all-to-alls of its largest rank's tokens."""
        largest, group = real_tokens.max(axis=0), real_tokens.sum(axis=0)
        routed = (
            self.all_to_all.dispatch_time_s(largest)
            + self.group_experts.expert_time_s(group)
            + self.all_to_all.combine_time_s(largest)
        )
        ranks = len(totals)
        flat = BatchTotals(*(np.concatenate([getattr(t, f) for t in totals]) for f in TOTALS))
        per_rank = self._latency(flat, np.tile(routed, ranks)).reshape(ranks, -1)
        return per_rank.max(axis=0)


def _as_row(t: BatchTotals, steps: int = 1) -> BatchTotals:
    """Totals as arrays of `steps` equal columns."""
    return BatchTotals(*(np.full(steps, float(getattr(t, f))) for f in TOTALS))


def _real_tokens(shapes, totals) -> np.ndarray:
    """Tokens each rank sends to the experts, shape (ranks, 1): none from a dummy pass."""
    return np.array([[0.0 if s is None else float(t.tokens)] for s, t in zip(shapes, totals)])
