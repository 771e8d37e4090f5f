"""vLLM's custom all-reduce (csrc/custom_all_reduce.cuh, vllm-project/vllm PR #2192; SGLang runs
the same kernel): every GPU reads its peers' buffers over NVLink through CUDA IPC and reduces
them itself, one-shot (each GPU reduces the whole message) below a switch size and two-shot
(reduce-scatter then all-gather) above it, in one kernel launch without NCCL's protocol steps.
Messages of at least `max_bytes` (8 MiB) go to NCCL, as the engines send them.

`custom` insists on the kernel: a deployment it cannot run on (a card without measured times, a
GPU count it does not support, PCIe beyond 2 GPUs, a group across nodes) is refused up front.
`auto` (auto.py) falls back to NCCL there instead."""

from __future__ import annotations

import numpy as np

from ...errors import InfersimError
from ..profile import HardwareProfile
from .base_all_reduce import AllReduce
from .nccl import NcclAllReduce
from .table import CustomAllReduceTable, shipped_table


class CustomAllReduce(AllReduce):
    name = "custom"

    def __init__(self, hardware: HardwareProfile, table: CustomAllReduceTable | None = None):
        super().__init__(hardware)
        self.table = table if table is not None else shipped_table()
        self.card = self.table.card_for(hardware.name)
        self.nccl = NcclAllReduce(hardware)

    def refusal(self, workers: int, across_nodes: bool) -> str | None:
        """Why the kernel does not run on this group (vLLM's rule, then the data), or None."""
        sizes = self.table.world_sizes
        if across_nodes:
            return "the tensor-parallel group spans nodes (the kernel runs inside one node)"
        if workers not in sizes:
            return f"it runs at {', '.join(map(str, sizes))} GPUs, not {workers}"
        if self.card is None:
            return f"hardware profile '{self.hardware.name}' has no measured custom all-reduce times"
        if workers > 2 and not self.card.fully_connected:
            return (
                f"beyond 2 GPUs it needs every GPU linked to every other by NVLink, which '{self.hardware.name}' lacks"
            )
        if not self.card.prices(workers):
            return f"'{self.hardware.name}' has no measured custom all-reduce times at {workers} GPUs"
        return None

    def check(self, workers: int, across_nodes: bool, field: str) -> None:
        why = self.refusal(workers, across_nodes) if workers > 1 else None
        if why is not None:
            raise InfersimError(f"{field}: custom all-reduce cannot run here: {why}; use nccl or auto")

    def time_s(self, nbytes, workers: int) -> np.ndarray:
        nbytes = np.asarray(nbytes, dtype=np.float64)
        within = nbytes < self.table.max_bytes
        if not within.any():
            return self.nccl.time_s(nbytes, workers)
        custom = self.card.time_s(nbytes, workers)
        if within.all():
            return custom
        return np.where(within, custom, self.nccl.time_s(nbytes, workers))

    def describe(self, workers: int, across_nodes: bool = False) -> str:
        return (
            f"custom below {self.table.max_bytes} bytes ({self.card.label(self.hardware.name)}), "
            f"{self.nccl.describe(workers)} above"
        )
