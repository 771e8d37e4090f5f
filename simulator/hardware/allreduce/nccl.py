"""NCCL's all-reduce: the profile's measured fits (`collectives:`, fitted by `sim calibrate` from
microsoft/vidur's NCCL measurements), else a ring over the profile's interconnect: 2(w-1)/w of
the message at the link's bandwidth (scaled by the `communication` efficiency) plus its latency."""

from __future__ import annotations

import numpy as np

from ..collectives import ring_traffic
from ..profile import HardwareProfile
from .base_all_reduce import AllReduce


class NcclAllReduce(AllReduce):
    name = "nccl"

    def __init__(self, hardware: HardwareProfile):
        super().__init__(hardware)
        self.nccl = self
        link = hardware.interconnect
        comm = hardware.efficiency_for("communication")
        self.bandwidth_bytes_per_s = (link.bandwidth_gbps * 1e9 * comm.memory) if link else None
        self.latency_s = (link.latency_us * 1e-6) if link else 0.0

    def time_s(self, nbytes, workers: int) -> np.ndarray:
        coll = self.hardware.collectives
        measured = coll.all_reduce_time_s(nbytes, workers) if coll is not None else None
        if measured is not None:
            return measured
        if self.bandwidth_bytes_per_s is None:
            raise ValueError(
                f"tensor_parallel={workers} needs an interconnect in hardware profile '{self.hardware.name}'"
            )
        return ring_traffic(workers) * nbytes / self.bandwidth_bytes_per_s + self.latency_s

    def describe(self, workers: int, across_nodes: bool = False) -> str:
        coll = self.hardware.collectives
        if coll is not None and coll.all_reduce:
            return f"nccl (measured fits, {coll.setup})"
        return "nccl (ring over the interconnect, datasheet)"
