"""A cost model measured on the running engine, for the policies that ask one (cost-aware
preemption compares the time of a swap with that of a recompute).

iteration_time_s is an affine fit, time = a + b x tokens, kept up to date by least squares
over the measured iterations (a warm-up pass gives it a first estimate); transfer_time_s is
bytes over the host-copy bandwidth measured by the swaps themselves (and a probe copy at start)."""

from __future__ import annotations

import numpy as np

from .base import CostModel
from .batch import BatchShape


class MeasuredCostModel(CostModel):
    name = "measured"

    def __init__(self, fixed_s: float = 1e-3, per_token_s: float = 1e-4, bandwidth: float = 5e9):
        self.fixed_s, self.per_token_s = float(fixed_s), float(per_token_s)
        self.bandwidth = {"h2d": float(bandwidth), "d2h": float(bandwidth)}
        # sufficient statistics of the least-squares fit of time on tokens
        self._n = self._sx = self._sy = self._sxx = self._sxy = 0.0

    def observe_iteration(self, tokens: int, seconds: float) -> None:
        x, y = float(tokens), float(seconds)
        self._n += 1
        self._sx += x
        self._sy += y
        self._sxx += x * x
        self._sxy += x * y
        var = self._n * self._sxx - self._sx**2
        if self._n >= 2 and var > 0:
            b = (self._n * self._sxy - self._sx * self._sy) / var
            a = (self._sy - b * self._sx) / self._n
            if b > 0:
                self.fixed_s, self.per_token_s = max(0.0, a), b

    def observe_transfer(self, nbytes: float, seconds: float, direction: str) -> None:
        if nbytes > 0 and seconds > 0:
            old = self.bandwidth[direction]
            self.bandwidth[direction] = 0.7 * old + 0.3 * (nbytes / seconds)

    def iteration_time_s(self, batch: BatchShape) -> float:
        return self.fixed_s + self.per_token_s * float(np.sum(batch.query_tokens))

    def transfer_time_s(self, nbytes: float, direction) -> float:
        return float(nbytes) / self.bandwidth[direction]
