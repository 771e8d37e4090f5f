"""What vLLM and SGLang run by default: their custom all-reduce wherever they would use it (a
group inside one node of 2, 4, 6 or 8 GPUs, all NVLink-connected or only 2; a message below
8 MiB) and NCCL everywhere else. A card vLLM would run the kernel on but whose times nobody
measured (a PCIe pair) keeps NCCL's price."""

from __future__ import annotations

import numpy as np

from ..profile import HardwareProfile
from .base_all_reduce import AllReduce
from .custom import CustomAllReduce
from .table import CustomAllReduceTable


class AutoAllReduce(AllReduce):
    name = "auto"

    def __init__(self, hardware: HardwareProfile, table: CustomAllReduceTable | None = None):
        super().__init__(hardware)
        self.custom = CustomAllReduce(hardware, table)
        self.nccl = self.custom.nccl

    def runs_custom(self, workers: int, across_nodes: bool = False) -> bool:
        return self.custom.refusal(workers, across_nodes) is None

    def time_s(self, nbytes, workers: int) -> np.ndarray:
        chosen = self.custom if self.runs_custom(workers) else self.nccl
        return chosen.time_s(nbytes, workers)

    def describe(self, workers: int, across_nodes: bool = False) -> str:
        if self.runs_custom(workers, across_nodes):
            return self.custom.describe(workers)
        return f"{self.nccl.describe(workers)}: {self.custom.refusal(workers, across_nodes)}"
