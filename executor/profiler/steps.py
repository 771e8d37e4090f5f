"""Whole-iteration step times of small Llama-style transformers built from torch operators.

The weights are random: these are kernel timings of the operators a real decoder runs
(embedding, RMSNorm, q/k/v/o projections with rotary embeddings, causal or cached
scaled-dot-product attention, KV-cache writes, SwiGLU MLP, final norm, lm_head on the last
position of each sequence), not a model anyone would sample text from.

Two kinds of step, as the serving engine runs them:
  prefill: `batch` prompts of `tokens` tokens each, no cache;
  decode:  one new token for each of `batch` sequences with `tokens` cached tokens.
The four features of AdaptiveLLM 3.2 are (layers, hidden size, tokens per request, batch)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..device import sdpa
from .device import Repeats, measure
from .kernels import Bench, torch_dtype

HEAD_DIM = 64
FFN_RATIO = 11008 / 4096  # Llama's intermediate / hidden
VOCAB = 32000


def intermediate_for(hidden: int) -> int:
    return max(64, 64 * round(FFN_RATIO * hidden / 64))


@dataclass(frozen=True)
class Arch:
    """The family every step benchmark shares; only layers and hidden size vary."""

    head_dim: int = HEAD_DIM
    ffn_ratio: float = FFN_RATIO
    vocab: int = VOCAB
    family: str = "llama"

    def as_dict(self) -> dict:
        return {
            "family": self.family,
            "head_dim": self.head_dim,
            "ffn_ratio": self.ffn_ratio,
            "vocab": self.vocab,
            "mlp": "gated",
            "norm": "rmsnorm",
            "tied_embeddings": True,
        }


class TinyDecoder:
    """A Llama-style decoder as plain tensors and torch.nn.functional calls."""

    def __init__(self, layers: int, hidden: int, *, device, dtype: str = "fp32", vocab: int = VOCAB, seed: int = 0):
        import torch

        self.torch = torch
        self.L, self.h, self.vocab = layers, hidden, vocab
        self.heads = max(1, hidden // HEAD_DIM)
        self.d = hidden // self.heads
        self.i = intermediate_for(hidden)
        self.device, self.td = device, torch_dtype(dtype)
        g = torch.Generator(device="cpu").manual_seed(seed)

        def w(*shape, scale=None):
            scale = scale or 1.0 / math.sqrt(shape[-1])
            return (torch.rand(*shape, generator=g) * 2 - 1).mul_(scale).to(device=device, dtype=self.td)

        self.embed = w(vocab, hidden, scale=0.02)  # tied with lm_head
        self.layers = []
        for _ in range(layers):
            self.layers.append(
                {
                    "n1": torch.ones(hidden, dtype=self.td, device=device),
                    "q": w(hidden, hidden),
                    "k": w(hidden, hidden),
                    "v": w(hidden, hidden),
                    "o": w(hidden, hidden),
                    "n2": torch.ones(hidden, dtype=self.td, device=device),
                    "gate": w(self.i, hidden),
                    "up": w(self.i, hidden),
                    "down": w(hidden, self.i),
                }
            )
        self.norm = torch.ones(hidden, dtype=self.td, device=device)

    def _rope(self, positions):
        torch = self.torch
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2, device=self.device, dtype=torch.float32) / self.d))
        ang = positions.to(torch.float32)[:, None] * inv[None, :]
        emb = torch.cat([ang, ang], dim=-1)
        return emb.cos().to(self.td), emb.sin().to(self.td)

    @staticmethod
    def _rotate(x, cos, sin):
        half = x.shape[-1] // 2
        rot = x.new_empty(x.shape)
        rot[..., :half] = -x[..., half:]
        rot[..., half:] = x[..., :half]
        return x * cos + rot * sin

    def new_cache(self, batch: int, capacity: int):
        torch = self.torch
        shape = (batch, self.heads, capacity, self.d)
        # zeros: a memset, much cheaper than random fill, and attention's time does not depend on the values
        return [
            (
                torch.zeros(shape, dtype=self.td, device=self.device),
                torch.zeros(shape, dtype=self.td, device=self.device),
            )
            for _ in range(self.L)
        ]

    def step(self, ids, start: int, cache):
        """One engine iteration: ids [batch, q] new tokens at positions start..start+q-1 of
        every sequence, cache[l] = (K, V) with room for start+q positions. Returns the logits
        of the last position of each sequence."""
        torch = self.torch
        F = torch.nn.functional
        b, q = ids.shape
        x = F.embedding(ids, self.embed)
        cos, sin = self._rope(torch.arange(start, start + q, device=self.device))
        for lw, (kc, vc) in zip(self.layers, cache):
            y = F.rms_norm(x, (self.h,), lw["n1"], 1e-6)
            qh = F.linear(y, lw["q"]).view(b, q, self.heads, self.d).transpose(1, 2)
            kh = F.linear(y, lw["k"]).view(b, q, self.heads, self.d).transpose(1, 2)
            vh = F.linear(y, lw["v"]).view(b, q, self.heads, self.d).transpose(1, 2)
            qh, kh = self._rotate(qh, cos, sin), self._rotate(kh, cos, sin)
            kc[:, :, start : start + q] = kh
            vc[:, :, start : start + q] = vh
            if start == 0:
                att = sdpa(qh, kc[:, :, :q], vc[:, :, :q], is_causal=True)
            else:
                att = sdpa(qh, kc[:, :, : start + q], vc[:, :, : start + q])
            x = x + F.linear(att.transpose(1, 2).reshape(b, q, self.h), lw["o"])
            y = F.rms_norm(x, (self.h,), lw["n2"], 1e-6)
            x = x + F.linear(F.silu(F.linear(y, lw["gate"])) * F.linear(y, lw["up"]), lw["down"])
        last = F.rms_norm(x[:, -1], (self.h,), self.norm, 1e-6)
        return F.linear(last, self.embed)

    # ---- the two benchmarked steps -------------------------------------------------------
    def prefill_fn(self, batch: int, tokens: int):
        torch = self.torch
        ids = torch.randint(0, self.vocab, (batch, tokens), device=self.device)
        cache = self.new_cache(batch, tokens)

        def fn():
            with torch.inference_mode():
                return self.step(ids, 0, cache)

        return fn

    def decode_fn(self, batch: int, context: int):
        torch = self.torch
        ids = torch.randint(0, self.vocab, (batch, 1), device=self.device)
        cache = self.new_cache(batch, context + 1)

        def fn():
            with torch.inference_mode():
                return self.step(ids, context, cache)

        return fn


# ---- the sweep ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepPlan:
    layers: tuple[int, ...]
    hidden: tuple[int, ...]
    prefill_tokens: tuple[int, int]  # log-uniform range of tokens per request
    prefill_batch: tuple[int, int]
    prefill_max_batched: int  # tokens x batch cap
    decode_context: tuple[int, int]
    decode_batch: tuple[int, int]
    max_kv_bytes: int
    points_per_shape: int  # per kind, at most
    budget_s: float  # wall-clock budget of the whole sweep
    rep: Repeats

    def domain(self) -> dict:
        return {
            "layers": [min(self.layers), max(self.layers)],
            "hidden": [min(self.hidden), max(self.hidden)],
            "prefill": {
                "tokens": list(self.prefill_tokens),
                "batch": list(self.prefill_batch),
                "max_batched_tokens": self.prefill_max_batched,
            },
            "decode": {"tokens": list(self.decode_context), "batch": list(self.decode_batch)},
        }


def step_plan(quick: bool) -> StepPlan:
    if quick:
        return StepPlan(
            layers=(1, 2, 4),
            hidden=(128, 256, 512),
            prefill_tokens=(8, 256),
            prefill_batch=(1, 8),
            prefill_max_batched=512,
            decode_context=(16, 2048),
            decode_batch=(1, 32),
            max_kv_bytes=64 << 20,
            points_per_shape=14,
            budget_s=15.0,
            rep=Repeats(warmup=1, min_repeats=3, max_repeats=7, target_s=0.02),
        )
    return StepPlan(
        layers=(1, 2, 3, 4),
        hidden=(128, 256, 384, 512, 768),
        prefill_tokens=(8, 512),
        prefill_batch=(1, 16),
        prefill_max_batched=2048,
        decode_context=(16, 4096),
        decode_batch=(1, 64),
        max_kv_bytes=256 << 20,
        points_per_shape=70,
        budget_s=900.0,
        rep=Repeats(warmup=2, min_repeats=5, max_repeats=25, target_s=0.1),
    )


def _log_uniform_int(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def sample_points(
    plan: StepPlan, kind: str, layers: int, hidden: int, rng: np.random.Generator, n: int, dtype_bytes: int
) -> list[tuple[int, int]]:
    """n distinct (tokens, batch) settings, log-uniform within the plan's caps."""
    out: list[tuple[int, int]] = []
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        if kind == "prefill":
            t = _log_uniform_int(rng, *plan.prefill_tokens)
            # a third of the prompts alone: a preempted sequence's recompute is a batch of one
            bsz = 1 if rng.uniform() < 1 / 3 else _log_uniform_int(rng, *plan.prefill_batch)
            if t * bsz > plan.prefill_max_batched:
                continue
            positions = t
        else:
            t = _log_uniform_int(rng, *plan.decode_context)
            bsz = _log_uniform_int(rng, *plan.decode_batch)
            positions = t + 1
        if 2 * layers * bsz * positions * hidden * dtype_bytes > plan.max_kv_bytes:
            continue
        if (t, bsz) not in out:
            out.append((t, bsz))
    return out


def step_sweep(b: Bench, plan: StepPlan, seed: int = 0, sentinel=None) -> list[dict]:
    """Every (layers, hidden) shape, alternating prefill and decode settings, until each
    shape's share of the budget or its point quota is used up. `sentinel()`, when given, is
    timed before each shape and recorded with its points (`sentinel_s`), so the fit can take
    out the machine's drift in speed over the sweep."""
    rng = np.random.default_rng(seed)
    shapes = [(L, h) for L in plan.layers for h in plan.hidden]
    per_shape_s = plan.budget_s / len(shapes)
    t_sweep = time.perf_counter()
    out = []
    saved, b.rep = b.rep, plan.rep
    try:
        for si, (L, h) in enumerate(shapes):
            model = TinyDecoder(L, h, device=b.device, dtype=b.dtype, seed=seed + si)
            sent = {"sentinel_s": sentinel()} if sentinel else {}
            pts = {k: sample_points(plan, k, L, h, rng, plan.points_per_shape, b.esize) for k in ("prefill", "decode")}
            shape_end = t_sweep + (si + 1) * per_shape_s  # time a fast shape leaves goes to the next
            for j in range(plan.points_per_shape):
                for kind in ("prefill", "decode"):
                    if j >= len(pts[kind]):
                        continue
                    # each shape's share of the budget, checked before every point but the first two
                    if j >= 1 and time.perf_counter() > shape_end:
                        break
                    t, bsz = pts[kind][j]
                    fn = model.prefill_fn(bsz, t) if kind == "prefill" else model.decode_fn(bsz, t)
                    out.append(
                        b.run(
                            fn,
                            f"step {kind} L{L} h{h} t{t} b{bsz}",
                            kind="step",
                            op_class="step",
                            phase=kind,
                            layers=L,
                            hidden=h,
                            tokens=t,
                            batch=bsz,
                            **sent,
                        )
                    )
                    del fn
                if j >= 1 and time.perf_counter() > shape_end:
                    break
            del model
    finally:
        b.rep = saved
    return out


def measure_step(model: TinyDecoder, kind: str, tokens: int, batch: int, timer, rep: Repeats) -> float:
    fn = model.prefill_fn(batch, tokens) if kind == "prefill" else model.decode_fn(batch, tokens)
    return measure(fn, timer, rep).median_s
