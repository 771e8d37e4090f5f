"""The offload executor's host KV pool: planned as the simulator plans it, and refused up front
when this machine cannot hold it.

Planning calls the simulator's `pool_blocks` (simulator/offload/memory.py) with this machine's
numbers: offload.pool_blocks when set, else the fewer of the tokens that host memory and the
GPU's free memory hold at the policy's bytes per cached token. Host memory is
offload.cpu_memory_gb, or this host's available memory (MemAvailable) where it has less, x
cpu_memory_utilization; the GPU's is its total_memory (on a CPU, --device-memory-gb) x
gpu_memory_utilization, less the non-torch reserve, the weights and the activation peak. A
workload whose host has cpu_memory_gb available gets the pool `sim run` plans on a card of the
same memory; the validation hands the executor's pool to the simulator besides
(validate_hooks.py).

The check counts what the run holds in host memory at its largest: the planned pool whole,
the one-block device pool and the activation peak on a CPU, the pinned staging buffers of the
layer loads on CUDA. The pool's tensors hold the workload's blocks and grow, doubling, up to the
plan and never past it (executor/kvcache.py), so no run passes what was checked; the free lists
hand out no id past the workload's blocks, so in practice the pool does not grow at all. The
host pool is pageable: every copy between it and a GPU goes through a pinned staging buffer,
since a load gathers scattered slots and a store scatters them (runner.py), so pinning the pool
would buy no asynchrony, and page-locking tens of gigabytes is one call a signal cannot
interrupt; a pageable pool is committed in 64 MiB slices, with SIGTERM handled between them.

`plan_host_pool`, `host_hold` and `check_host_fits` are pure (no torch): tests call them with
any card's numbers; `plan_offload_blocks` reads them off a loaded model."""

from __future__ import annotations

from dataclasses import dataclass

from rich.filesize import decimal

from infersim.simulator.errors import InfersimError
from infersim.simulator.machine import host_available_bytes
from infersim.simulator.models.catalog import load_model as load_spec
from infersim.simulator.models.spec import ModelSpec
from infersim.simulator.offload.config import OffloadSection
from infersim.simulator.offload.memory import PoolBlocks, PoolBudget, pool_blocks
from infersim.simulator.offload.setup import build_policy_for

from ..kv_memory import allocated_blocks, pinned_bytes
from ..models import dtype_name
from ..serving import DeviceBudget, device_budget

# loads in flight at once: layer i's, and layer i+1's issued during layer i (overlap ffn/layer)
LOADS_IN_FLIGHT = 2


@dataclass(frozen=True)
class Machine:
    """The machine an offload run plans for."""

    device: DeviceBudget
    host_available_bytes: float  # MemAvailable before the pools exist


def plan_host_pool(
    model: ModelSpec, section: OffloadSection, serving, machine: Machine, dtype: str, source: str = "workload"
) -> PoolBlocks:
    """The host pool's blocks for `model` in `dtype` (its weights all on the device, as the
    executor keeps them) on `machine`, as the simulator's `pool_blocks` sizes them, the host's
    memory capped at what this host has available."""
    device = machine.device
    policy, _, _ = build_policy_for(model, section, dtype, dtype)
    util = serving.gpu_memory_utilization
    budget = PoolBudget(
        usable_gpu_bytes=device.usable_bytes(serving),
        weight_bytes_gpu=device.weight_bytes,
        weight_bytes_cpu=0.0,
        activation_bytes=device.act_bytes,
        stream_buffer_bytes=0.0,
        kv_share=1.0,
        tp=1,
        block_size=serving.block_size,
        gpu_label=f"{device.device_type} ({device.total_bytes / 2**30:.3g} GiB x {util})",
        model_name=model.name,
        host_memory_bytes=machine.host_available_bytes,
    )
    return pool_blocks(policy, section, budget, source)


@dataclass(frozen=True)
class HostHold:
    """What an offload run holds in host memory at its largest, in bytes."""

    pool_bytes: int  # the planned host pool, K and V (pageable)
    device_pool_bytes: int  # a CPU run's one-block device pool (0 on CUDA)
    activation_bytes: float  # a CPU run's activation peak (0 on CUDA)
    staging_bytes: int  # CUDA: pinned buffers of the layer loads, as torch rounds them (0 on a CPU)

    @property
    def total_bytes(self) -> float:
        return self.pool_bytes + self.device_pool_bytes + self.activation_bytes + self.staging_bytes


def host_hold(
    planned_blocks: int,
    block_bytes: int,
    *,
    device_type: str,
    act_bytes: float,
    workload: int | None,
    num_layers: int,
) -> HostHold:
    """The host memory of an offload run whose pool plans `planned_blocks` of `block_bytes`
    and whose requests hold at most `workload` blocks at once (kv_memory.workload_blocks)."""
    cuda = device_type == "cuda"
    staging = 0
    if cuda:
        # a load copies one layer's K and V of the tokens loaded, at most every block held
        layer_half = allocated_blocks(planned_blocks, workload) * block_bytes // (2 * num_layers)
        staging = LOADS_IN_FLIGHT * 2 * pinned_bytes(layer_half)
    return HostHold(
        pool_bytes=int(planned_blocks) * int(block_bytes),
        device_pool_bytes=0 if cuda else int(block_bytes),
        activation_bytes=0.0 if cuda else float(act_bytes),
        staging_bytes=staging,
    )


def check_host_fits(hold: HostHold, plan: PoolBlocks, *, host_available_bytes: float, source: str) -> None:
    """Refuse, before anything is allocated, a run whose host memory at its largest exceeds the
    host's available memory, naming the field the pool came from."""
    if hold.total_bytes <= host_available_bytes:
        return
    explicit = plan.bound_by == "explicit"
    field = "offload.pool_blocks" if explicit else "offload.cpu_memory_gb"
    how = "as set" if explicit else f"{plan.bound_by}-bound"
    raise InfersimError(
        f"{source}: field '{field}': the host KV pool ({plan.blocks:,} blocks, {how}: "
        f"{decimal(hold.pool_bytes)}) and the run's other host memory need {decimal(hold.total_bytes)}, "
        f"more than the {decimal(host_available_bytes)} available on this machine; lower "
        f"offload.cpu_memory_gb or set offload.pool_blocks"
    )


def plan_offload_blocks(
    lm, sv, limits, section: OffloadSection, *, device_memory_gb, source: str
) -> tuple[dict, PoolBlocks]:
    """plan_host_pool for a loaded model: the run's memory section (executor/serving.py's
    plan_blocks keys; cpu_blocks 0: no second tier) and the plan."""
    b = device_budget(lm, sv, limits, kv_dtype=lm.dtype, device_memory_gb=device_memory_gb, activations=True)
    spec = load_spec(str(lm.path / "config.json"))
    plan = plan_host_pool(spec, section, sv, Machine(b, host_available_bytes()), dtype_name(lm.dtype), source)
    return {
        "gpu_blocks": plan.blocks,
        "cpu_blocks": 0,
        "kv_bytes_per_block": float(b.block_bytes),
        "weight_bytes_per_gpu": float(b.weight_bytes),
        "activation_bytes_per_gpu": float(b.act_bytes),
        "blocks_source": f"offload ({plan.bound_by}-bound KV pool)",
    }, plan


def check_offload_host(lm, mem: dict, plan: PoolBlocks, workload: int, source: str) -> HostHold:
    """check_host_fits for plan_offload_blocks' `mem` on this machine, before any pool exists."""
    hold = host_hold(
        mem["gpu_blocks"],
        int(mem["kv_bytes_per_block"]),
        device_type=lm.device.type,
        act_bytes=mem["activation_bytes_per_gpu"],
        workload=workload,
        num_layers=lm.config.num_hidden_layers,
    )
    check_host_fits(hold, plan, host_available_bytes=host_available_bytes(), source=source)
    return hold


__all__ = [
    "HostHold",
    "Machine",
    "check_host_fits",
    "check_offload_host",
    "host_hold",
    "plan_host_pool",
    "plan_offload_blocks",
]
