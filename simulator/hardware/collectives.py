"""Measured NCCL collective times as a hardware-profile section (`collectives:`).

Each (collective, worker count, devices per node) measured on a setup is a piecewise line in
the message size: time = latency + bytes / bandwidth on each size range, because NCCL switches
protocol and algorithm with the message size (LL, LL128, Simple; ring, tree) and one line does
not fit them all. Bandwidth is the algorithm bandwidth (message bytes over time). Every fit
records the rows it came from and its error on them.

A worker count the setup did not measure, lying between two measured counts on the same link
and placement kind, takes the time interpolated linearly in log2(workers) between theirs at each
message size: NCCL's latency grows with the steps of its rings and trees, which neither stays
constant nor follows the ring's w - 1 steps between measured counts. A count outside the
measured ones borrows the nearest measured count on the same link (else of the same kind:
within one node, or across nodes) and rescales its size-dependent term by the ring
all-reduce's traffic factor 2(w-1)/w, the usual conversion between NCCL's algorithm and bus
bandwidth; its latency stays."""

from __future__ import annotations

import math
from typing import Literal, Optional

import numpy as np
from pydantic import BaseModel, Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from ..validation import STRICT_CONFIG

COLLECTIVES = ("all_reduce", "send_recv")
Topology = Literal["nvswitch", "nvlink_pair", "pcie", "inter_node"]


class SizeSegment(BaseModel):
    """One message-size range of a fit: [previous segment's max_bytes, max_bytes)."""

    model_config = STRICT_CONFIG
    max_bytes: Optional[PositiveFloat] = Field(description="exclusive upper bound of the range; none on the last")
    latency_us: NonNegativeFloat = Field(description="time of a zero-byte message on this range")
    bandwidth_gbps: Optional[PositiveFloat] = Field(
        description="message bytes per second on this range, GB/s; none where time does not grow with size"
    )
    rows: PositiveInt = Field(description="measurements this range was fitted on")
    mape_pct: NonNegativeFloat = Field(description="mean absolute percentage error on those rows")


class CollectiveFit(BaseModel):
    """One collective at one worker count and placement."""

    model_config = STRICT_CONFIG
    workers: PositiveInt
    devices_per_node: PositiveInt = Field(description="workers per node; fewer than workers means across nodes")
    topology: Topology
    fitted_on: str = Field(description="the table rows the fit used")
    rows: PositiveInt
    mape_pct: NonNegativeFloat = Field(description="fit error on its rows")
    bias_pct: float = Field(description="mean signed error on its rows (positive: predicts slower)")
    segments: list[SizeSegment] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self):
        bounds = [s.max_bytes for s in self.segments]
        if bounds[-1] is not None or any(b is None for b in bounds[:-1]):
            raise ValueError("only the last segment has no max_bytes")
        if any(a >= b for a, b in zip(bounds[:-2], bounds[1:-1])):
            raise ValueError("segment max_bytes must increase")
        if self.devices_per_node > self.workers:
            raise ValueError(f"devices_per_node ({self.devices_per_node}) exceeds workers ({self.workers})")
        return self

    @property
    def across_nodes(self) -> bool:
        return self.devices_per_node < self.workers

    def parts_s(self, nbytes) -> tuple[np.ndarray, np.ndarray]:
        """Latency and size-dependent time, seconds, for each message size (elementwise)."""
        nbytes = np.asarray(nbytes, dtype=np.float64)
        edges = np.array([s.max_bytes for s in self.segments[:-1]], dtype=np.float64)
        idx = np.searchsorted(edges, nbytes, side="right")
        lat = np.array([s.latency_us * 1e-6 for s in self.segments])[idx]
        inv_bw = np.array([0.0 if s.bandwidth_gbps is None else 1.0 / (s.bandwidth_gbps * 1e9) for s in self.segments])[
            idx
        ]
        return lat, nbytes * inv_bw

    def time_s(self, nbytes) -> np.ndarray:
        lat, size_term = self.parts_s(nbytes)
        return lat + size_term


def topology_of(setup: str, workers: int, devices_per_node: int) -> str:
    """The link the collective's slowest hop crosses, from the setup's name."""
    if devices_per_node < workers:
        return "inter_node"
    if "dgx" in setup or "nvswitch" in setup:
        return "nvswitch"
    if "pair" in setup:
        return "nvlink_pair" if workers == 2 else "pcie"
    return "pcie"


def ring_traffic(workers: int) -> float:
    """Bytes each worker sends per message byte in a ring all-reduce."""
    return 2.0 * (workers - 1) / workers


def log2_interpolated(workers: int, lo: int, hi: int, time_lo, time_hi):
    """The time at `workers` GPUs between the times measured at `lo` and `hi` GPUs, linear in
    log2 of the GPU count (the module docstring says why)."""
    frac = math.log2(workers / lo) / math.log2(hi / lo)
    return (1.0 - frac) * time_lo + frac * time_hi


class CollectivesSection(BaseModel):
    """The `collectives:` section of a hardware profile: measured fits for one setup."""

    model_config = STRICT_CONFIG
    setup: str = Field(description="the measured setup, e.g. a100_dgx, a40_pairwise_nvlink")
    max_devices_per_node: PositiveInt = Field(description="GPUs in one node of the setup")
    confidence: Literal["measured"] = "measured"
    source: str = Field(description="where the measurements come from, with licence")
    all_reduce: list[CollectiveFit] = []
    send_recv: list[CollectiveFit] = []

    def fits(self, collective: str) -> list[CollectiveFit]:
        return self.all_reduce if collective == "all_reduce" else self.send_recv

    def lookup(
        self, collective: str, workers: int, devices_per_node: int | None = None
    ) -> tuple[CollectiveFit, float] | None:
        """The fit for `workers` (placed as densely as the setup allows unless
        `devices_per_node` says otherwise) and the factor its size-dependent term takes;
        None when the section measured no such collective."""
        fits = self.fits(collective)
        if not fits:
            return None
        per_node = devices_per_node or min(workers, self.max_devices_per_node)
        for fit in fits:
            if fit.workers == workers and fit.devices_per_node == per_node:
                return fit, 1.0
        # nearest count in doublings; a tie goes to the smaller count
        near = min(
            self._same_kind(fits, workers, per_node),
            key=lambda f: (abs(math.log2(f.workers / workers)), f.workers, -f.devices_per_node),
        )
        scale = ring_traffic(workers) / ring_traffic(near.workers) if collective == "all_reduce" else 1.0
        return near, scale

    def _same_kind(self, fits: list[CollectiveFit], workers: int, per_node: int) -> list[CollectiveFit]:
        topology = topology_of(self.setup, workers, per_node)
        return (
            [f for f in fits if f.topology == topology]
            or [f for f in fits if f.across_nodes == (per_node < workers)]
            or fits
        )

    def bracket(
        self, collective: str, workers: int, devices_per_node: int | None = None
    ) -> tuple[CollectiveFit, CollectiveFit] | None:
        """The nearest measured counts below and above an unmeasured `workers` on the same link
        (same topology), or None where the count is measured or not between two."""
        fits = self.fits(collective)
        per_node = devices_per_node or min(workers, self.max_devices_per_node)
        if not fits or any(f.workers == workers and f.devices_per_node == per_node for f in fits):
            return None
        topology = topology_of(self.setup, workers, per_node)
        link = [f for f in fits if f.topology == topology]
        below = [f for f in link if f.workers < workers]
        above = [f for f in link if f.workers > workers]
        if not below or not above:
            return None
        return max(below, key=lambda f: (f.workers, f.devices_per_node)), min(
            above, key=lambda f: (f.workers, -f.devices_per_node)
        )

    def time_s(self, collective: str, nbytes, workers: int, devices_per_node: int | None = None) -> np.ndarray | None:
        pair = self.bracket(collective, workers, devices_per_node)
        if pair is not None:
            lo, hi = pair
            return log2_interpolated(workers, lo.workers, hi.workers, lo.time_s(nbytes), hi.time_s(nbytes))
        found = self.lookup(collective, workers, devices_per_node)
        if found is None:
            return None
        fit, scale = found
        lat, size_term = fit.parts_s(nbytes)
        return lat + scale * size_term

    def all_reduce_time_s(self, nbytes, workers: int) -> np.ndarray | None:
        return self.time_s("all_reduce", nbytes, workers)

    def send_recv_time_s(self, nbytes) -> np.ndarray | None:
        """Point-to-point between two GPUs of one node (pipeline stages placed side by side)."""
        return self.time_s("send_recv", nbytes, 2)
