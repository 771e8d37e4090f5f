"""SimPy environment that can schedule an event at an absolute time.

A run of decode steps is costed in one vectorised call and its end times are a running sum
from the current time; landing on exactly that sum (not now + (sum - now), which can differ in
the last bit) is what makes event-jumping produce the same timestamps as stepping."""

from __future__ import annotations

from heapq import heappush

import simpy
from simpy.core import NORMAL


class SimEnvironment(simpy.Environment):
    def timeout_at(self, at: float, value=None) -> simpy.Event:
        if at < self._now:
            raise ValueError(f"cannot schedule in the past ({at} < {self._now})")
        ev = simpy.Event(self)
        ev._ok = True
        ev._value = value
        heappush(self._queue, (at, NORMAL, next(self._eid), ev))
        return ev
