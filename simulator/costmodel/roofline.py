"""Roofline cost model: each operator takes max(compute time, memory time) under the
profile's efficiency factors, plus a per-kernel overhead; an iteration adds up its operators,
the tensor-parallel all-reduces and a per-iteration overhead.

On a calibrated profile (`calibration:` fitted by `sim calibrate`, or inherited from a measured
card) the GEMMs and the elementwise kernels the tables measured take their fitted time models
instead (simulator/calibration/kernel_models.py: the memory/compute corner, tile quantisation,
launch floors), and a 16-bit GEMM of a width the profile's tables measured is scaled by their
measured/model ratio (simulator/costmodel/measured_gemms.py); operators no table measured
(attention, the KV write) keep the class roofline.
`NAME:datasheet` profiles have no calibration: the pure datasheet roofline."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..hardware.allreduce import build_all_reduce
from ..hardware.profile import HardwareProfile
from ..models.dtypes import compute_dtype_for, kv_dtype_for, normalize_dtype
from ..models.spec import ModelSpec
from ..validation import check_tensor_parallel
from .base import CostModel, Direction, OperatorCost
from .batch import BatchShape, BatchTotals
from .kernel_times import (
    elementwise_fit_time_s,
    gemm_dtype_for,
    gemm_params,
    gemm_time_s,
    weight_gemm_device,
)
from .measured_gemms import gemm_inner_size, ratio_on, shape_correction
from .moe import RoutedExperts, check_expert_parallel, moe_affine_operators
from .operators import (
    allreduce_bytes_per_layer,
    attention_operators,
    coefficient_matrices,
    mlp_operators,
    model_operators,
)

# distinct (tokens, logit positions) pairs whose fitted operator times a cost model keeps: a
# long run's prefill mixes stay far below it; past it the cache starts afresh
_CALIBRATED_CACHE_PAIRS = 200_000


def _quantised(op) -> bool:
    """A decoder layer's weight GEMM, which runs the quantised kernel (not the 16-bit LM head)."""
    return op.op_class == "linear" and op.scope == "layer"


def _gemm_fn(params, coef, per: int, device, curve):
    """Time of one GEMM operator as a function of (T, L): the fitted model, scaled by the
    measured shapes' ratio where the profile measured this N and K."""
    f, w, a, n = coef

    def time_s(T, L):
        m = T if per == 1 else L
        t = gemm_time_s(params, f, w, a, m, n, device)
        return t if curve is None else t * ratio_on(curve, np.asarray(m, dtype=np.float64))

    return time_s


def overhead_row(time_s: float) -> OperatorCost:
    """The serving engine's own time per iteration (profile `overheads`) as an operator row."""
    return OperatorCost("engine_overhead", "overhead", "iteration", 1, 0.0, 0.0, 0.0, 0.0, time_s)


class RooflineCostModel(CostModel):
    name = "roofline"
    from_workload = True

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareProfile,
        *,
        dtype: str = "fp16",
        kv_dtype: str | None = None,
        tensor_parallel: int = 1,
        fused_attention: bool = True,
        fused_projections: bool = True,
        expert_parallel: int = 1,
    ):
        self.model, self.hardware = model, hardware
        self.all_reduce = build_all_reduce(hardware.all_reduce, hardware)
        self.weight_dtype = normalize_dtype(dtype)
        self.kv_dtype = kv_dtype_for(self.weight_dtype, kv_dtype)
        self.act_dtype = compute_dtype_for(self.weight_dtype)
        self.gemm_dtype = gemm_dtype_for(self.weight_dtype, hardware)
        self.tp = int(tensor_parallel)
        check_tensor_parallel(model, self.tp)
        self.all_reduce.check(self.tp, across_nodes=False, field="all_reduce")
        self.ep = check_expert_parallel(model, self.tp, int(expert_parallel))
        self.fused_attention = fused_attention
        self.fused_projections = fused_projections
        self.layer_ops, self.layer_kinds = self._layer_operators()
        counts = {"every": model.num_layers, "dense": model.dense_layers, "sparse": model.moe_layers}
        self._layer_counts = [counts[kind] for kind in self.layer_kinds]
        self._moe_layers = model.moe_layers
        self.model_ops = model_operators(model, self.weight_dtype, self.act_dtype, self.tp)
        self.experts = (
            RoutedExperts(model, hardware, self.weight_dtype, self.act_dtype, self.tp, self.ep)
            if model.moe is not None
            else None
        )
        self._precompute()

    def _layer_operators(self) -> tuple[list, list[str]]:
        """Per-layer operators and the kind of layer that runs each: attention in `every` layer,
        the dense MLP in the `dense` layers, the sparse MLP's affine part in the `sparse` ones (the
        routed experts, not affine in the batch, are priced by `RoutedExperts`). A pipeline stage
        counts each kind among its own layers (simulator/parallel/cost.py)."""
        m, wd, ad, tp, fp = self.model, self.weight_dtype, self.act_dtype, self.tp, self.fused_projections
        attention = attention_operators(m, wd, self.kv_dtype, ad, tp, self.fused_attention, fp)
        groups = [(attention, "every")]
        if m.dense_layers:
            groups.append(
                (mlp_operators(m.hidden_size, m.intermediate_size, m.mlp == "gated", wd, ad, tp, fp), "dense")
            )
        if m.moe_layers:
            groups.append((moe_affine_operators(m, wd, ad, tp, fp), "sparse"))
        ops = [op for group, _ in groups for op in group]
        return ops, [kind for group, kind in groups for _ in group]

    # ---- precomputed rates ----------------------------------------------------------
    def _precompute(self) -> None:
        hw = self.hardware
        weights = weight_gemm_device(hw, self.weight_dtype)
        peak, gemm_peak = hw.peak_flops(self.act_dtype), weights.peak_flops
        bw = hw.memory_bandwidth_bytes_per_s()
        self.ops = self.layer_ops + self.model_ops
        self._count = np.array(self._layer_counts + [1] * len(self.model_ops), dtype=np.float64)
        self._flop_coef, self._byte_coef = coefficient_matrices(self.ops)
        self._flop_rate = np.array(
            [
                (gemm_peak if op.op_class == "linear" else peak) * hw.efficiency_for(op.op_class).compute
                for op in self.ops
            ]
        )
        # the decoder layers' GEMMs stream at the share of the bandwidth their quantised kernel
        # reaches; the LM head keeps 16-bit weights (cuBLAS) and streams at the full bandwidth
        self._byte_rate = np.array(
            [
                (weights.bandwidth_bytes_per_s if _quantised(op) else bw) * hw.efficiency_for(op.op_class).memory
                for op in self.ops
            ]
        )
        self._launch_s = hw.overheads.kernel_launch_us * 1e-6
        self._peak, self._bw = peak, bw
        self._calibrated = self._calibrated_rows(hw.calibration)
        self._calibrated_index = np.array([j for j, _ in self._calibrated], dtype=np.int64)
        self._calibrated_cache: dict[tuple[float, float], np.ndarray] = {}
        self.iteration_overhead_s = hw.overheads.iteration_s(self.tp)
        self._nccl = self.all_reduce.nccl  # send/recv and groups across nodes stay on NCCL
        self._ar_bw, self._ar_latency_s = self._nccl.bandwidth_bytes_per_s, self._nccl.latency_s
        self._ar_bytes_per_token = allreduce_bytes_per_layer(self.model, self.act_dtype)

    def _calibrated_rows(self, calibration) -> list[tuple[int, object]]:
        """(operator row, time function of (T, L)) for the operators a fitted model prices."""
        if calibration is None:
            return []

        device = weight_gemm_device(self.hardware, self.weight_dtype)
        head = replace(device, bandwidth_bytes_per_s=self.hardware.memory_bandwidth_bytes_per_s())
        shapes = shape_correction(calibration.gemm, device, self.gemm_dtype)
        rows = []
        for j, op in enumerate(self.ops):
            f, b = self._flop_coef[j], self._byte_coef[j]
            if op.kernel == "gemm" and calibration.gemm is not None:
                params, per = gemm_params(calibration.gemm), (1 if f[1] else 4)  # tokens, or logit positions
                k = gemm_inner_size(f[per], op.out_width)
                curve = shapes.curve(op.out_width, k) if shapes is not None else None
                dev = device if _quantised(op) else head
                rows.append((j, _gemm_fn(params, (f[per], b[0], b[per], op.out_width), per, dev, curve)))
            elif op.kernel in calibration.elementwise:
                e = calibration.elementwise[op.kernel]
                rows.append(
                    (
                        j,
                        lambda T, L, e=e, b0=b[0], b1=b[1]: elementwise_fit_time_s(e, b0 + b1 * T, T, self._bw),
                    )
                )
        return rows

    # ---- core: time from batch totals (scalars or arrays) ----------------------------
    def op_times(self, T, P, K, L):
        """Per-operator FLOPs, bytes, compute, memory and total time, shape (operators, n)
        for n settings of the totals. Elementwise only (no BLAS), so a setting's numbers do
        not depend on how many settings are evaluated together."""
        T, P, K, L = (np.asarray(x, dtype=np.float64).reshape(1, -1) for x in (T, P, K, L))
        F, B = self._flop_coef, self._byte_coef
        flops = F[:, 0:1] + F[:, 1:2] * T + F[:, 2:3] * P + F[:, 3:4] * K + F[:, 4:5] * L
        nbytes = B[:, 0:1] + B[:, 1:2] * T + B[:, 2:3] * P + B[:, 3:4] * K + B[:, 4:5] * L
        ct = flops / self._flop_rate[:, None]
        mt = nbytes / self._byte_rate[:, None]
        time = np.maximum(ct, mt) + self._launch_s
        if self._calibrated:
            time[self._calibrated_index] = self._calibrated_times(T[0], L[0])
        return flops, nbytes, ct, mt, time

    def _calibrated_times(self, T: np.ndarray, L: np.ndarray) -> np.ndarray:
        """The fitted operators' times, shape (fitted operators, n). They depend on the batch's
        tokens and logit positions only, which repeat across a run's iterations (a decode stretch
        keeps both for all its steps), so each distinct pair is evaluated once per cost model and
        kept. The fitted models are elementwise, so a cached column equals a fresh one bit for bit."""
        if T.size and T.min() == T.max() and L.min() == L.max():
            return np.repeat(self._calibrated_columns([(float(T[0]), float(L[0]))])[0][:, None], T.size, axis=1)
        pairs = list(zip(T.tolist(), L.tolist()))
        return np.stack(self._calibrated_columns(pairs), axis=1)

    def _calibrated_columns(self, pairs: list[tuple[float, float]]) -> list[np.ndarray]:
        cache = self._calibrated_cache
        missing = list(dict.fromkeys(p for p in pairs if p not in cache))
        if missing:
            if len(cache) + len(missing) > _CALIBRATED_CACHE_PAIRS:
                cache.clear()
            t, l = (np.array(v, dtype=np.float64) for v in zip(*missing))
            rows = np.stack([np.broadcast_to(fn(t, l), t.shape) for _, fn in self._calibrated])
            for i, p in enumerate(missing):
                cache[p] = rows[:, i].copy()
        return [cache[p] for p in pairs]

    def allreduce_time_s(self, tokens):
        """All-reduce of the layer's activations (tokens x hidden), twice per layer, on the
        kernel `all_reduce` chose (hardware/allreduce/)."""
        if self.tp == 1:
            return 0.0 * tokens
        return 2.0 * self.one_allreduce_time_s((self._ar_bytes_per_token / 2.0) * tokens, self.tp)

    def one_allreduce_time_s(self, nbytes, workers: int):
        """One all-reduce of `nbytes` over `workers` GPUs of one node, on the chosen kernel."""
        return self.all_reduce.time_s(nbytes, workers)

    def nccl_allreduce_time_s(self, nbytes, workers: int):
        """One NCCL all-reduce over `workers` GPUs of one node: the part inside each node of a
        group that spans nodes, where no engine runs its custom kernel."""
        return self._nccl.time_s(nbytes, workers)

    def send_recv_time_s(self, nbytes):
        """One pipeline-stage hand-off of `nbytes` between two GPUs: measured when the profile
        has collectives, else the interconnect's latency plus bytes at its bandwidth."""
        coll = self.hardware.collectives
        measured = coll.send_recv_time_s(nbytes) if coll is not None else None
        if measured is not None:
            return measured
        if self._ar_bw is None:
            raise ValueError(f"send/recv needs an interconnect in hardware profile '{self.hardware.name}'")
        return self._ar_latency_s + np.asarray(nbytes, dtype=np.float64) / self._ar_bw

    def _time_from_totals(self, t: BatchTotals) -> np.ndarray:
        time = self.op_times(t.tokens, t.score_pairs, t.keys, t.logits)[4] * self._count[:, None]
        total = np.full(time.shape[1], self.iteration_overhead_s)
        for row in time:  # a fixed, sequential order of additions: identical for any n
            total = total + row
        tokens = np.asarray(t.tokens, dtype=np.float64)
        total = total + self.model.num_layers * self.allreduce_time_s(tokens)
        if self.experts is not None:
            total = total + self._moe_layers * self.experts.expert_time_s(tokens)
        return total

    # ---- interface --------------------------------------------------------------------
    def iteration_time_s(self, batch: BatchShape) -> float:
        return float(self._time_from_totals(batch.totals())[0])

    def decode_step_times_s(self, context_tokens, steps: int) -> np.ndarray:
        """Step j (0-based) sees contexts c_i + j; in totals that is T = L = b and
        P = K = sum(c_i + 1) + b*j, evaluated for all j at once with the same arithmetic as
        iteration_time_s, so the results are identical to stepping one by one."""
        ctx = np.asarray(context_tokens, dtype=np.int64)
        b = ctx.size
        keys = (ctx.sum() + b) + b * np.arange(steps, dtype=np.int64)
        keys_f = keys.astype(np.float64)
        bf = np.full(steps, float(b))
        return self._time_from_totals(BatchTotals(bf, keys_f, keys_f, bf))

    def transfer_time_s(self, nbytes: float, direction: Direction) -> float:
        link = self.hardware.host_link
        gbps = link.h2d_gbps if direction == "h2d" else link.d2h_gbps
        if nbytes <= 0:
            return 0.0
        return link.latency_us * 1e-6 + float(nbytes) / (gbps * 1e9)

    def kv_transfer_time_s(self, nbytes: float, direction: Direction, copies: int = 1) -> float:
        """Back-to-back async copies pipeline: the DMA engine moves one copy while the host
        issues the next, so the stream runs at the slower of the link's bandwidth and the
        host's cost per copy (copy_issue_us), after one link latency."""
        link = self.hardware.host_link
        gbps = link.h2d_gbps if direction == "h2d" else link.d2h_gbps
        if nbytes <= 0:
            return 0.0
        return link.latency_us * 1e-6 + max(float(nbytes) / (gbps * 1e9), int(copies) * link.copy_issue_us * 1e-6)

    def breakdown(self, batch: BatchShape) -> list[OperatorCost]:
        t = batch.totals()
        flops, nbytes, ct, mt, time = (a[:, 0] for a in self.op_times(t.tokens, t.score_pairs, t.keys, t.logits))
        rows = []
        for j, op in enumerate(self.ops):
            rows.append(
                OperatorCost(
                    op.name,
                    op.op_class,
                    op.scope,
                    int(self._count[j]),
                    float(flops[j]),
                    float(nbytes[j]),
                    float(ct[j]),
                    float(mt[j]),
                    float(time[j]),
                )
            )
        if self.tp > 1:
            ar = float(self.allreduce_time_s(t.tokens))
            rows.append(
                OperatorCost(
                    "allreduce",
                    "communication",
                    "layer",
                    self.model.num_layers,
                    0.0,
                    float(self._ar_bytes_per_token * t.tokens),
                    0.0,
                    ar,
                    ar,
                )
            )
        return rows + self._expert_rows(t.tokens) + self._overhead_rows()

    def _overhead_rows(self) -> list[OperatorCost]:
        """The engine's overhead per iteration, a row of its own where the profile carries one,
        so that the rows add up to iteration_time_s."""
        return [overhead_row(self.iteration_overhead_s)] if self.iteration_overhead_s else []

    def _expert_rows(self, tokens) -> list[OperatorCost]:
        if self.experts is None:
            return []
        return [self.experts.operator_cost(float(np.atleast_1d(tokens)[0]), self.model.moe_layers)]
