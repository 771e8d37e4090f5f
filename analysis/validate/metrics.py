"""Error metrics of predicted against measured values.

- MAPE: mean of |predicted - measured| / |measured| over the pairs with a finite, non-zero
  measurement;
- signed bias: mean of (predicted - measured) / measured over the same pairs (positive: the
  prediction is too high);
- relative error of one number: (predicted - measured) / measured (None when measured is 0);
- time-weighted bias: sum(predicted) / sum(measured) - 1, the error of a total (how far a
  simulated clock drifts from the real one over the same iterations)."""

from __future__ import annotations

import math

import numpy as np


def _pairs(predicted, measured) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(predicted, dtype=np.float64).reshape(-1)
    m = np.asarray(measured, dtype=np.float64).reshape(-1)
    if p.shape != m.shape:
        raise ValueError(f"predicted and measured differ in length ({p.size} vs {m.size})")
    ok = np.isfinite(p) & np.isfinite(m) & (m != 0)
    return p[ok], m[ok]


def mape(predicted, measured) -> float:
    p, m = _pairs(predicted, measured)
    return float(np.mean(np.abs(p - m) / np.abs(m))) if m.size else float("nan")


def signed_bias(predicted, measured) -> float:
    p, m = _pairs(predicted, measured)
    return float(np.mean((p - m) / np.abs(m))) if m.size else float("nan")


def median_ape(predicted, measured) -> float:
    p, m = _pairs(predicted, measured)
    return float(np.median(np.abs(p - m) / np.abs(m))) if m.size else float("nan")


def total_bias(predicted, measured) -> float:
    p, m = _pairs(predicted, measured)
    s = float(m.sum())
    return float(p.sum()) / s - 1.0 if m.size and s else float("nan")


def rel_error(predicted, measured) -> float | None:
    if predicted is None or measured is None:
        return None
    p, m = float(predicted), float(measured)
    if not (math.isfinite(p) and math.isfinite(m)) or m == 0:
        return None
    return (p - m) / abs(m)


def percentile(x, q: float) -> float:
    a = np.asarray(x, dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(np.percentile(a, q)) if a.size else float("nan")
