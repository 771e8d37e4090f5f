"""Teacher-forced evaluation of a KV policy on held-out text: prefill a prefix with full
attention, then decode the rest position by position so the policy's selection acts on every
layer of every step. Per step and layer it records the attention mass kept (the full-attention
probabilities of this run's own query over all cached tokens, summed over the tokens the
policy let it attend to, averaged over heads) and the tokens attended; per step the
next-token negative log-likelihood.

A batch of equal-length windows decodes in lockstep (one query per window per step), so
every policy works on dense [batch, heads, tokens] masks."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from infersim.simulator.errors import InfersimError

from .model import DenseLlama, causal_mask
from .policies import KVPolicy


@dataclass
class EvalResult:
    label: str
    nll: np.ndarray  # [steps, B] next-token NLL of every decoded position
    mass: np.ndarray  # [steps, layers, B] attention mass kept
    attended: np.ndarray  # [steps, layers, B] cached tokens attended (mean over KV heads), current one excluded
    context: np.ndarray  # [steps] cached tokens before the step
    logits: torch.Tensor | None = None  # [B, steps, V] when asked for
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def perplexity(self) -> float:
        return float(math.exp(self.nll.mean()))

    def mass_kept(self, layer: int | None = None) -> float:
        m = self.mass if layer is None else self.mass[:, layer]
        return float(m.mean())

    def kv_fraction(self, layer: int | None = None) -> float:
        """Attended cached tokens / cached tokens, averaged over steps (and layers)."""
        frac = self.attended / np.maximum(self.context, 1)[:, None, None]
        return float((frac if layer is None else frac[:, layer]).mean())


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def evaluate_policy(
    model: DenseLlama,
    policy: KVPolicy,
    ids: torch.Tensor,
    prefill_tokens: int,
    *,
    keep_logits: bool = False,
    progress=None,
) -> EvalResult:
    """ids [B, T] (equal-length windows); the first `prefill_tokens` are the prompt."""
    B, T = ids.shape
    P = int(prefill_tokens)
    if not 1 <= P < T:
        raise InfersimError(f"prefill_tokens {P} must be in [1, {T - 1}] for windows of {T} tokens")
    s, dev = model.shape, model.device
    ids = ids.to(dev)
    _sync(dev)
    t0 = time.perf_counter()
    policy.start(model, B, T, T)
    K = torch.zeros(s.layers, B, s.kv_heads, T, s.head_dim, device=dev, dtype=model.dtype)
    V = torch.zeros_like(K)

    # prefill: full causal attention over the prompt, KV stored through the policy
    pos = torch.arange(P, device=dev).expand(B, P)
    h = model.embed(ids[:, :P])
    cos, sin = model.rope(h, pos)
    cmask = causal_mask(P, dev)[None, None]
    for i in range(s.layers):
        q, k, v = model.qkv(i, model.input_norm(i, h), cos, sin)
        k, v = policy.store(i, k, v, 0)
        K[i, :, :, :P], V[i, :, :, :P] = k, v
        out, probs = model.attend(model.scores(q, k), cmask, v)
        policy.after_prefill(i, q, k, probs)
        h = model.finish_layer(i, h, out)

    steps = T - 1 - P
    nll = np.zeros((steps, B))
    mass = np.zeros((steps, s.layers, B))
    attended = np.zeros((steps, s.layers, B))
    logits = [] if keep_logits else None
    for n, p in enumerate(range(P, T - 1)):
        h = model.embed(ids[:, p : p + 1])
        cos, sin = model.rope(h, torch.full((B, 1), p, device=dev))
        for i in range(s.layers):
            q, k, v = model.qkv(i, model.input_norm(i, h), cos, sin)
            k, v = policy.store(i, k, v, p)
            K[i, :, :, p : p + 1], V[i, :, :, p : p + 1] = k, v
            if policy.predicts:
                # InfiniGen speculates: layer i's input predicts layer i+1 (or, as an
                # ablation, layer i predicts itself)
                if getattr(policy, "lookahead", True):
                    if i == 0:  # nothing runs before layer 0: if it is selective, it predicts itself
                        policy.predict(0, h, cos, sin, p)
                    if i + 1 < s.layers:
                        policy.predict(i + 1, h, cos, sin, p)
                else:
                    policy.predict(i, h, cos, sin, p)
            sc = model.scores(q, K[i, :, :, : p + 1])  # [B, H, 1, p + 1]
            mask = policy.select(i, p, sc)
            out, probs = model.attend(sc, mask, V[i, :, :, : p + 1])
            full = torch.softmax(sc, dim=-1)
            mass[n, i] = (full * mask).sum(dim=-1)[:, :, 0].mean(dim=1).double().cpu().numpy()
            attended[n, i] = (mask[:, :, 0, :p].sum(dim=-1).double().mean(dim=1)).cpu().numpy()
            policy.observe(i, p, probs, mask)
            h = model.finish_layer(i, h, out)
        lg = model.logits(h)[:, 0]
        nll[n] = F.cross_entropy(lg.float(), ids[:, p + 1], reduction="none").double().cpu().numpy()
        if logits is not None:
            logits.append(lg)
        if progress is not None:
            progress()
    _sync(dev)
    return EvalResult(
        policy.label(),
        nll,
        mass,
        attended,
        np.arange(P, T - 1),
        torch.stack(logits, dim=1) if logits is not None else None,
        time.perf_counter() - t0,
    )


__all__ = ["EvalResult", "evaluate_policy"]
