"""Routers: which replica a new request goes to."""

from __future__ import annotations

from ..registry import Registry

ROUTERS: Registry = Registry("router")


@ROUTERS.register("round_robin")
class RoundRobinRouter:
    def __init__(self, n: int):
        self.n, self.next = n, 0

    def route(self, seq, replicas) -> int:
        i = self.next
        self.next = (i + 1) % self.n
        return i


@ROUTERS.register("least_outstanding")
class LeastOutstandingRouter:
    """The replica with the fewest requests not yet finished (ties: lowest index)."""

    def __init__(self, n: int):
        self.n = n

    def route(self, seq, replicas) -> int:
        loads = [r.outstanding for r in replicas]
        return loads.index(min(loads))
