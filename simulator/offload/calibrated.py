"""The offload cost model's compute and host-link terms as replaceable parts.

`OffloadCostModel` composes, per layer, compute stages (attention side, FFN side, the
prediction of the next layer's tokens) with host-link loads and stores (costmodel.py). By
default the compute stages come from the roofline operators and the link from the hardware
profile. A *calibrated* cost model keeps exactly that composition and swaps only these two
inputs:

  compute   any object with `stage_times(x: StageInputs, pred_mask) -> StageTimes`
  link      a `HostLink`: latency + bytes / rate per layer copy, each direction

`LinearStageCompute` is the calibrated compute: per-layer stage times linear in the batch's
counts, with non-negative coefficients (fitted on held-out executor runs by
analysis/validate/offload_calibrate.py). Its terms, per iteration:

  overhead               c_const (engine scheduling, batch planning, Python)
  attention, per layer   (c_decode_seq x decode sequences + c_prefill_seq x prefilling sequences) / L
                         + c_key x keys attended at the layer + c_pair x query-key pairs at the layer
  FFN, per layer         c_prefill_token x prompt tokens / L
  prediction, per        c_pred_context x the decoding sequences' cached tokens / Lp (Lp layers
    predicted layer      chosen by a prediction: InfiniGen's from start_layer on; its per-sequence
                         cost is not separable from the attention's and sits there)
  post                   c_logit x rows sampled (final norm + lm_head)

(the split of per-sequence decode costs between attention and FFN is not identifiable from
iteration times; it matters only to overlapped pipelines, where the attention side is exposed,
and the fit is made on the executor's pipeline)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InfersimError

LINEAR_TERMS = ("const", "decode_seq", "prefill_seq", "prefill_token", "key", "pair", "logit", "pred_context")


@dataclass(frozen=True)
class StageInputs:
    """Counts of n settings of one batch: (n,) per iteration, (n, L) per layer."""

    tokens: np.ndarray  # (n,) new tokens
    logits: np.ndarray  # (n,) rows sampled
    keys: np.ndarray  # (n, L) keys attended (cached tokens attended + new), summed over the batch
    pairs: np.ndarray  # (n, L) query-key pairs
    attended: np.ndarray  # (n, L) cached tokens attended
    decode_seqs: np.ndarray  # (n,)
    prefill_seqs: np.ndarray  # (n,)
    prefill_tokens: np.ndarray  # (n,)
    decode_context: np.ndarray  # (n,) cached tokens held by the decoding sequences


@dataclass
class StageTimes:
    attn: np.ndarray  # (n, L)
    ffn: np.ndarray  # (n, L)
    pred: np.ndarray  # (n, L): choosing layer i's tokens, paid during layer i-1
    pre: np.ndarray  # (n,)
    post: np.ndarray  # (n,)
    overhead: np.ndarray | float


@dataclass(frozen=True)
class HostLink:
    """Per layer copy: latency + bytes / rate, loads (h2d) and stores (d2h) separately."""

    h2d_latency_s: float
    h2d_bytes_per_s: float
    d2h_latency_s: float
    d2h_bytes_per_s: float

    def __post_init__(self):
        if not (self.h2d_bytes_per_s > 0 and self.d2h_bytes_per_s > 0):
            raise InfersimError("host link rates must be positive")

    def to_json(self) -> dict:
        return dict(self.__dict__)


class LinearStageCompute:
    """Calibrated per-layer compute (see the module docstring); `coef` maps LINEAR_TERMS to
    seconds per unit."""

    def __init__(self, coef: dict[str, float]):
        unknown = set(coef) - set(LINEAR_TERMS)
        if unknown:
            raise InfersimError(
                f"unknown calibrated offload compute terms {sorted(unknown)}; known: " f"{', '.join(LINEAR_TERMS)}"
            )
        self.coef = {k: float(coef.get(k, 0.0)) for k in LINEAR_TERMS}

    def stage_times(self, x: StageInputs, pred_mask: np.ndarray) -> StageTimes:
        c = self.coef
        n, L = x.keys.shape
        per_seq = (c["decode_seq"] * x.decode_seqs + c["prefill_seq"] * x.prefill_seqs) / L
        attn = per_seq[:, None] + c["key"] * x.keys + c["pair"] * x.pairs
        ffn = np.broadcast_to((c["prefill_token"] * x.prefill_tokens / L)[:, None], (n, L)).copy()
        lp = int(np.count_nonzero(pred_mask))
        pred = np.zeros((n, L))
        if lp:
            per = c["pred_context"] * x.decode_context / lp
            pred = np.where(pred_mask[None, :], per[:, None], 0.0)
        return StageTimes(attn, ffn, pred, np.zeros(n), c["logit"] * x.logits, c["const"])

    def to_json(self) -> dict:
        return {"kind": "linear", "coef": dict(self.coef)}


__all__ = ["HostLink", "LINEAR_TERMS", "LinearStageCompute", "StageInputs", "StageTimes"]
