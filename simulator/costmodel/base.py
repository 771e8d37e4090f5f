"""The one interface through which anything in infersim asks how long something takes.

Callers: the serving engine (iterations, swaps), the preemption policies (swap vs recompute),
the capacity planner and the roofline/Medusa studies. Implementations, one file each, all in
`COST_MODELS` (costmodel/__init__.py) by name: from a model and a hardware profile, the
roofline and the regression step-time predictor (the two a workload's `serving.cost_model`
names); from measured data, the executor fit, the speculative round fit, the executor's
running fit and the replay of measured times; the offload pipeline (simulator/offload/) is
registered by its package."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from .batch import BatchShape

Direction = Literal["h2d", "d2h"]


class KVLink(Protocol):
    """A link between two serving instances (a disaggregated deployment's prefill-to-decode link)."""

    bandwidth_gbps: float  # GB/s
    latency_us: float


@dataclass(frozen=True)
class OperatorCost:
    name: str
    op_class: str
    scope: str  # layer | model | iteration
    count: int  # how many times per iteration (layers for per-layer operators)
    flops: float  # per occurrence, per GPU
    bytes: float  # per occurrence, per GPU
    compute_time_s: float
    memory_time_s: float
    time_s: float  # per occurrence, including kernel overhead
    link: str = ""  # a communication's link: "node" (the profile's interconnect), "network" (between nodes), both

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")

    @property
    def bound(self) -> str:
        if self.op_class == "communication":
            return "network"
        if self.op_class == "overhead":
            return "launch"
        return "compute" if self.compute_time_s >= self.memory_time_s else "memory"

    @property
    def total_time_s(self) -> float:
        return self.time_s * self.count


class CostModel(ABC):
    """Narrow on purpose: an iteration's time, a run of decode steps, and a transfer."""

    name: str = "base"
    from_workload: bool = False  # built from (model, hardware, options) alone, so a workload may name it

    @abstractmethod
    def iteration_time_s(self, batch: BatchShape) -> float:
        """Wall time of one engine iteration over a mixed batch."""

    def decode_step_times_s(self, context_tokens: np.ndarray, steps: int) -> np.ndarray:
        """Times of `steps` consecutive pure-decode iterations of a fixed set of sequences
        whose contexts grow by one per step. Must equal calling iteration_time_s step by step,
        bit for bit; implementations vectorise it."""
        ctx = np.asarray(context_tokens, dtype=np.int64)
        return np.array([self.iteration_time_s(BatchShape.decode(ctx + j)) for j in range(steps)])

    @abstractmethod
    def transfer_time_s(self, nbytes: float, direction: Direction) -> float:
        """Host link copy of nbytes (KV swap, offload prefetch)."""

    def kv_transfer_time_s(self, nbytes: float, direction: Direction, copies: int = 1) -> float:
        """A KV move issued as `copies` separate asynchronous copies on one stream, nbytes in
        all. vLLM 0.2 swaps every block of every layer's K and V tensor apart (one
        cudaMemcpyAsync each: 2 x layers copies per block). Cost models that know no per-copy
        cost price it as one transfer."""
        return self.transfer_time_s(nbytes, direction)

    def kv_link_transfer_time_s(self, nbytes: float, link: KVLink) -> float:
        """A KV cache of nbytes sent from one instance to another (prefill to decode pool): one
        latency, then the bytes at the link's bandwidth."""
        if nbytes <= 0:
            return 0.0
        return link.latency_us * 1e-6 + float(nbytes) / (link.bandwidth_gbps * 1e9)

    def kv_link_streamed_time_s(
        self, nbytes: float, link: KVLink, prefill_time_s: float, layers: int, started_s: float = 0.0
    ) -> float:
        """Layer-wise streaming: layer i's KV share (nbytes / layers) is ready when the prefill
        has computed layer i (at i / layers of `prefill_time_s`); the link is free from
        `started_s` after the prefill began and sends the shares in order. Returns the time from
        the prefill's end to the last share's arrival: with w the wire time of one share,
        latency + max over i of (max(started_s, i / layers * prefill_time_s) + (layers - i + 1) * w)
        - prefill_time_s. A link free from the start that keeps up exposes only the last layer's
        share; one free only after the prefill sends the whole cache."""
        if nbytes <= 0:
            return 0.0
        share_s = float(nbytes) / (link.bandwidth_gbps * 1e9) / layers
        i = np.arange(1, layers + 1)
        ready_s = np.maximum(float(started_s), i / layers * float(prefill_time_s))
        last_s = float(np.max(ready_s + (layers - i + 1) * share_s))
        return link.latency_us * 1e-6 + max(0.0, last_s - float(prefill_time_s))

    def breakdown(self, batch: BatchShape) -> list[OperatorCost]:
        raise NotImplementedError(f"{self.name} does not give a per-operator breakdown")

    def prefill_time_s(self, tokens: int) -> float:
        """A sequence's prefill alone: the recompute cost of a preempted sequence."""
        return self.iteration_time_s(BatchShape.prefill([max(1, int(tokens))]))
