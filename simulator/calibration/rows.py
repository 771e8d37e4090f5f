"""One measured kernel time, reduced to what the fit needs: the operator's FLOPs and bytes as
the cost model counts them (simulator/costmodel/operators.py, so a fitted value means the same
thing where the cost model applies it) and the measured median.

Measured tables name per-layer operators of a transformer block (vLLM/Sarathi-style layers, as
microsoft/vidur's profiler times them); `operator_for` turns such a name plus the model's
dimensions and tensor-parallel degree into the cost model's operator."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..costmodel.base_operator import (
    Operator,
    act_operator,
    embedding_operator,
    linear_operator,
    norm_operator,
    residual_add_operator,
    rotary_operator,
)
from ..errors import InfersimError

FP16_BYTES = 2.0

# measured operator name -> calibrated kernel kind
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS = {
    "input_layernorm": "norm",
    "post_attention_layernorm": "norm",
    "mlp_act": "act",
    "attn_rope": "rope",
    "add": "add",
    "emb": "emb",
}
MEASURED_OPS = GEMM_OPS + tuple(ELEMENTWISE_OPS)


@dataclass(frozen=True)
class LayerDims:
    """A transformer block's shape as the measured tables give it."""

    heads: int
    kv_heads: int
    hidden: int
    intermediate: int  # one branch of the MLP (a gated MLP has two of this width)
    gated: bool = True

    def check_tp(self, tp: int) -> str | None:
        """The column that makes `tp` impossible, or None."""
        if tp < 1:
            return "tp"
        if self.heads % tp or self.intermediate % tp:
            return "tp"
        if self.hidden % self.heads:
            return "n_embd"
        return None


@dataclass(frozen=True)
class KernelRow:
    """One measured median, priced by the operator it measured."""

    device: str
    label: str  # the model (or table label) the row belongs to: the unit of leave-one-out
    tp: int
    tokens: int
    op: str  # measured operator name (attn_pre_proj, mlp_act, ... or gemm)
    kernel: str  # gemm, norm, act, rope, add, emb
    flops_per_token: float
    bytes_const: float
    bytes_per_token: float
    time_s: float
    where: str  # "file, row N, column C" of its time, for messages
    out_width: float = 0.0  # a GEMM's output columns per GPU (N)
    kernels: int = 1  # launches of the operator the measured time spans (each moves `bytes`)

    @property
    def bytes(self) -> float:
        return self.bytes_const + self.bytes_per_token * self.tokens


def operator_for(op: str, dims: LayerDims, tp: int) -> Operator:
    """The cost model's operator for a measured per-layer operator (fp16 weights and activations)."""
    b = FP16_BYTES
    head_dim = dims.hidden // dims.heads
    q_dim, kv_dim = dims.heads * head_dim, dims.kv_heads * head_dim
    width = (2 if dims.gated else 1) * dims.intermediate
    if op == "attn_pre_proj":
        return linear_operator(op, dims.hidden, q_dim + 2 * kv_dim, b, b, tp)
    if op == "attn_post_proj":
        return linear_operator(op, q_dim, dims.hidden, b, b, tp, split_out=False)
    if op == "mlp_up_proj":
        return linear_operator(op, dims.hidden, width, b, b, tp)
    if op == "mlp_down_proj":
        return linear_operator(op, dims.intermediate, dims.hidden, b, b, tp, split_out=False)
    if op in ("input_layernorm", "post_attention_layernorm"):
        return norm_operator(op, dims.hidden, b, b)
    if op == "mlp_act":
        return act_operator(dims.intermediate / tp, dims.gated, b)
    if op == "attn_rope":
        # Over the full head for every model, phi-2's 0.4 too: microsoft/vidur's profiled attention
        # (vidur/profiling/mlp/mlp_impl.py, CausalSelfAttention) builds its rotary embedding with
        # rotary_dim = head_dim, so the measured rows rotated whole heads.
        return rotary_operator(q_dim / tp, kv_dim / tp, b)
    if op == "add":
        return residual_add_operator(op, dims.hidden, b)
    if op == "emb":
        return embedding_operator(dims.hidden, b, b)
    raise KeyError(op)


def gemm_operator(m_in: int, n_out: int, bytes_per_element: float = FP16_BYTES) -> Operator:
    """A bare GEMM (tokens x k) @ (k x n), as generic tables give it."""
    return linear_operator("gemm", m_in, n_out, bytes_per_element, bytes_per_element, 1)


@dataclass(frozen=True)
class RowOrigin:
    """Where a measured time comes from: the same for every operator timed on one table line."""

    device: str  # the GPU the table measured
    label: str  # the model (or table label): the unit of leave-one-out
    where: str  # "file, row N, column C" of the time, for messages


def row_from_operator(
    operator: Operator, origin: RowOrigin, *, tp: int, tokens: int, op: str, time_s: float, kernels: int = 1
) -> KernelRow:
    f, b = operator.flops, operator.bytes
    return KernelRow(
        origin.device,
        origin.label,
        int(tp),
        int(tokens),
        op,
        operator.kernel,
        float(f[1]),
        float(b[0]),
        float(b[1]),
        float(time_s),
        origin.where,
        float(operator.out_width),
        int(kernels),
    )


def parse_number(value, where: str, column: str, *, integer: bool = False, positive: bool = True) -> float:
    """A table cell as a number, or a one-line error naming file, row and column."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InfersimError(f"{where}, column '{column}': not a number ({value!r})") from None
    if not np.isfinite(x) or (positive and x <= 0) or (integer and x != int(x)):
        kind = "a positive integer" if integer else "a positive number"
        raise InfersimError(f"{where}, column '{column}': expected {kind}, got {value!r}")
    return int(x) if integer else x
