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
one rank of a group whose ranks all run that batch (balanced load).

Two-batch overlap (`hardware.two_batch_overlap: true`; SGLang's `--enable-two-batch-overlap`,
vLLM's `--enable-dbo`, the dual micro-batch overlap of DeepSeek's inference system) splits every
rank's batch into two micro-batches and runs them alternately through the layers, so that one
micro-batch's dispatch and combine travel while the other computes. As SGLang splits a decode
batch (`compute_split_seq_index`: the first `tokens // 2` sequences), micro-batch a takes
floor(T/2) of a rank's T tokens and b the rest; the score pairs, keys and logits follow the tokens
in proportion. Each half's attention, dense work, router, shared experts and the group's experts
on the half's copies are priced by the cost model at the half's own token count, so the weights
are read once per half. The compute stream and the all-to-alls are two resources, and the pipeline
runs through the layers without a break (SGLang's operations span the layer boundaries), so with
C_h a rank's sparse layer of half h (its own work and its GPU's experts on the group's half-h
copies), D_h and K_h the dispatch and combine of the largest rank's half h:

    step = first + last + dense layers x (dense_a + dense_b)
         + sparse layers x max(C_a + C_b, D_a + K_a + D_b + K_b) + D_a + K_b

first (overhead, embedding) and last (final norm, LM head) run on the whole batch; the dispatch of
micro-batch a into the first sparse layer and the combine of b out of the last one overlap nothing.
The group's step is the slowest rank's. A rank of one token cannot be split (SGLang gives no split
index), and the group overlaps only when all its ranks can (they overlap together: sglang#6328);
otherwise, or when every rank's batch is a single token, the step runs as without the option. A
rank in a dummy pass splits into an empty half and its one token.

With `true` the group splits every step it can, as SGLang does: `can_run_tbo` in its
`two_batch_overlap.py` (TboDPAttentionPreparer.compute_output) asks only that every rank has a
split index and the ranks' forward modes agree, and `compute_split_seq_index` carries the note
"TODO: may smartly disable TBO when batch size is too small b/c it will slow down". Its
`--tbo-token-distribution-threshold` (0.48) chooses how a prefill batch is split (at sequence
boundaries, or one prompt cut in two when those leave a side under 48% of the tokens), not
whether. `auto` is the simulator's choice, no engine's: each group step is priced both ways and
runs the shorter, so the overlap switches itself off where it loses (small decode batches)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from ..costmodel.base import OperatorCost
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
AUTO = "auto"  # hardware.two_batch_overlap: overlap a step only where it prices faster
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

    def __init__(self, base, placement: Placement, ep: int, source: str = "", two_batch_overlap: bool | str = False):
        super().__init__(base, placement, source)
        self.ep, self.two_batch_overlap = ep, two_batch_overlap
        self.dense_layers = sum(self.placement.layers) - sum(self._sparse)
        self.sparse_layers = sum(self._sparse)
        self.group_experts = RoutedExperts(base.model, base.hardware, base.weight_dtype, base.act_dtype, ep, ep)
        self.all_to_all = all_to_all(base, ep, placement.cluster, source)

    def routed_expert_time_s(self, tokens) -> np.ndarray:
        """One sparse layer's routed experts on the slowest GPU for a rank of `tokens` (its
        peers alike), with the dispatch before them and the combine after."""
        tokens = np.asarray(tokens, dtype=np.float64)
        return self._routed_s(tokens, self.ep * tokens)

    def _routed_s(self, largest: np.ndarray, group: np.ndarray) -> np.ndarray:
        """A sparse layer's dispatch and combine of the largest rank's `largest` tokens around the
        slowest GPU's experts on the copies of the group's `group` tokens."""
        return (
            self.all_to_all.dispatch_time_s(largest)
            + self.group_experts.expert_time_s(group)
            + self.all_to_all.combine_time_s(largest)
        )

    def routed_rows(self, tokens: float, extra: dict[str, OperatorCost]) -> list[OperatorCost]:
        """A sparse layer's routed part for a rank of `tokens` whose peers run alike: the dispatch
        of its copies, the slowest GPU's experts on the copies of the group's ep x tokens, the
        combine (routed_expert_time_s, row by row)."""
        a2a = self.all_to_all
        rows = []
        for name, per_copy, time_s in (
            ("dispatch", a2a.dispatch_bytes_per_copy, a2a.dispatch_time_s(tokens)),
            ("combine", a2a.combine_bytes_per_copy, a2a.combine_time_s(tokens)),
        ):
            t = float(time_s)
            nbytes = a2a.bytes_sent(tokens, per_copy)
            rows.append(OperatorCost(name, "communication", "layer", 1, 0.0, nbytes, 0.0, t, t, a2a.link))
        return [rows[0], self.group_experts.operator_cost(self.ep * tokens, 1), rows[1]]

    def overlap_parts(self, batch: BatchShape) -> "OverlapParts":
        """The parts of a two-batch-overlap step of one rank whose peers run `batch` alike."""
        t = batch.totals()
        return self._overlap_parts(_as_row(t), np.array([[float(t.tokens)]]), self.ep)

    def overlapped_step_s(self, batch: BatchShape) -> float:
        """The overlapped step of overlap_parts (the formula, whether or not the group splits it)."""
        return float(self.overlap_parts(batch).step_s(self.dense_layers, self.sparse_layers)[0])

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

    def iteration_time_s(self, batch: BatchShape) -> float:
        """One rank's step with its peers running the same batch (balanced load)."""
        t = batch.totals()
        return float(self._group_times([_as_row(t)], np.array([[float(t.tokens)]]), alike=self.ep)[0])

    def decode_step_times_s(self, context_tokens, steps: int) -> np.ndarray:
        t = self._decode_totals(context_tokens, steps)
        return self._group_times([t], t.tokens.reshape(1, -1), alike=self.ep)

    def _group_times(self, totals: list[BatchTotals], real_tokens: np.ndarray, alike: int = 1) -> np.ndarray:
        """Lockstep iteration times, shape (steps,), from each rank's totals (arrays of steps) and
        tokens sent to the experts, shape (ranks, steps), each rank standing for `alike` ranks
        that run its batch: the slowest rank's own work, with the routed experts on the group's
        copies and all-to-alls of its largest rank's tokens; overlapped in two micro-batches
        where the option asks and every rank can split."""
        largest = real_tokens.max(axis=0)
        routed = self._routed_s(largest, real_tokens.sum(axis=0) * alike)
        ranks = len(totals)
        flat = _concat(totals)
        plain = self._latency(flat, np.tile(routed, ranks)).reshape(ranks, -1).max(axis=0)
        if not self.two_batch_overlap:
            return plain
        splits = ((real_tokens == 0) | (real_tokens >= 2)).all(axis=0) & (largest >= 2)
        if not splits.any():
            return plain
        overlapped = self._overlapped_times(flat, real_tokens, alike)
        if self.two_batch_overlap == AUTO:  # the group splits only a step the split makes shorter
            overlapped = np.minimum(overlapped, plain)
        return np.where(splits, overlapped, plain)

    def _overlapped_times(self, flat: BatchTotals, real_tokens: np.ndarray, alike: int) -> np.ndarray:
        """Two-batch-overlap iteration times (the module docstring's formula), shape (steps,)."""
        parts = self._overlap_parts(flat, real_tokens, alike)
        return parts.step_s(self.dense_layers, self.sparse_layers).reshape(real_tokens.shape[0], -1).max(axis=0)

    def _overlap_parts(self, flat: BatchTotals, real_tokens: np.ndarray, alike: int) -> "OverlapParts":
        """Each rank's parts of an overlapped step, arrays of ranks x steps (flat's order)."""
        ranks = real_tokens.shape[0]
        first, last, _ = self.model_parts_s(flat, np.zeros(flat.tokens.size))
        dense, sparse = np.zeros(flat.tokens.size), np.zeros(flat.tokens.size)
        comm, exposed = 0.0, 0.0
        for half, share in enumerate(_halves(flat.tokens)):
            t = BatchTotals(*(getattr(flat, f) * share for f in TOTALS))
            real = np.floor(real_tokens / 2) if half == 0 else real_tokens - np.floor(real_tokens / 2)
            largest = real.max(axis=0)
            dispatch, combine = self.all_to_all.dispatch_time_s(largest), self.all_to_all.combine_time_s(largest)
            experts = np.tile(self.group_experts.expert_time_s(real.sum(axis=0) * alike), ranks)
            with np.errstate(divide="ignore", invalid="ignore"):  # an empty half's kernels: masked below
                layer = self.model_parts_s(t, np.zeros(t.tokens.size))[2]
            runs = t.tokens > 0  # an empty half computes nothing of its own
            dense = dense + np.where(runs, layer["every"] + layer["dense"], 0.0)
            sparse = sparse + np.where(runs, layer["every"] + layer["sparse"], 0.0) + experts
            comm = comm + dispatch + combine
            exposed = exposed + (dispatch if half == 0 else combine)
        return OverlapParts(first, last, dense, sparse, np.tile(comm, ranks), np.tile(exposed, ranks))


@dataclass(frozen=True)
class OverlapParts:
    """A rank's two-batch-overlap step in parts, arrays of n: what runs on the whole batch
    before the layers (`first`: overhead, embedding) and after them (`last`: final norm, LM
    head), one dense layer of both micro-batches, one sparse layer's compute of both (`compute`:
    C_a + C_b, the experts on the group's copies included) and its all-to-alls (`comm`:
    D_a + K_a + D_b + K_b), and the dispatch of micro-batch a into the first sparse layer and
    the combine of b out of the last, which overlap nothing (`exposed`)."""

    first: np.ndarray
    last: np.ndarray
    dense: np.ndarray
    compute: np.ndarray
    comm: np.ndarray
    exposed: np.ndarray

    def step_s(self, dense_layers: int, sparse_layers: int) -> np.ndarray:
        """The module docstring's formula: a sparse layer takes the longer of its compute and its
        all-to-alls, the shorter hidden under it."""
        return (
            self.first
            + self.last
            + dense_layers * self.dense
            + sparse_layers * np.maximum(self.compute, self.comm)
            + self.exposed
        )


def _halves(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each micro-batch's share of a rank's totals: floor(T/2) of its T tokens, then the rest
    (SGLang's decode split)."""
    tokens = np.asarray(tokens, dtype=np.float64)
    a = np.floor(tokens / 2) / np.maximum(tokens, 1.0)
    return a, 1.0 - a


def _concat(totals: list[BatchTotals]) -> BatchTotals:
    return BatchTotals(*(np.concatenate([np.asarray(getattr(t, f), dtype=np.float64) for t in totals]) for f in TOTALS))


def _as_row(t: BatchTotals, steps: int = 1) -> BatchTotals:
    """Totals as arrays of `steps` equal columns."""
    return BatchTotals(*(np.full(steps, float(getattr(t, f))) for f in TOTALS))


def _real_tokens(shapes, totals) -> np.ndarray:
    """Tokens each rank sends to the experts, shape (ranks, 1): none from a dummy pass."""
    return np.array([[0.0 if s is None else float(t.tokens)] for s, t in zip(shapes, totals)])
