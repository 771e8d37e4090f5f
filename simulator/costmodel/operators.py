"""Per-operator FLOPs and bytes of a decoder-only transformer iteration.

Each operator's FLOPs and bytes are affine in the batch totals (T tokens, P query-key pairs,
K keys read, L logit positions), so an operator is five coefficients for FLOPs and five for
bytes. Counting follows Medusa's Table 5 (after Chen, "Dissecting batching effects in GPT
inference"): a matmul of (m x k) by (k x n) is 2mkn FLOPs and reads both operands and writes
its output once; attention scores cover every query-key pair (c + q keys per query), as a
kernel computing the full masked tile does. With `fused_attention` (FlashAttention, vLLM's
paged attention) the score matrix never reaches memory; unfused, QK^T writes it, softmax
reads and writes it, and PV reads it.

Projections are fused as serving engines run them (vLLM, TensorRT-LLM and SGLang concatenate
the Q, K and V weights into one GEMM and the gate and up weights into another):
`fused_projections=False` prices them as separate GEMMs instead. Each operator names the
measured kernel kind (`kernel`) whose calibrated time model prices it when the hardware
profile has one (simulator/calibration)."""

from __future__ import annotations

import numpy as np

from ..models.dtypes import bytes_per_element, weight_bytes_per_element
from ..models.spec import ModelSpec
from .base_operator import (
    Operator,
    act_operator,
    embedding_operator,
    linear_operator,
    norm_operator,
    position_embedding_operator,
    residual_add_operator,
    rotary_operator,
)
from .mla import mla_attention_operators

# the model-scope operators that run before the first layer (the rest follow the last)
PRE_LAYER_OPS = ("embedding", "position_embedding")


def attention_operators(
    spec: ModelSpec,
    weight_dtype: str,
    kv_dtype: str,
    act_dtype: str,
    tp: int,
    fused_attention: bool = True,
    fused_projections: bool = True,
) -> list[Operator]:
    """A layer's operators up to the MLP: norm, projections, attention, residual add, and the
    MLP's norm unless the block shares one input norm between attention and MLP (phi). Either
    block makes two residual adds per layer (x + attn and + mlp; attn + mlp and + x), so a
    parallel block differs from a sequential one by the norm alone."""
    wb, kb, ab = weight_bytes_per_element(weight_dtype), bytes_per_element(kv_dtype), bytes_per_element(act_dtype)
    h = spec.hidden_size
    if spec.mla is not None:
        return mla_attention_operators(spec, wb, kb, ab, tp, fused_attention)
    n_local = spec.num_heads / tp
    kv_local = spec.kv_dim_per_gpu(tp)  # KV heads replicate when tp exceeds them
    q_local = spec.q_dim / tp
    d = spec.dim_head
    ops = [norm_operator("input_norm", h, wb, ab)]
    # each rank computes its own KV heads, replicated ones included: kv_local * tp columns in all
    if fused_projections:
        ops.append(linear_operator("qkv_proj", h, spec.q_dim + 2 * kv_local * tp, wb, ab, tp))
    else:
        ops += [
            linear_operator("q_proj", h, spec.q_dim, wb, ab, tp),
            linear_operator("k_proj", h, kv_local * tp, wb, ab, tp),
            linear_operator("v_proj", h, kv_local * tp, wb, ab, tp),
        ]
    if not spec.learned_positions:  # a learned position table is added once, before the first layer
        ops.append(rotary_operator(q_local, kv_local, ab, spec.rotary_fraction))
    # new K and V written into the paged cache
    ops.append(Operator("kv_write", "elementwise", "layer", (0, 0, 0, 0, 0), (0, 2.0 * kv_local * (ab + kb), 0, 0, 0)))
    score_bytes = 0.0 if fused_attention else n_local * ab
    # QK^T and PV are the same size: a head_dim matmul over every query-key pair that reads Q
    # (writes the output), the cached K (V) and, unfused, the score matrix
    pair_flops = (0, 0, 2.0 * n_local * d, 0, 0)
    pair_bytes = (0, q_local * ab, score_bytes, kv_local * kb, 0)
    ops += [
        Operator("qk", "attention", "layer", pair_flops, pair_bytes),
        Operator("softmax", "attention", "layer", (0, 0, 5.0 * n_local, 0, 0), (0, 0, 2.0 * score_bytes, 0, 0)),
        Operator("pv", "attention", "layer", pair_flops, pair_bytes),
        linear_operator("o_proj", spec.q_dim, h, wb, ab, tp, split_out=False),
        # sequential: x + attn; parallel: attn + mlp, which the MLP's add then adds to x
        residual_add_operator("attn_residual_add", h, ab),
    ]
    if spec.norms_per_layer == 2:  # a parallel block with a shared norm (phi) normalises once
        ops.append(norm_operator("post_attn_norm", h, wb, ab))
    return ops


def mlp_operators(
    h: int, i: int, gated: bool, weight_dtype: str, act_dtype: str, tp: int, fused_projections: bool = True
) -> list[Operator]:
    """A dense MLP of width i and its residual add."""
    wb, ab = weight_bytes_per_element(weight_dtype), bytes_per_element(act_dtype)
    if gated:
        if fused_projections:
            ops = [linear_operator("gate_up_proj", h, 2 * i, wb, ab, tp)]
        else:
            ops = [linear_operator("up_proj", h, i, wb, ab, tp), linear_operator("gate_proj", h, i, wb, ab, tp)]
        ops += [act_operator(i / tp, True, ab), linear_operator("down_proj", i, h, wb, ab, tp, split_out=False)]
    else:
        ops = [
            linear_operator("fc1", h, i, wb, ab, tp),
            act_operator(i / tp, False, ab),
            linear_operator("fc2", i, h, wb, ab, tp, split_out=False),
        ]
    return ops + [residual_add_operator("mlp_residual_add", h, ab)]


def model_operators(spec: ModelSpec, weight_dtype: str, act_dtype: str, tp: int) -> list[Operator]:
    """The embedding, the final norm and the LM head, whose weights a quantised model keeps in 16 bits."""
    wb, ab = spec.edge_bytes_per_element(weight_dtype), bytes_per_element(act_dtype)
    h, v = spec.hidden_size, spec.vocab_size
    ops = [embedding_operator(h, wb, ab)]
    if spec.learned_positions:
        ops.append(position_embedding_operator(h, wb, ab))
    ops.append(norm_operator("final_norm", h, wb, ab, scope="model"))
    return ops + [linear_operator("lm_head", h, v, wb, ab, tp, per="L")]


def allreduce_bytes_per_layer(spec: ModelSpec, act_dtype: str) -> float:
    """Bytes per token all-reduced per layer under TP: after o_proj and after the MLP."""
    return 2.0 * spec.hidden_size * bytes_per_element(act_dtype)


def coefficient_matrices(ops: list[Operator]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([op.flops for op in ops], dtype=np.float64), np.array([op.bytes for op in ops], dtype=np.float64))
