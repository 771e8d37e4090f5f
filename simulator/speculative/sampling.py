"""How an acceptance probability measured one way (greedy, or rejection sampling at some
temperature) translates to another way of sampling: a small synthetic-logits model.

Acceptance tables are measured under one decoding setting; a workload may ask for another.
Nothing in the papers gives the conversion, so it comes from a toy that gets the directions
right and says what it assumes:

- the target's next-token logits at a position are i.i.d. normal with scale LOGIT_SCALE over a
  VOCAB-token vocabulary (scale 4 puts the mean top-1 probability at T=1 near 0.5 and the
  entropy near 1.8 nats, typical of chat models: an assumption, not a measurement);
- a draft (an SSM, or a Medusa head) sees the same logits plus independent normal noise of
  scale tau; tau is what a measured acceptance pins down (bisection on a precomputed curve).

Then, for a draft of noise tau at temperature T (p = softmax(z/T), q = softmax(z'/T)):
  greedy:    P(argmax q = argmax p)                        (what a greedy acceptance table says)
  sampling:  E[sum_x min(p(x), q(x))]                      (Leviathan et al.: rejection sampling's
                                                            per-token acceptance)
  typical:   P(p(x) > min(epsilon, delta * exp(-H(p)))) for the draft's proposal x (Medusa 2.3.1)
and per rank i of the draft's sorted guesses (for Medusa heads): P(x_i = argmax p), E[p(x_i)]
(the target samples a token and the candidate must be it: a lower bound on tree rejection
sampling) and the typical test on x_i. At T -> 0 sampling and typical both fall back to greedy.
What the toy says, and how it compares with the papers: typical acceptance of Medusa
candidates rises with temperature (Medusa 2.3.1 and Fig. 5 say so too); a Medusa candidate's
chance of matching the target's sampled token falls with temperature (Medusa 2.3.1: rejection
sampling loses efficiency as temperature rises); a draft chain's rejection-sampling acceptance
E[sum min(p, q)] rises mildly with temperature here, because the toy's draft is as sharp as the
target (real SSMs are flatter, which can turn that around; Leviathan et al. report both
directions across model pairs). Treat conversions as rough; measured tables win."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import numpy as np

VOCAB = 256
POSITIONS = 2048
LOGIT_SCALE = 4.0
TOP_RANKS = 10
_TAUS = np.concatenate([np.linspace(0.0, 2.0, 21)[:-1], np.linspace(2.0, 12.0, 26)[:-1], np.geomspace(12.0, 400.0, 16)])


@lru_cache(maxsize=1)
def _base():
    rng = np.random.default_rng(20240214)
    z = rng.standard_normal((POSITIONS, VOCAB)) * LOGIT_SCALE
    noise = rng.standard_normal((POSITIONS, VOCAB))
    return z, noise


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _norm_mode(mode: str, temperature: float) -> tuple[str, float]:
    if mode not in ("greedy", "sampling", "typical"):
        raise ValueError(f"unknown sampling mode '{mode}'")
    if mode == "greedy" or temperature <= 0:
        return "greedy", 0.0
    return mode, round(float(temperature), 6)


@lru_cache(maxsize=64)
def _rank_curves(mode: str, temperature: float, epsilon: float, delta: float) -> np.ndarray:
    """(len(_TAUS), TOP_RANKS): acceptance of the draft's rank-i guess as a function of tau."""
    z, noise = _base()
    top = z.argmax(axis=1)
    rows = np.arange(POSITIONS)[:, None]
    out = np.zeros((len(_TAUS), TOP_RANKS))
    if mode != "greedy":
        p = _softmax(z / temperature)
        if mode == "typical":
            ent = -(p * np.log(np.maximum(p, 1e-300))).sum(axis=1)
            thr = np.minimum(epsilon, delta * np.exp(-ent))[:, None]
    for j, tau in enumerate(_TAUS):
        zd = z + tau * noise
        part = np.argpartition(-zd, TOP_RANKS, axis=1)[:, :TOP_RANKS]
        ranks = np.take_along_axis(part, np.argsort(-np.take_along_axis(zd, part, axis=1), axis=1), axis=1)
        if mode == "greedy":
            out[j] = (ranks == top[:, None]).mean(axis=0)
        elif mode == "sampling":
            out[j] = p[rows, ranks].mean(axis=0)
        else:
            out[j] = (p[rows, ranks] > thr).mean(axis=0)
    return out


@lru_cache(maxsize=64)
def _overlap_curve(temperature: float) -> np.ndarray:
    """Rejection sampling's per-token acceptance E[sum min(p, q)] against tau."""
    z, noise = _base()
    p = _softmax(z / temperature)
    return np.array([np.minimum(p, _softmax((z + tau * noise) / temperature)).sum(axis=1).mean() for tau in _TAUS])


def _chain_curve(mode: str, temperature: float) -> np.ndarray:
    """A draft chain's per-token acceptance against tau (greedy or rejection sampling)."""
    mode, temperature = _norm_mode(mode, temperature)
    if mode == "greedy":
        return _rank_curves("greedy", 0.0, 0.0, 0.0)[:, 0]
    if mode == "sampling":
        return _overlap_curve(temperature)
    raise ValueError("typical acceptance is modelled for Medusa heads only")


def _invert(curve: np.ndarray, value: float) -> float:
    """tau at which a curve that falls with tau takes `value` (linear interpolation)."""
    c = np.minimum.accumulate(curve)  # enforce monotone (sampling noise at large tau)
    value = float(np.clip(value, c[-1], c[0]))
    # np.interp needs increasing x: use the reversed curve
    return float(np.interp(value, c[::-1], _TAUS[::-1]))


def _at(curve: np.ndarray, tau: float) -> float:
    return float(np.interp(tau, _TAUS, curve))


def convert_token_acceptance(value: float, src: tuple[str, float], dst: tuple[str, float]) -> float:
    """A per-token acceptance measured under src = (mode, temperature) seen under dst."""
    src_n, dst_n = _norm_mode(*src), _norm_mode(*dst)
    if src_n == dst_n or value <= 0 or value >= 1:
        return float(value)
    tau = _invert(_chain_curve(*src_n), value)
    return float(np.clip(_at(_chain_curve(*dst_n), tau), 0.0, 1.0))


@dataclass
class RankAcceptance:
    """Medusa candidates' acceptance per (head, rank). `acc[k, i]`: the rank-i guess of head k is
    the target's own token (disjoint events per head: greedy decoding, or rejection sampling
    where the target samples and a candidate must match). `extra[k, i]` (typical acceptance only):
    the rank-i guess passes the typical test although it is not the target's argmax, as a
    probability given that it is not the argmax."""

    acc: np.ndarray
    extra: Optional[np.ndarray] = None


def convert_rank_accuracies(
    acc: np.ndarray, mode: str, temperature: float, epsilon: float = 0.09, delta: float = 0.3
) -> RankAcceptance:
    """Medusa head accuracies (heads x ranks, measured greedy: P(rank-i guess is the target's
    argmax)) under another acceptance scheme.

    sampling: each head's row is scaled by the toy's E[p(x_i)] / P(x_i = argmax) summed over the
    ranks (one factor per head, so the table's shape across ranks is kept);
    typical: the table stays (the argmax always passes the typical test) and `extra` is the toy's
    P(typical | not argmax) per rank: P(p(x_i) > thr and x_i != argmax) / P(x_i != argmax)."""
    acc = np.asarray(acc, dtype=np.float64)
    mode_n, t = _norm_mode(mode, temperature)
    if mode_n == "greedy":
        return RankAcceptance(acc.copy())
    greedy = _rank_curves("greedy", 0.0, 0.0, 0.0)
    ranks = min(acc.shape[1], TOP_RANKS)
    if mode_n == "sampling":
        samp = _rank_curves("sampling", t, 0.0, 0.0)
        out = acc.copy()
        for k in range(acc.shape[0]):
            tau = _invert(greedy[:, 0], acc[k, 0])
            g = sum(_at(greedy[:, i], tau) for i in range(ranks))
            s = sum(_at(samp[:, i], tau) for i in range(ranks))
            out[k] = acc[k] * (s / g if g > 0 else 1.0)
        return RankAcceptance(np.clip(out, 0, 1))
    typ = _rank_curves("typical", t, float(epsilon), float(delta))
    extra = np.zeros_like(acc)
    for k in range(acc.shape[0]):
        tau = _invert(greedy[:, 0], acc[k, 0])
        for i in range(acc.shape[1]):
            r = min(i, TOP_RANKS - 1)
            g, ty = _at(greedy[:, r], tau), _at(typ[:, r], tau)
            extra[k, i] = min(1.0, max(0.0, ty - g) / max(1e-12, 1.0 - g))
    return RankAcceptance(acc.copy(), extra)
