"""One forward pass of a ragged batch over the paged KV cache.

The runner uses the checkpoint's own modules (embeddings, projections, norms, MLPs, rotary
embedding) from the loaded Hugging Face model and replaces only the attention: every token
of the batch goes through the projections together (one matmul per weight), its K and V are
written into the paged cache at the sequence's slots, and attention reads each sequence's
cached K/V back from its blocks:
- decode-only batches (every sequence brings one token) gather all sequences' blocks into one
  padded [batch, kv_heads, max_len, head_dim] tensor and make one scaled_dot_product_attention
  call with a padding mask;
- otherwise each sequence gets its own call: is_causal for a fresh prefill, an explicit
  causal mask offset by the cached context for a chunk or a recompute of a partly cached one.
Only the rows that produce a token (a sequence's last query token, when its prompt is done)
go through the final norm and the LM head, unless the plan asks for every row (speculative
verification scores every drafted token).

Trees (Medusa, token-tree speculation): a sequence may bring its q new tokens as a tree, given
by the depth of each node and a [q, q] ancestor mask (a node sees the cached context, its
ancestors and itself). Its position ids are then context + depth, and its K/V are written at
the next q cache slots like any other tokens; after verification the caller keeps the accepted
path (see `PagedKVCache.keep_path`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .device import sdpa

_GQA = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


class TokenSeq:
    """The least a sequence needs for plan_batch and PagedKVCache: its tokens, how many are
    cached, its block tables (for callers without an engine's own sequence class)."""

    def __init__(self, tokens=()):
        self.tokens = list(tokens)
        self.computed = 0
        self.block_table: list[int] = []
        self.cpu_block_table: list[int] = []

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


@dataclass
class BatchPlan:
    """Inputs of one iteration, built once and shared by every layer."""

    input_ids: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    write_slots: torch.Tensor  # [N] flat cache slot (block * block_size + row) of each token's K/V
    q_lens: list[int]
    ctx_lens: list[int]  # tokens already cached before this iteration, per sequence
    logit_rows: torch.Tensor  # [M] rows of N whose next token is sampled
    decode_only: bool
    # decode-only: [B, max_blocks] block tables (padded with block 0) and a [B, 1, 1, L] key mask
    read_blocks: torch.Tensor | None = None
    read_mask: torch.Tensor | None = None
    # otherwise: per sequence, its block table
    seq_blocks: list[torch.Tensor] | None = None
    # per sequence: None, or a [q, q] bool ancestor mask of its new tokens (a token tree)
    tree_masks: list[torch.Tensor | None] | None = None


def plan_batch(
    cache, batch, device, *, all_logits: bool = False, trees: list[tuple[list[int], torch.Tensor] | None] | None = None
) -> BatchPlan:
    """batch: [(seq, q)] with seq.tokens, seq.computed, seq.block_table (already grown to
    computed + q tokens). Reads go by whole blocks (no per-token index lists).

    all_logits: every row of the batch gets logits (in batch order), not only the last row of
    a finished prompt. trees: per sequence None or (depths, ancestor mask [q, q] bool): the q
    tokens are tree nodes in topological order, positioned at context + depth."""
    ids, pos, write, q_lens, ctx_lens, rows = [], [], [], [], [], []
    bs = cache.block_size
    n = 0
    decode_only = True
    masks = None
    for i, (seq, q) in enumerate(batch):
        c = seq.computed
        bt = seq.block_table
        ids.extend(seq.tokens[c : c + q])
        tree = trees[i] if trees is not None else None
        if tree is None:
            pos.extend(range(c, c + q))
        else:
            depths, anc = tree
            if len(depths) != q or tuple(anc.shape) != (q, q):
                raise ValueError(f"tree of {len(depths)} nodes / mask {tuple(anc.shape)} for {q} tokens")
            pos.extend(c + int(d) for d in depths)
            masks = masks if masks is not None else [None] * len(batch)
            masks[i] = anc.to(device=device, dtype=torch.bool)
        write.extend(bt[p // bs] * bs + p % bs for p in range(c, c + q))
        q_lens.append(q)
        ctx_lens.append(c)
        if all_logits:
            rows.extend(range(n, n + q))
        elif c + q == seq.num_tokens:
            rows.append(n + q - 1)
        n += q
        if q != 1:
            decode_only = False
    t = lambda x: torch.tensor(x, dtype=torch.long, device=device)
    plan = BatchPlan(t(ids), t(pos), t(write), q_lens, ctx_lens, t(rows), decode_only, tree_masks=masks)
    if decode_only:
        nb = [-(-(c + 1) // bs) for c in ctx_lens]
        width = max(nb)
        plan.read_blocks = t([seq.block_table[:k] + [0] * (width - k) for (seq, _), k in zip(batch, nb)])
        lens = t([c + 1 for c in ctx_lens])
        if any(c + 1 != width * bs for c in ctx_lens):
            ar = torch.arange(width * bs, device=device)
            plan.read_mask = (ar[None, :] < lens[:, None])[:, None, None, :]
    else:
        plan.seq_blocks = [t(seq.block_table[: -(-(c + q) // bs)]) for (seq, q), c in zip(batch, ctx_lens)]
    return plan


class PagedAttention:
    """Attention of one layer over the paged cache."""

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, sliding_window: int | None = None
    ):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.groups = num_heads // num_kv_heads
        self.scale = scale
        self.window = sliding_window

    def _sdpa(self, q, k, v, mask=None, is_causal=False):
        if self.groups > 1:
            if _GQA:
                return sdpa(q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.scale, enable_gqa=True)
            k = k.repeat_interleave(self.groups, dim=-3)
            v = v.repeat_interleave(self.groups, dim=-3)
        return sdpa(q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.scale)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache, layer: int, plan: BatchPlan
    ) -> torch.Tensor:
        """q [N, H, D], k/v [N, KVH, D] of this iteration's tokens -> [N, H * D]."""
        kf, vf = cache.flat(layer)
        kf.index_copy_(0, plan.write_slots, k.to(kf.dtype))
        vf.index_copy_(0, plan.write_slots, v.to(vf.dtype))
        N = q.size(0)
        if plan.decode_only:
            kb, vb = cache.k[layer], cache.v[layer]  # [blocks, bs, KVH, D]
            B, W = plan.read_blocks.shape
            L = W * cache.block_size
            keys = kb[plan.read_blocks].view(B, L, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, KVH, L, D]
            vals = vb[plan.read_blocks].view(B, L, self.num_kv_heads, self.head_dim).transpose(1, 2)
            mask = plan.read_mask
            if self.window is not None and L > self.window:
                pos = torch.arange(L, device=q.device)
                qpos = torch.tensor(plan.ctx_lens, device=q.device)
                win = (pos[None, :] > qpos[:, None] - self.window)[:, None, None, :]
                mask = win if mask is None else (mask & win)
            out = self._sdpa(q[:, :, None, :], keys, vals, mask=mask)  # [B, H, 1, D]
            return out.reshape(N, self.num_heads * self.head_dim)
        outs = []
        start = 0
        for i, (ql, c) in enumerate(zip(plan.q_lens, plan.ctx_lens)):
            qi = q[start : start + ql].transpose(0, 1)[None]  # [1, H, q, D]
            total = c + ql
            blocks = plan.seq_blocks[i]
            kb, vb = cache.k[layer], cache.v[layer]
            ki = kb[blocks].view(-1, self.num_kv_heads, self.head_dim)[:total].transpose(0, 1)[None]  # [1, KVH, c+q, D]
            vi = vb[blocks].view(-1, self.num_kv_heads, self.head_dim)[:total].transpose(0, 1)[None]
            mask, causal = None, False
            tree = plan.tree_masks[i] if plan.tree_masks is not None else None
            if tree is not None:
                # the cached context is visible to every node; among the new tokens, ancestors only
                mask = torch.cat([torch.ones(ql, c, dtype=torch.bool, device=q.device), tree], dim=1)
            elif c == 0 and (self.window is None or total <= self.window):
                causal = ql > 1
            else:
                kpos = torch.arange(total, device=q.device)
                qpos = torch.arange(c, total, device=q.device)
                mask = kpos[None, :] <= qpos[:, None]
                if self.window is not None:
                    mask = mask & (kpos[None, :] > qpos[:, None] - self.window)
            out = self._sdpa(qi, ki, vi, mask=mask, is_causal=causal)  # [1, H, q, D]
            outs.append(out[0].transpose(0, 1).reshape(ql, self.num_heads * self.head_dim))
            start += ql
        return torch.cat(outs, dim=0) if len(outs) > 1 else outs[0]


class LlamaRunner:
    """Llama and Mistral (and other models laid out like LlamaForCausalLM)."""

    def __init__(self, hf_model):
        cfg = hf_model.config
        self.model = hf_model
        self.base = hf_model.model
        self.lm_head = hf_model.lm_head
        a0 = self.base.layers[0].self_attn
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(a0, "head_dim", None) or cfg.hidden_size // self.num_heads
        window = getattr(cfg, "sliding_window", None) if cfg.model_type == "mistral" else None
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, a0.scaling, window)
        self.num_layers = len(self.base.layers)

    @staticmethod
    def _rotate_half(x):
        x1 = x[..., : x.shape[-1] // 2]
        x2 = x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    @torch.inference_mode()
    def forward(self, plan: BatchPlan, cache, return_hidden: bool = False):
        """Logits of the plan's logit rows; with return_hidden also their last hidden states
        (after the final norm: what Medusa heads read)."""
        h = self.base.embed_tokens(plan.input_ids)  # [N, hidden]
        N = h.size(0)
        cos, sin = self.base.rotary_emb(h[None], plan.positions[None])  # [1, N, D]
        cos, sin = cos[0][:, None, :], sin[0][:, None, :]  # [N, 1, D]
        rot = self._rotate_half
        for i, layer in enumerate(self.base.layers):
            a = layer.self_attn
            res = h
            x = layer.input_layernorm(h)
            q = a.q_proj(x).view(N, -1, self.head_dim)
            k = a.k_proj(x).view(N, -1, self.head_dim)
            v = a.v_proj(x).view(N, -1, self.head_dim)
            q = (q * cos) + (rot(q) * sin)
            k = (k * cos) + (rot(k) * sin)
            o = self.attn(q, k, v, cache, i, plan)
            h = res + a.o_proj(o)
            res = h
            h = res + layer.mlp(layer.post_attention_layernorm(h))
        h = self.base.norm(h[plan.logit_rows])
        return (self.lm_head(h), h) if return_hidden else self.lm_head(h)


class OPTRunner:
    """OPT: learned positions (offset 2), LayerNorm before (or after) each block, ReLU MLP,
    the query scaled before attention as in transformers' OPTAttention."""

    def __init__(self, hf_model):
        cfg = hf_model.config
        self.model = hf_model
        self.dec = hf_model.model.decoder
        self.lm_head = hf_model.lm_head
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = self.num_heads
        self.head_dim = cfg.hidden_size // self.num_heads
        self.attn = PagedAttention(self.num_heads, self.num_heads, self.head_dim, 1.0)
        self.num_layers = len(self.dec.layers)
        self.pre = cfg.do_layer_norm_before
        self.offset = getattr(self.dec.embed_positions, "offset", 2)

    @torch.inference_mode()
    def forward(self, plan: BatchPlan, cache, return_hidden: bool = False):
        d = self.dec
        x = d.embed_tokens(plan.input_ids)
        if d.project_in is not None:
            x = d.project_in(x)
        h = x + F.embedding(plan.positions + self.offset, d.embed_positions.weight)
        N = h.size(0)
        for i, layer in enumerate(d.layers):
            a = layer.self_attn
            res = h
            if self.pre:
                h = layer.self_attn_layer_norm(h)
            q = (a.q_proj(h) * a.scaling).view(N, -1, self.head_dim)
            k = a.k_proj(h).view(N, -1, self.head_dim)
            v = a.v_proj(h).view(N, -1, self.head_dim)
            h = res + a.out_proj(self.attn(q, k, v, cache, i, plan))
            if not self.pre:
                h = layer.self_attn_layer_norm(h)
            res = h
            if self.pre:
                h = layer.final_layer_norm(h)
            h = res + layer.fc2(layer.activation_fn(layer.fc1(h)))
            if not self.pre:
                h = layer.final_layer_norm(h)
        h = h[plan.logit_rows]
        if d.final_layer_norm is not None:
            h = d.final_layer_norm(h)
        if d.project_out is not None:
            h = d.project_out(h)
        return (self.lm_head(h), h) if return_hidden else self.lm_head(h)


def build_runner(lm):
    """The runner for a LoadedModel's family."""
    if lm.family in ("llama", "mistral"):
        return LlamaRunner(lm.model)
    if lm.family == "opt":
        return OPTRunner(lm.model)
    raise ValueError(f"no runner for model family {lm.family!r}")
