"""KV policies on the real model: which cached tokens each layer's decoding query attends to.

  full       every cached token (FlexGen's full offload; also the reference)
  int4       every cached token, K and V through 4-bit group quantization
  h2o        H2O: a budget of heavy hitters (largest accumulated attention) + recent tokens per
             KV head; the rest evicted for good at prefill and during decode
  infinigen  InfiniGen: layers below `start_layer` attend to everything held; from it on, the
             prediction made at layer i-1 (the next layer's query from layer i-1's input,
             skewed, r columns, against the partial key cache) picks, per KV head, the tokens
             above max - alpha, count averaged over heads and capped; optionally a host pool
             with a limit and FIFO / LRU / counter eviction (pool.py)

Parameters are the simulator's own pydantic classes (`simulator/offload/policies.py`: same
names, defaults and validation), and the H2O budget and InfiniGen cap are computed by the
simulator's policy objects, so the executor and the simulator agree on what a setting means.

A policy sees the evaluator's calls in order: `start` once; per layer of the prefill `store`
then `after_prefill`; per decode step and layer `store`, (`predict` for the next layer),
`select`, `observe`. The current token is always attended (its KV is computed on the GPU)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from infersim.simulator.errors import InfersimError
from infersim.simulator.offload.policies import (
    H2OParams,
    H2OPolicy,
    InfiniGenParams,
    InfiniGenPolicy,
    Int4Params,
    KVShape,
)
from infersim.simulator.offload.sparsity import SparsityModel, load_sparsity

from .model import DenseLlama
from .pool import KVPool
from .quant import quantize_dequantize
from .skew import apply_skew, choose_columns, gather_columns, identity_skew, partial_columns


def kv_shape(model: DenseLlama) -> KVShape:
    s = model.shape
    return KVShape(s.layers, s.hidden, s.heads, s.heads * s.head_dim, s.kv_heads * s.head_dim, 2.0, 2.0, 2.0)


def _group_sum(x: torch.Tensor, group: int) -> torch.Tensor:
    """[B, H, ...] -> [B, H / group, ...] summed over each KV head's query heads."""
    B, H = x.shape[:2]
    return x.reshape(B, H // group, group, *x.shape[2:]).sum(dim=2)


class KVPolicy:
    name = "base"
    predicts = False

    def __init__(self, params=None):
        self.params = params

    def label(self) -> str:
        return self.name

    def start(self, model: DenseLlama, batch: int, max_tokens: int, final_tokens: int) -> None:
        self.model, self.s = model, model.shape
        self.batch, self.max_tokens, self.final = batch, max_tokens, final_tokens

    def store(self, i: int, k: torch.Tensor, v: torch.Tensor, start: int):
        """The K/V [B, Hkv, n, d] of positions start.. as the cache will return them."""
        return k, v

    def after_prefill(self, i: int, q: torch.Tensor, k: torch.Tensor, probs: torch.Tensor) -> None:
        pass

    def predict(self, i: int, h_prev: torch.Tensor, cos, sin, pos: int) -> None:
        pass

    def kv_select(self, i: int, pos: int, scores: torch.Tensor) -> Optional[torch.Tensor]:
        """Tokens [0, pos) each KV head may attend to, [B, Hkv, pos] bool; None = all.
        `scores` [B, H, 1, pos + 1] are the layer's true scores (only an oracle may look)."""
        return None

    def select(self, i: int, pos: int, scores: torch.Tensor) -> torch.Tensor:
        """[B, H, 1, pos + 1] bool: the cached tokens and the current one."""
        B, s = self.batch, self.s
        sel = self.kv_select(i, pos, scores)
        mask = torch.ones(B, s.kv_heads, pos + 1, dtype=torch.bool, device=self.model.device)
        if sel is not None:
            mask[:, :, :pos] = sel
        return self.model.expand_kv(mask)[:, :, None, :]

    def observe(self, i: int, pos: int, probs: torch.Tensor, mask: torch.Tensor) -> None:
        pass


class FullCache(KVPolicy):
    name = "full"


class Int4KV(KVPolicy):
    name = "int4"

    def __init__(self, params=None):
        super().__init__(Int4Params.model_validate(dict(params or {})))

    def label(self) -> str:
        return f"int4 g{self.params.group_size}"

    def store(self, i, k, v, start):
        g, b = self.params.group_size, self.params.bits
        return quantize_dequantize(k, g, b), quantize_dequantize(v, g, b)


class H2O(KVPolicy):
    """Heavy hitters and recent tokens, per KV head (the query heads of a group add their
    attention). Budget B = the simulator's H2O budget (20% of the final length by default),
    half heavy hitters, half recent tokens (H2O's default split). The current token is
    attended beside the B held ones, as the policy's new KV always lands."""

    name = "h2o"

    def __init__(self, params=None):
        super().__init__(H2OParams.model_validate(dict(params or {})))

    def label(self) -> str:
        p = self.params
        return f"h2o {p.budget_tokens} tok" if p.budget_tokens else f"h2o {p.budget:g}"

    def start(self, model, batch, max_tokens, final_tokens):
        super().start(model, batch, max_tokens, final_tokens)
        sim = H2OPolicy(self.params, kv_shape(model))
        self.budget = int(sim.budget(np.asarray(final_tokens)))
        self.recent = self.budget - self.budget // 2
        L, Hkv = self.s.layers, self.s.kv_heads
        self.acc = torch.zeros(L, batch, Hkv, max_tokens, device=model.device)
        self.held = torch.zeros(L, batch, Hkv, max_tokens, dtype=torch.bool, device=model.device)

    def after_prefill(self, i, q, k, probs):
        P = probs.shape[-1]
        self.acc[i, :, :, :P] = _group_sum(probs.sum(dim=2), self.s.group)
        held = self.held[i]
        held[:, :, :P] = True
        if P > self.budget:
            keep_recent = max(0, P - self.recent)
            held[:, :, :keep_recent] = False
            heavy = self.budget - (P - keep_recent)
            if heavy > 0 and keep_recent > 0:
                top = torch.topk(self.acc[i, :, :, :keep_recent], min(heavy, keep_recent), dim=-1).indices
                held[:, :, :keep_recent].scatter_(-1, top, True)

    def kv_select(self, i, pos, scores):
        return self.held[i, :, :, :pos]

    def observe(self, i, pos, probs, mask):
        self.acc[i, :, :, : pos + 1] += _group_sum(probs[:, :, 0], self.s.group)
        held = self.held[i]
        held[:, :, pos] = True
        over = held[:, :, : pos + 1].sum(dim=-1) > self.budget  # [B, Hkv]
        if bool(over.any()):
            cand = held[:, :, : pos + 1].clone()
            cand[:, :, max(0, pos + 1 - self.recent) :] = False  # the recent window stays
            score = self.acc[i, :, :, : pos + 1].masked_fill(~cand, float("inf"))
            victim = torch.argmin(score, dim=-1)
            b, g = torch.nonzero(over, as_tuple=True)
            held[b, g, victim[b, g]] = False


class InfiniGen(KVPolicy):
    """InfiniGen's prediction and selection (see skew.py for the skewing and its RoPE
    handling). `skew` is a [layers, Hkv, d, d] tensor of skewing matrices (None: identity,
    the paper's 'w/o skewing'). `oracle`: select by the layer's true scores instead of the
    prediction, with the same count rule and cap (an upper bound on what prediction can do).
    `lookahead=False`: predict layer i from its own input instead of layer i-1's (isolates the
    error of the partial columns from that of speculating one layer ahead)."""

    name = "infinigen"
    predicts = True

    def __init__(
        self, params=None, skew: Optional[torch.Tensor] = None, *, oracle: bool = False, lookahead: bool = True
    ):
        super().__init__(InfiniGenParams.model_validate(dict(params or {})))
        self.skew, self.oracle, self.lookahead = skew, oracle, lookahead

    def label(self) -> str:
        p = self.params
        out = f"infinigen a{p.alpha:g}"
        if p.start_layer != 1:
            out += f" from-l{p.start_layer}"
        if p.max_fetch_tokens is not None:
            out += f" cap{p.max_fetch_tokens}"
        elif p.max_fetch_fraction != 0.2:
            out += f" cap{p.max_fetch_fraction:g}"
        if self.oracle:
            out += " oracle"
        else:
            out += "" if self.lookahead else " same-layer"
            out += "" if self.skew is not None else " no-skew"
        if p.pool_limit is not None:
            out += f" pool{p.pool_limit:g} {p.victim}"
        return out

    def start(self, model, batch, max_tokens, final_tokens):
        super().start(model, batch, max_tokens, final_tokens)
        s, p = self.s, self.params
        if p.start_layer > s.layers:
            raise InfersimError(f"infinigen start_layer {p.start_layer} is beyond the model's {s.layers} layers")
        # the simulator's policy object computes the cap (its sparsity data is not used here)
        self.sim = InfiniGenPolicy(p, kv_shape(model), SparsityModel(load_sparsity("opt-13b"), 4.0))
        self.A = (self.skew if self.skew is not None else identity_skew(model)).to(model.device, model.dtype)
        self.r = partial_columns(s.head_dim, p.partial_weight_ratio)
        self.cols = [None] * s.layers  # [B, Hkv, r] per layer
        self.kpart = torch.zeros(
            s.layers, batch, s.kv_heads, max_tokens, self.r, device=model.device, dtype=model.dtype
        )
        self.pred = [None] * s.layers  # predicted partial scores [B, H, pos] for the layer
        self.pools = None
        if p.pool_limit is not None:
            cap = max(1, math.ceil(p.pool_limit * final_tokens - 1e-9))
            self.pools = [KVPool(p.victim, batch, max_tokens, cap, device=model.device) for _ in range(s.layers)]
        self.fetched = torch.zeros(s.layers, dtype=torch.float64)  # tokens fetched, summed, per layer
        self.steps = 0
        self.predicted_counts: list[list[float]] = [[] for _ in range(s.layers)]

    def _skewed_k(self, i, k):
        return apply_skew(k, self.A[i])

    def store(self, i, k, v, start):
        if self.pools is not None:
            for t in range(start, start + k.shape[2]):
                self.pools[i].insert(t)
        if self.cols[i] is not None:  # decode: append the new token's partial key
            self.kpart[i, :, :, start : start + k.shape[2]] = gather_columns(self._skewed_k(i, k), self.cols[i])
        return k, v

    def after_prefill(self, i, q, k, probs):
        """The prompt fixes the partial columns (paper Fig. 9) and fills the partial key cache."""
        qs = apply_skew(q, self.A[i].repeat_interleave(self.s.group, dim=0))
        ks = self._skewed_k(i, k)
        self.cols[i] = choose_columns(qs, ks, self.s.group, self.r)
        self.kpart[i, :, :, : k.shape[2]] = gather_columns(ks, self.cols[i])

    def predict(self, i, h_prev, cos, sin, pos):
        """At layer i-1, layer i's query from layer i-1's block input (normalised by layer i's
        own RMSNorm: the same input the paper uses, with the next layer's per-channel scale),
        skewed and cut to the r columns, scored against layer i's partial keys."""
        if i < self.params.start_layer or pos == 0 or self.oracle:
            return
        q = self.model.query(i, self.model.input_norm(i, h_prev), cos, sin)  # [B, H, 1, d]
        qs = apply_skew(q, self.A[i].repeat_interleave(self.s.group, dim=0))
        qp = gather_columns(qs, self.model.expand_kv(self.cols[i]))  # [B, H, 1, r]
        kp = self.model.expand_kv(self.kpart[i, :, :, :pos])  # [B, H, pos, r]
        self.pred[i] = torch.matmul(qp, kp.transpose(-1, -2))[:, :, 0] * self.model.scale

    def kv_select(self, i, pos, scores):
        B, s = self.batch, self.s
        held = (
            self.pools[i].held(pos)
            if self.pools is not None
            else torch.ones(B, pos, dtype=torch.bool, device=self.model.device)
        )
        if i < self.params.start_layer or pos == 0:
            sel = held[:, None, :].expand(B, s.kv_heads, pos)
        else:
            pred = scores[:, :, 0, :pos] if self.oracle else self.pred[i]
            sc = pred.masked_fill(~held[:, None, :], float("-inf"))  # [B, H, pos]
            top = sc.max(dim=-1, keepdim=True).values
            count = (sc > top - self.params.alpha).sum(dim=-1).double().mean(dim=1)  # averaged over heads
            n_held = held.sum(dim=1)
            cap = torch.as_tensor(self.sim.cap(np.full(B, pos), np.full(B, self.final)), device=count.device)
            k = torch.minimum(torch.minimum(torch.ceil(count - 1e-9).long(), cap), n_held).clamp(min=1)
            kmax = int(k.max())
            # per KV head: a token ranks by its best predicted score over the group's heads
            gsc = sc.view(B, s.kv_heads, s.group, pos).amax(dim=2)
            idx = torch.topk(gsc, kmax, dim=-1).indices
            keep = torch.arange(kmax, device=idx.device)[None, None, :] < k[:, None, None]
            sel = torch.zeros(B, s.kv_heads, pos, dtype=torch.bool, device=idx.device)
            sel.scatter_(-1, idx, keep.expand(B, s.kv_heads, kmax))
            sel &= held[:, None, :]
            self.predicted_counts[i].append(float(count.mean()))
        if self.pools is not None and i >= self.params.start_layer:
            # a selective fetch ranks the entries it loads, and the current token counts as used
            # by its own query; whole-layer loads (below start_layer) rank nothing, so there
            # every victim policy falls back to the oldest entry
            used = torch.ones(B, pos + 1, dtype=torch.bool, device=sel.device)
            used[:, :pos] = sel.any(dim=1)
            self.pools[i].access(used)
        self.fetched[i] += float(sel.sum(dim=-1).double().mean())
        if i == 0:
            self.steps += 1
        return sel


POLICY_NAMES = ("full", "int4", "h2o", "infinigen")


def build_kv_policy(name: str, params: dict | None = None, skew: Optional[torch.Tensor] = None) -> KVPolicy:
    """A policy by the simulator's name (aliases: flexgen = full)."""
    key = {"flexgen": "full", "gpu": "full", "ideal": "full"}.get(name, name)
    try:
        if key == "full":
            return FullCache()
        if key == "int4":
            return Int4KV(params)
        if key == "h2o":
            return H2O(params)
        if key == "infinigen":
            return InfiniGen(params, skew)
    except Exception as exc:  # pydantic: one line naming the policy's fields
        from pydantic import ValidationError

        from infersim.simulator.errors import pydantic_error_line

        if isinstance(exc, ValidationError):
            raise InfersimError(pydantic_error_line(f"offload params for policy '{name}'", exc)) from None
        raise
    raise InfersimError(f"unknown executor KV policy '{name}'; known: {', '.join(POLICY_NAMES)}")


__all__ = ["FullCache", "H2O", "InfiniGen", "Int4KV", "KVPolicy", "POLICY_NAMES", "build_kv_policy", "kv_shape"]
