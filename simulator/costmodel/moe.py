"""Pricing of mixture-of-experts layers: the router, the shared experts and the routed experts
of one sparse layer.

FLOPs follow the tokens: each token runs its top-k experts, so a batch of T tokens does the
work of T k expert passes whatever the expert count. Weight bytes follow the experts: a batch
reads every expert at least one of its tokens picked, E (1 - (1 - k/E)^T) of them under
uniform routing (simulator/models/moe.py), so a decode step's weight traffic grows from k
experts at T = 1 to all E as the batch grows, which is why MoE decode slows with batch size far
more than a dense model of the same active size does.

The routed experts of a layer run as one grouped GEMM per projection (vLLM's fused_moe): on a
calibrated profile each touched expert is priced as a GEMM of its share of the tokens with the
fitted GEMM model, one launch for the group; on a datasheet profile the group is one roofline
operator. With expert parallelism (`hardware.expert_parallel` = EP, over the tensor-parallel
group as vLLM's --enable-expert-parallel places them) each GPU holds E/EP whole experts and the
slowest GPU sets the time (with a measured popularity vector, the GPU holding the most popular
experts).

Expert parallelism moves no tokens. Attention stays tensor-parallel, so after its all-reduce
every GPU of the group holds the hidden states of all T tokens of the batch; vLLM's FusedMoE
runs its dispatch/combine kernels only with data-parallel attention (`use_all2all_kernels` is
`dp_size > 1 and use_ep` in vllm/model_executor/layers/fused_moe/config.py). Each GPU routes all
T tokens itself (the router is replicated), runs its own experts on the T k / EP token copies
routed to them, and the GPUs' partial outputs are summed by the all-reduce of T x hidden a
tensor-parallel MLP ends with (`tensor_model_parallel_all_reduce` in fused_moe/layer.py), which
the cost model prices with every layer's pair of all-reduces."""

from __future__ import annotations

import numpy as np

from ..errors import InfersimError
from ..hardware.profile import HardwareProfile
from ..models.dtypes import bytes_per_element, weight_bytes_per_element
from ..models.moe import expected_distinct_experts
from ..models.spec import ModelSpec
from ..validation import positive_int, source_field
from .base import OperatorCost
from .base_operator import Operator, act_operator, linear_operator
from .kernel_times import elementwise_fit_time_s, gemm_params, gemm_time_s, weight_gemm_device
from .operators import mlp_operators


def check_expert_parallel(
    model: ModelSpec,
    tp: int,
    ep: int,
    field: str = "hardware.expert_parallel",
    source: str = "",
    tp_field: str = "",
) -> int:
    """EP spreads whole experts over the tensor-parallel group: 1, or equal to TP with the
    experts dividing evenly. `tp_field` names where the degree comes from when it is not
    hardware.tensor_parallel (a disaggregated pool's)."""
    positive_int(ep, field, source)
    field = source_field(source, field) if source else field
    if ep == 1:
        return ep
    if model.moe is None:
        raise InfersimError(f"{field}: {ep} needs a mixture-of-experts model; '{model.name}' has no experts")
    if ep != tp:
        raise InfersimError(
            f"{field}: {ep} must equal the tensor-parallel degree ({tp_field + ' ' if tp_field else ''}{tp}): "
            f"experts are spread over the "
            f"tensor-parallel group, as vLLM's --enable-expert-parallel does"
        )
    if model.moe.num_experts % ep:
        raise InfersimError(f"{field}: {ep} does not divide the {model.moe.num_experts} experts of '{model.name}'")
    return ep


def moe_affine_operators(
    spec: ModelSpec, weight_dtype: str, act_dtype: str, tp: int, fused_projections: bool = True
) -> list[Operator]:
    """A sparse layer's operators whose cost is affine in the batch: the router (replicated on
    every rank, as vLLM keeps it), the top-k selection, the shared experts (tensor-split like a
    dense MLP), the weighted sum of the k expert outputs and the residual add."""
    moe, h = spec.moe, spec.hidden_size
    wb, ab = weight_bytes_per_element(weight_dtype), bytes_per_element(act_dtype)
    ops = [
        linear_operator("router", h, moe.num_experts, wb, ab, 1),
        Operator(
            "router_topk",
            "elementwise",
            "layer",
            (0, 5.0 * moe.num_experts, 0, 0, 0),
            (0, 2.0 * moe.num_experts * ab, 0, 0, 0),
        ),
    ]
    if moe.shared_intermediate_size:
        shared = mlp_operators(
            h, moe.shared_intermediate_size, spec.mlp == "gated", weight_dtype, act_dtype, tp, fused_projections
        )[:-1]
        ops += [Operator(**{**op.__dict__, "name": f"shared_{op.name}"}) for op in shared]
        if moe.shared_expert_gate:
            ops.append(linear_operator("shared_expert_gate", h, 1, wb, ab, 1))
    k = moe.experts_per_token
    ops.append(Operator("expert_combine", "elementwise", "layer", (0, k * h, 0, 0, 0), (0, (k + 1) * h * ab, 0, 0, 0)))
    return ops + [mlp_operators(h, 1, False, weight_dtype, act_dtype, 1)[-1]]


class RoutedExperts:
    """Time of one sparse layer's routed experts on its slowest GPU, for arrays of batch token
    counts (the GPU sees all of them: attention is tensor-parallel)."""

    def __init__(
        self,
        spec: ModelSpec,
        hardware: HardwareProfile,
        weight_dtype: str,
        act_dtype: str,
        tp: int,
        ep: int,
    ):
        moe, h = spec.moe, spec.hidden_size
        self.ep = ep
        width = moe.expert_intermediate_size / (
            tp // ep
        )  # each expert tensor-split over the ranks not spreading experts
        wb, ab = weight_bytes_per_element(weight_dtype), bytes_per_element(act_dtype)
        gated = spec.mlp == "gated"
        n_up = 2 if gated else 1
        # per GPU: pick probabilities of its experts, one row per GPU (one row when all are alike)
        pick = moe.pick_probabilities()
        groups = pick.reshape(ep, -1)
        self._groups = groups[:1] if moe.expert_popularity is None else groups
        self._load = self._groups.sum(axis=1)  # routed tokens per batch token, per GPU
        # (flops per routed token, weight bytes per expert, activation bytes per routed token, output width)
        self._gemms = (
            (2.0 * h * n_up * width, h * n_up * width * wb, (h + n_up * width) * ab, n_up * width),
            (2.0 * width * h, width * h * wb, (width + h) * ab, h),
        )
        self._act = act_operator(width, gated, ab)
        self._hw = hardware
        eff_lin, eff_el = hardware.efficiency_for("linear"), hardware.efficiency_for("elementwise")
        self._device = weight_gemm_device(hardware, weight_dtype, experts=True)
        self._flop_rate = self._device.peak_flops * eff_lin.compute
        self._byte_rate = self._device.bandwidth_bytes_per_s * eff_lin.memory
        self._el_rate = hardware.memory_bandwidth_bytes_per_s() * eff_el.memory
        self._launch_s = hardware.overheads.kernel_launch_us * 1e-6
        cal = hardware.calibration
        self._gemm = gemm_params(cal.gemm) if cal is not None and cal.gemm is not None else None
        self._act_fit = cal.elementwise.get(self._act.kernel) if cal is not None else None
        self._cache: dict[float, float] = {}

    def _gpu_time_s(self, routed: np.ndarray, touched: np.ndarray) -> np.ndarray:
        """One GPU's grouped GEMMs and activation for `routed` token-expert pairs over `touched` experts."""
        total = np.zeros_like(routed)
        for flops, w_expert, a_tok, n_out in self._gemms:
            if self._gemm is None:
                compute = flops * routed / self._flop_rate
                memory = (w_expert * touched + a_tok * routed) / self._byte_rate
                total = total + np.maximum(compute, memory) + self._launch_s
            else:
                per_expert = routed / np.maximum(touched, 1e-12)
                # one grouped launch: the touched experts' output tiles fill the SMs together
                group = np.maximum(touched, 1.0)
                one = gemm_time_s(self._gemm, flops, w_expert, a_tok, per_expert, n_out, self._device, group)
                launch = self._gemm.launch_us * 1e-6
                total = total + touched * (one - launch) + launch
        act_bytes = self._act.bytes[1] * routed
        if self._act_fit is None:
            total = total + act_bytes / self._el_rate + self._launch_s
        else:
            total = total + elementwise_fit_time_s(
                self._act_fit, act_bytes, routed, self._hw.memory_bandwidth_bytes_per_s()
            )
        return total

    def expert_time_s(self, tokens) -> np.ndarray:
        """Elementwise over `tokens`; each distinct count is computed once and remembered (an
        engine asks for the same few batch sizes over and over)."""
        tokens = np.asarray(tokens, dtype=np.float64)
        flat = tokens.reshape(-1)
        if flat.size == 1 and float(flat[0]) in self._cache:
            return np.full(tokens.shape, self._cache[float(flat[0])])
        unique, inverse = np.unique(flat, return_inverse=True)
        missing = np.array([u for u in unique if float(u) not in self._cache], dtype=np.float64)
        if missing.size:
            self._cache.update(zip(missing.tolist(), self._expert_time_s(missing).tolist()))
        return np.array([self._cache[float(u)] for u in unique])[inverse].reshape(tokens.shape)

    def _expert_time_s(self, tokens: np.ndarray) -> np.ndarray:
        slowest = np.zeros_like(tokens)
        for row, load in zip(self._groups, self._load):
            time = self._gpu_time_s(tokens * load, expected_distinct_experts(row, tokens))
            slowest = np.maximum(slowest, time)
        return slowest

    def work(self, tokens: float) -> tuple[float, float]:
        """FLOPs and bytes of one sparse layer's routed experts on the GPU with the most routed
        tokens (the layer's slowest under uniform routing)."""
        g = int(np.argmax(self._load))
        routed = tokens * float(self._load[g])
        touched = float(expected_distinct_experts(self._groups[g], tokens))
        flops = sum(f * routed for f, _, _, _ in self._gemms)
        nbytes = sum(w * touched + a * routed for _, w, a, _ in self._gemms) + self._act.bytes[1] * routed
        return flops, nbytes

    def operator_cost(self, tokens: float, count: int) -> OperatorCost:
        """The `routed_experts` row of a roofline table: one sparse layer's experts for a batch of
        `tokens` on the slowest GPU (work() on the most loaded one), `count` such layers."""
        flops, nbytes = self.work(float(tokens))
        time_s = float(self.expert_time_s(np.array([float(tokens)]))[0])
        compute_s, memory_s = flops / self._flop_rate, nbytes / self._byte_rate
        return OperatorCost("routed_experts", "linear", "layer", int(count), flops, nbytes, compute_s, memory_s, time_s)

    def distinct_experts(self, tokens) -> np.ndarray:
        """Experts of the whole layer a batch touches (all GPUs together)."""
        return sum(expected_distinct_experts(row, tokens) for row in self._groups) * (self.ep / len(self._groups))
