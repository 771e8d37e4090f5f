"""Important-token counts measured on a real model, as the simulator's sparsity data.

InfiniGen counts, per query, the cached tokens whose attention score is above the row's
maximum minus alpha, averaged over heads (paper 4.3, 5.3). Here that count is measured on the
model's true scores with the full cache (a causal forward over held-out windows: every query
position is a decode step with position + 1 cached tokens), by layer and context length, for
several alphas, together with the attention mass those tokens hold. `sparsity_spec` turns it
into `simulator/catalog/sparsity/*.yaml` (SparsitySpec): the count averaged over layers per
context point, per-layer multipliers (`layer_scale`), and the mass at the chosen alpha."""

from __future__ import annotations

import numpy as np
import torch

from infersim.simulator.offload.sparsity import SparsitySpec

from .model import DenseLlama, full_forward


@torch.inference_mode()
def important_counts(model: DenseLlama, ids: torch.Tensor, alphas) -> dict:
    """ids [B, T] -> {"count": [A, L, T], "mass": [A, L, T]} averaged over windows and heads;
    index t is the query at position t (t + 1 tokens in the cache, itself included)."""
    B, T = ids.shape
    L = model.shape.layers
    alphas = [float(a) for a in alphas]
    count = np.zeros((len(alphas), L, T))
    mass = np.zeros((len(alphas), L, T))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for b in range(B):  # one window at a time: the score matrices are [H, T, T] per layer
        _, trace = full_forward(model, ids[b : b + 1].to(model.device), keep_scores=True)
        for i, t in enumerate(trace):
            sc = t["scores"][0].float().cpu().masked_fill(~causal, float("-inf"))  # [H, T, T]
            top = sc.max(dim=-1, keepdim=True).values
            probs = torch.softmax(sc, dim=-1)
            for a, alpha in enumerate(alphas):
                imp = sc > top - alpha
                count[a, i] += imp.sum(dim=-1).double().mean(dim=0).numpy()
                mass[a, i] += (probs * imp).sum(dim=-1).double().mean(dim=0).numpy()
    return {"alphas": alphas, "count": count / B, "mass": mass / B}


def at_contexts(series: np.ndarray, contexts, band: float = 0.1) -> np.ndarray:
    """Average a [..., T] series (index t = context t + 1) over the contexts within
    +-band of each point: [..., len(contexts)]."""
    T = series.shape[-1]
    ctx = np.arange(1, T + 1)
    out = []
    for c in contexts:
        sel = (ctx >= c * (1 - band)) & (ctx <= min(T, c * (1 + band)))
        out.append(series[..., sel].mean(axis=-1))
    return np.stack(out, axis=-1)


def sparsity_spec(
    name: str,
    model_name: str,
    alphas,
    contexts,
    count_at: np.ndarray,
    mass_at: np.ndarray,
    mass_alpha: float,
    source: str,
) -> SparsitySpec:
    """count_at / mass_at [A, L, C] at the context points -> a validated SparsitySpec."""
    tables = []
    for a, alpha in enumerate(alphas):
        mean = count_at[a].mean(axis=0)
        tables.append(
            {
                "alpha": float(alpha),
                "context": [int(c) if float(c).is_integer() else float(c) for c in contexts],
                "tokens": [round(float(max(x, 1.0)), 2) for x in mean],
                "source": f"measured, alpha {alpha:g}: the mean over layers (layer_scale: each layer's share)",
            }
        )
    # per-layer multiplier of the layer-mean count: geometric mean over context points of the
    # alpha used for the mass (the simulator scales every context by one number per layer)
    ia = list(alphas).index(mass_alpha)
    ratio = count_at[ia] / np.maximum(count_at[ia].mean(axis=0, keepdims=True), 1e-9)
    scale = np.exp(np.log(np.maximum(ratio, 1e-9)).mean(axis=1))
    return SparsitySpec.model_validate(
        {
            "name": name,
            "model": model_name,
            "source": source,
            "important_tokens": tables,
            "layer_scale": [round(float(x), 4) for x in scale],
            "layer_scale_source": f"measured: per layer, the geometric mean over the context points of its count / "
            f"the mean over layers (alpha {mass_alpha:g})",
            "important_mass": round(float(np.clip(mass_at[ia].mean(), 1e-6, 1.0)), 4),
            "important_mass_source": f"measured: full-attention mass held by the tokens above max - {mass_alpha:g}, "
            f"averaged over heads, layers and the context points",
        }
    )


__all__ = ["at_contexts", "important_counts", "sparsity_spec"]
