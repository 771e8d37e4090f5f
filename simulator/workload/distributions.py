"""Sampling request lengths and arrival times, vectorised and deterministic.

One seed gives three independent child streams (numpy SeedSequence.spawn): arrivals, prompt
lengths, output lengths, so changing one distribution leaves the other two arrays unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InfersimError
from .schema import (
    BurstArrivals,
    EmpiricalDist,
    FixedDist,
    GammaArrivals,
    LognormalDist,
    PoissonArrivals,
    QuantileDist,
    UniformDist,
)
from .traces import read_columns, to_lengths

# Upper bound on requests generated for a duration, against a typo such as rate: 1e9.
MAX_REQUESTS = 50_000_000


def streams(seed: int) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    """(arrival, prompt, output) generators for a seed."""
    children = np.random.SeedSequence(seed).spawn(3)
    return tuple(np.random.Generator(np.random.PCG64(s)) for s in children)


def _to_tokens(x: np.ndarray) -> np.ndarray:
    return np.maximum(np.rint(x), 1).astype(np.int64)


def sample_lengths(dist, n: int, rng: np.random.Generator, base_dir: Path | None = None) -> np.ndarray:
    """n token counts (int64, >= 1) from a LengthDist."""
    if isinstance(dist, FixedDist):
        return np.full(n, dist.value, dtype=np.int64)
    if isinstance(dist, UniformDist):
        return rng.integers(dist.low, dist.high, size=n, endpoint=True, dtype=np.int64)
    if isinstance(dist, LognormalDist):
        # mean m and cv c: sigma^2 = ln(1 + c^2), mu = ln m - sigma^2 / 2
        sigma2 = np.log1p(dist.cv**2)
        x = rng.lognormal(np.log(dist.mean) - sigma2 / 2, np.sqrt(sigma2), size=n)
        return np.clip(_to_tokens(x), dist.min, dist.max if dist.max is not None else None)
    if isinstance(dist, QuantileDist):
        values = np.asarray(dist.values, dtype=np.float64)
        probs = np.linspace(0.0, 1.0, len(values)) if dist.probs is None else np.asarray(dist.probs)
        return _to_tokens(np.interp(rng.random(n), probs, values))
    if isinstance(dist, EmpiricalDist):
        path = Path(dist.file) if base_dir is None else (Path(base_dir) / dist.file)
        raw = read_columns(path, [dist.column], dist.format)[dist.column]
        if len(raw) == 0:
            raise InfersimError(f"{path}: column '{dist.column}' has no rows")
        pool = to_lengths(raw, path, dist.column, dist.kind, dist.scale)
        return pool[rng.integers(0, len(pool), size=n)]
    raise TypeError(f"not a length distribution: {dist!r}")


def _gaps(arrival, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(arrival, PoissonArrivals):
        return rng.exponential(1.0 / arrival.rate, size=n)
    if isinstance(arrival, GammaArrivals):
        shape = 1.0 / arrival.cv**2  # mean gap shape * scale = 1 / rate, cv = 1 / sqrt(shape)
        return rng.gamma(shape, 1.0 / (arrival.rate * shape), size=n)
    raise TypeError(f"not an open-loop arrival process: {arrival!r}")


def sample_arrivals(
    arrival, rng: np.random.Generator, count: int | None = None, duration_s: float | None = None
) -> np.ndarray:
    """Arrival times (float64, ascending, from >= 0) of an open-loop process (poisson, gamma,
    burst): `count` of them, or those up to `duration_s`, whichever ends first."""
    if count is None and duration_s is None:
        raise ValueError("give count or duration_s")
    if isinstance(arrival, BurstArrivals):
        if count is None:
            raise InfersimError("burst arrivals need requests.count")
        return np.zeros(count)
    if duration_s is None:
        return np.cumsum(_gaps(arrival, count, rng))
    expected = arrival.rate * duration_s
    if min(expected, count or expected) > MAX_REQUESTS:
        raise InfersimError(
            f"requests: rate x duration_s = {expected:.3g} requests, more than the "
            f"{MAX_REQUESTS:,} allowed; lower the rate or the duration, or set count"
        )
    # Draw in chunks sized to overshoot the duration almost surely; rarely more than one chunk.
    chunk = int(expected + 6 * np.sqrt(expected) + 16)
    if count is not None:
        chunk = min(chunk, count)
    parts, t_end, total = [], 0.0, 0
    while t_end <= duration_s and (count is None or total < count):
        t = t_end + np.cumsum(_gaps(arrival, chunk, rng))
        parts.append(t)
        t_end, total = t[-1], total + chunk
    t = np.concatenate(parts)
    t = t[: np.searchsorted(t, duration_s, side="right")]
    return t if count is None else t[:count]
