"""A dense re-implementation of a Llama-family forward pass, layer by layer, so that a KV
policy can decide which cached tokens each layer's query attends to.

It uses the loaded Hugging Face checkpoint's own weights (embeddings, projections, norms,
MLPs, rotary embedding) and replaces only the attention: each layer keeps a plain dense K/V
cache [batch, kv_heads, max_tokens, head_dim] (post-RoPE keys), and a decode step attends
over the cached tokens a boolean mask allows. With an all-true mask this is the model's own
forward (tests compare it with Hugging Face's logits).

Only the Llama/Mistral families (RoPE, RMSNorm, GQA) are supported: that is what InfiniGen's
Llama-2 results and the zoo target are."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from infersim.simulator.errors import InfersimError


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, d]; cos/sin [B, T, d] (Hugging Face's rotate-half convention)."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


@dataclass
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.heads // self.kv_heads


class DenseLlama:
    """Layer-level access to a loaded Llama checkpoint (executor.models.LoadedModel)."""

    def __init__(self, loaded):
        if loaded.family not in ("llama", "mistral"):
            raise InfersimError(
                f"model '{loaded.name}' is {loaded.family}: the offload executor runs Llama/Mistral "
                f"checkpoints (RoPE + GQA); zoo-target is one"
            )
        cfg = loaded.config
        self.hf = loaded.model
        self.inner = loaded.model.model
        self.device, self.dtype = loaded.device, loaded.dtype
        heads = int(cfg.num_attention_heads)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
        hd = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        self.shape = Shape(int(cfg.num_hidden_layers), int(cfg.hidden_size), heads, kv, hd)
        self.scale = 1.0 / math.sqrt(hd)
        self.layers = list(self.inner.layers)

    # ---- pieces ------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.inner.embed_tokens(ids)

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, T, d] for integer positions [B, T]."""
        return self.inner.rotary_emb(x, positions)

    def qkv(self, i: int, normed: torch.Tensor, cos, sin):
        """Post-RoPE q [B, H, T, d], k [B, Hkv, T, d] and v [B, Hkv, T, d] of layer i."""
        s, att = self.shape, self.layers[i].self_attn
        B, T, _ = normed.shape
        q = att.q_proj(normed).view(B, T, s.heads, s.head_dim).transpose(1, 2)
        k = att.k_proj(normed).view(B, T, s.kv_heads, s.head_dim).transpose(1, 2)
        v = att.v_proj(normed).view(B, T, s.kv_heads, s.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def query(self, i: int, normed: torch.Tensor, cos, sin) -> torch.Tensor:
        """Post-RoPE query of layer i only (InfiniGen's prediction runs layer i's query
        projection on layer i-1's input)."""
        s, att = self.shape, self.layers[i].self_attn
        B, T, _ = normed.shape
        q = att.q_proj(normed).view(B, T, s.heads, s.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin)

    def input_norm(self, i: int, h: torch.Tensor) -> torch.Tensor:
        return self.layers[i].input_layernorm(h)

    def finish_layer(self, i: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual + o_proj of the attention output [B, H, T, d], then the MLP block."""
        B, H, T, d = attn.shape
        layer = self.layers[i]
        h = h + layer.self_attn.o_proj(attn.transpose(1, 2).reshape(B, T, H * d))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.hf.lm_head(self.inner.norm(h))

    def expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        """[B, Hkv, ...] -> [B, H, ...]: each KV head serves `group` consecutive query heads."""
        return x.repeat_interleave(self.shape.group, dim=1)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Pre-softmax attention scores [B, H, Tq, Tk] (the logits InfiniGen thresholds)."""
        return torch.matmul(q, self.expand_kv(k).transpose(-1, -2)) * self.scale

    def attend(self, scores: torch.Tensor, mask: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Softmax over the allowed keys (mask [B, H, Tq, Tk] bool) and the weighted values."""
        p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return torch.matmul(p, self.expand_kv(v)), p


def causal_mask(T: int, device) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def full_forward(model: DenseLlama, ids: torch.Tensor, *, keep_scores: bool = False):
    """A plain causal forward of [B, T] ids: logits [B, T, V] and, per layer, the block input,
    post-RoPE q/k, v and (optionally) the scores. Used for offline skewing, the sparsity
    measurement and the tests."""
    B, T = ids.shape
    pos = torch.arange(T, device=ids.device).expand(B, T)
    h = model.embed(ids)
    cos, sin = model.rope(h, pos)
    mask = causal_mask(T, ids.device)[None, None]
    trace = []
    for i in range(model.shape.layers):
        q, k, v = model.qkv(i, model.input_norm(i, h), cos, sin)
        sc = model.scores(q, k)
        out, _ = model.attend(sc, mask, v)
        trace.append({"h_in": h, "q": q, "k": k, "v": v, **({"scores": sc} if keep_scores else {})})
        h = model.finish_layer(i, h, out)
    return model.logits(h), trace


__all__ = ["DenseLlama", "Shape", "apply_rope", "causal_mask", "full_forward", "rotate_half"]
