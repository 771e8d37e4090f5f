"""Operators of multi-head latent attention (DeepSeek-V2/V3), priced as vLLM and SGLang run it.

The cache holds one latent per token (kv_lora_rank values and a rotary key); the up-projection
of keys and values (kv_b_proj) is absorbed into the query and the output, so each new token pays
its FLOPs and weight reads once and attention reads only the latent of every cached token. The
attention FLOPs per query-key pair are those of the per-head form, (qk_nope + qk_rope) and
v_head_dim per head: exact for prefill, which runs that form; decode runs the absorbed form,
which does about 3.4x more FLOPs per pair (kv_lora_rank-wide dot products) yet stays memory
bound on every card in the catalog, so its time is set by the latent bytes, which are exact."""

from __future__ import annotations

from ..models.spec import ModelSpec
from .base_operator import Operator, linear_operator, norm_operator, residual_add_operator, rotary_operator


def mla_attention_operators(
    spec: ModelSpec, wb: float, kb: float, ab: float, tp: int, fused_attention: bool = True
) -> list[Operator]:
    mla, h, n = spec.mla, spec.hidden_size, spec.num_heads
    n_local = n / tp
    q_width = n * mla.qk_head_dim
    ops = [norm_operator("input_norm", h, wb, ab)]
    if mla.q_lora_rank:
        ops += [
            linear_operator("q_a_proj", h, mla.q_lora_rank, wb, ab, 1),  # replicated on every rank
            norm_operator("q_a_norm", mla.q_lora_rank, wb, ab),
            linear_operator("q_b_proj", mla.q_lora_rank, q_width, wb, ab, tp),
        ]
    else:
        ops.append(linear_operator("q_proj", h, q_width, wb, ab, tp))
    score_bytes = 0.0 if fused_attention else n_local * ab
    latent = mla.latent_width
    ops += [
        linear_operator("kv_a_proj", h, latent, wb, ab, 1),  # replicated: every rank caches the whole latent
        norm_operator("kv_a_norm", mla.kv_lora_rank, wb, ab),
        linear_operator("kv_b_proj", mla.kv_lora_rank, n * (mla.qk_nope_head_dim + mla.v_head_dim), wb, ab, tp),
        rotary_operator(n_local * mla.qk_rope_head_dim, mla.qk_rope_head_dim, ab),
        Operator("kv_write", "elementwise", "layer", (0, 0, 0, 0, 0), (0, latent * (ab + kb), 0, 0, 0)),
        Operator(
            "qk",
            "attention",
            "layer",
            (0, 0, 2.0 * n_local * mla.qk_head_dim, 0, 0),
            (0, n_local * latent * ab, score_bytes, latent * kb, 0),
        ),
        Operator("softmax", "attention", "layer", (0, 0, 5.0 * n_local, 0, 0), (0, 0, 2.0 * score_bytes, 0, 0)),
        # the latent was read once for the scores; the same tile gives the values
        Operator(
            "pv",
            "attention",
            "layer",
            (0, 0, 2.0 * n_local * mla.v_head_dim, 0, 0),
            (0, n_local * mla.kv_lora_rank * ab, score_bytes, 0, 0),
        ),
        linear_operator("o_proj", n * mla.v_head_dim, h, wb, ab, tp, split_out=False),
        residual_add_operator("attn_residual_add", h, ab),
        norm_operator("post_attn_norm", h, wb, ab),
    ]
    return ops
