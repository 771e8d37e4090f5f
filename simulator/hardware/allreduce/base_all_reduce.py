"""The interface every tensor-parallel all-reduce kernel choice (`hardware.all_reduce`) meets:
the time of one all-reduce inside one node, and the check that refuses a deployment the choice
cannot price."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from ..profile import HardwareProfile


class AllReduce(ABC):
    """One all-reduce of a tensor-parallel group inside one node (a group across nodes is
    priced by simulator/parallel/links.py, always on NCCL: no engine runs its custom kernel
    across nodes)."""

    name: str = "base"
    nccl: "AllReduce"  # the NCCL pricing every choice falls back to (send/recv, groups across nodes)

    def __init__(self, hardware: HardwareProfile):
        self.hardware = hardware

    @abstractmethod
    def time_s(self, nbytes, workers: int) -> np.ndarray:
        """Seconds of one all-reduce of `nbytes` (array) over `workers` GPUs of one node."""

    def check(self, workers: int, across_nodes: bool, field: str) -> None:
        """Refuse, in one line naming `field`, a group this choice cannot price (default: none)."""

    def describe(self, workers: int, across_nodes: bool = False) -> str:
        """Which kernel prices this group's all-reduces and how certain it is, for records."""
        return self.name
