"""What a run's KV pools take in device memory and in host memory, as pure functions of the
machine's numbers, the serving section and the workload (no torch, no device: tests call them
with any GPU's numbers), and the up-front refusal of a run whose pools would not fit.

Two numbers per pool, as in vLLM: the *planned* blocks (the accounting: admission, watermark,
preemption; derived from the device memory or set by serving.gpu_blocks / cpu_blocks /
swap_space_gb / offload.pool_blocks) and the *allocated* blocks (the tensors: no more than the
workload's requests can hold at once, `workload_blocks`, since the free lists hand out the
lowest ids first; executor/kvcache.py grows a pool past them only if a run needs it).

Where the pools live, by executor path:

| path | device memory | host memory |
|---|---|---|
| engine (plain; swap space) | the device pool | the swap pool |
| offload | one block (the engine's unused pool) | the KV pool (planned by executor/offload/plan.py) |
| speculative, Medusa | each model's pool (already sized to the workload) | none |

On a CPU the "device" pool is host memory too. Host pools are pageable on both devices: every
copy between a host pool and a GPU goes through a pinned staging buffer (a swap or a load
gathers scattered blocks first), so pinning the pool would buy nothing."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.filesize import decimal

from infersim.simulator.errors import InfersimError

PATHS = ("engine", "offload", "speculative")


def workload_blocks(prompt_tokens, output_tokens, block_size: int) -> int:
    """The most KV blocks the requests can hold at once: every prompt and output resident, each
    with a block to spare."""
    tokens = np.asarray(prompt_tokens, dtype=np.int64) + np.asarray(output_tokens, dtype=np.int64)
    return int((-(-tokens // block_size) + 1).sum())


def allocated_blocks(planned: int, workload: int | None) -> int:
    """The blocks a pool's tensors hold up front: the planned pool, or fewer when the workload
    can hold no more at once (at least one, so that block 0 exists; none for an empty pool)."""
    if workload is None:
        return int(planned)
    return int(min(planned, max(workload, 1)))


def pinned_bytes(nbytes: int) -> int:
    """Host memory one pinned tensor of `nbytes` (a staging buffer) takes: torch's caching host
    allocator rounds a request up to a power of two (ATen CachingHostAllocator), so count the
    rounded size, the most it can take."""
    return 0 if nbytes <= 0 else 1 << (int(nbytes) - 1).bit_length()


@dataclass(frozen=True)
class PoolSizes:
    """The KV pools one model of a run allocates."""

    device_blocks: int  # blocks in device memory
    host_blocks: int  # blocks in host memory
    block_bytes: int  # K and V of one block, every layer
    device_type: str  # "cuda" or "cpu"

    @property
    def device_pool_bytes(self) -> int:
        return self.device_blocks * self.block_bytes

    @property
    def host_pool_bytes(self) -> int:
        """The host pool as allocated: K and V, pageable."""
        return self.host_blocks * self.block_bytes

    @property
    def device_memory_bytes(self) -> int:
        """What the pools take from the GPU (0 on a CPU run)."""
        return self.device_pool_bytes if self.device_type == "cuda" else 0

    @property
    def host_memory_bytes(self) -> int:
        """What the pools take from host memory: the host pool, and on a CPU run the device pool."""
        return self.host_pool_bytes + (self.device_pool_bytes if self.device_type != "cuda" else 0)


def pool_sizes(
    path: str, *, device_type: str, gpu_blocks: int, cpu_blocks: int, workload: int | None, block_bytes: int
) -> PoolSizes:
    """The pools a run on `path` (PATHS) allocates for the planned gpu_blocks / cpu_blocks
    (offload: gpu_blocks is the host pool) and the workload's bound (`workload_blocks`)."""
    if path not in PATHS:
        raise ValueError(f"unknown executor path '{path}'; known: {', '.join(PATHS)}")
    if path == "offload":
        return PoolSizes(1, allocated_blocks(gpu_blocks, workload), block_bytes, device_type)
    if path == "speculative":
        return PoolSizes(int(gpu_blocks), 0, block_bytes, device_type)
    return PoolSizes(
        allocated_blocks(gpu_blocks, workload), allocated_blocks(cpu_blocks, workload), block_bytes, device_type
    )


def check_pools_fit(
    sizes: list[PoolSizes], *, host_available_bytes: float, device_free_bytes: float | None, source: str
) -> None:
    """Refuse, before allocating anything, pools that do not fit: the host memory they take
    against the host's available memory, the device memory against the GPU's free memory (after
    the weights). The offload path checks its planned host pool besides (executor/offload/plan.py)."""
    host = sum(s.host_memory_bytes for s in sizes)
    if host > host_available_bytes:
        raise InfersimError(
            f"{source}: the KV pools need {decimal(host)} of host memory, more than the "
            f"{decimal(host_available_bytes)} available on this machine; lower serving.cpu_blocks, "
            f"serving.swap_space_gb or offload.pool_blocks, or serve fewer requests"
        )
    device = sum(s.device_memory_bytes for s in sizes)
    if device_free_bytes is not None and device > device_free_bytes:
        raise InfersimError(
            f"{source}: the KV pools need {decimal(device)} of GPU memory, more than the "
            f"{decimal(device_free_bytes)} free on the device; lower serving.gpu_blocks"
        )


__all__ = [
    "PATHS",
    "PoolSizes",
    "allocated_blocks",
    "check_pools_fit",
    "pinned_bytes",
    "pool_sizes",
    "workload_blocks",
]
