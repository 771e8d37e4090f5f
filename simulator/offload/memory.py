"""How many KV blocks an offloading replica can hold: the KV pool lives in CPU memory, so the
batch is bound by host memory (and by what the policy keeps on the GPU per cached token:
InfiniGen's partial key cache, the load buffers), not by the GPU's KV blocks.

  GPU:  memory x utilisation - non-torch reserve - resident weights - activation peak - the policy's fixed GPU
        bytes (InfiniGen's partial query weights) - a double buffer for streamed weights;
        what is left, over the policy's GPU bytes per cached token
  CPU:  cpu_memory_gb x cpu_memory_utilization - the CPU-resident weights; over the policy's
        CPU bytes per cached token (INT4: packed; InfiniGen with a pool limit: that fraction)
  pool tokens = min(CPU tokens, GPU tokens); blocks = tokens // block_size

The `gpu` policy keeps the KV on the GPU, and its plan is the GPU one alone."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.memory import MemoryOptions, MemoryPlan
from ..errors import InfersimError
from ..hardware.profile import HardwareProfile
from ..models.spec import ModelSpec
from .config import OffloadSection
from .policies import PlacementPolicy


@dataclass(frozen=True)
class OffloadMemoryPlan:
    pool_blocks: int
    block_size: int
    bound_by: str  # cpu | gpu | explicit
    cpu_pool_bytes: float
    gpu_free_bytes: float
    cpu_bytes_per_token: float
    gpu_bytes_per_token: float
    weight_bytes_gpu: float
    weight_bytes_cpu: float
    activation_bytes: float
    kv_bytes_per_block: float  # fp16 KV of a block, all layers (what a swap would move)
    non_torch_reserve_bytes: float = 0.0  # per GPU, kept out of the GPU budget
    memory_bytes_per_gpu: float = 0.0  # the card's total the GPU budget starts from

    @property
    def pool_tokens(self) -> int:
        return self.pool_blocks * self.block_size

    def engine_plan(self) -> MemoryPlan:
        """The engine's MemoryPlan with the pool in place of the GPU blocks (what bounds the
        batch), so summaries and KV utilisation refer to the pool."""
        return MemoryPlan(
            self.pool_blocks,
            0,
            self.kv_bytes_per_block,
            self.weight_bytes_gpu,
            self.activation_bytes,
            f"offload ({self.bound_by}-bound KV pool)",
            self.non_torch_reserve_bytes,
            self.memory_bytes_per_gpu,
        )

    def summary(self) -> dict:
        return {
            "pool_blocks": self.pool_blocks,
            "pool_tokens": self.pool_tokens,
            "bound_by": self.bound_by,
            "cpu_pool_gb": self.cpu_pool_bytes / 1e9,
            "gpu_free_gb": self.gpu_free_bytes / 1e9,
            "weights_gpu_gb": self.weight_bytes_gpu / 1e9,
            "weights_cpu_gb": self.weight_bytes_cpu / 1e9,
        }


@dataclass(frozen=True)
class PoolBudget:
    """What bounds an offload KV pool on one GPU, in bytes: the simulator fills it from a hardware
    profile and a model spec, the executor (executor/offload/plan.py) from the device it runs on
    and the loaded checkpoint; both size the pool with `pool_blocks`."""

    usable_gpu_bytes: float  # the GPU's memory x utilisation, less the non-torch reserve
    weight_bytes_gpu: float
    weight_bytes_cpu: float
    activation_bytes: float
    stream_buffer_bytes: float  # a double buffer for streamed weights (0 with every weight on the GPU)
    kv_share: float  # this GPU's share of the KV heads (1/tp, more where KV heads replicate)
    tp: int
    block_size: int
    gpu_label: str  # the GPU budget as messages name it
    model_name: str
    host_memory_bytes: float | None = None  # a real host's memory, when it has less than cpu_memory_gb


@dataclass(frozen=True)
class PoolBlocks:
    blocks: int
    bound_by: str  # cpu | gpu | explicit
    cpu_pool_bytes: float
    gpu_free_bytes: float
    cpu_bytes_per_token: float
    gpu_bytes_per_token: float


def host_pool_bytes(
    section: OffloadSection, weight_bytes_cpu: float = 0.0, host_memory_bytes: float | None = None
) -> float:
    """Host memory the KV pool may take: cpu_memory_gb (1e9), or a real host's memory where it has
    less, x cpu_memory_utilization, less the CPU-resident weights."""
    memory = section.cpu_memory_gb * 1e9
    if host_memory_bytes is not None:
        memory = min(memory, host_memory_bytes)
    return memory * section.cpu_memory_utilization - weight_bytes_cpu


def pool_blocks(
    policy: PlacementPolicy, section: OffloadSection, budget: PoolBudget, source: str = "workload"
) -> PoolBlocks:
    """The offload pool's blocks: offload.pool_blocks when set, else the fewer of the tokens host
    memory (`host_pool_bytes`) and the GPU's free memory hold at the policy's bytes per cached
    token, over the block size. The one sizing the simulator and the executor share."""
    b = budget
    gpu_free = (
        b.usable_gpu_bytes
        - b.weight_bytes_gpu
        - b.activation_bytes
        - policy.gpu_fixed_bytes() / b.tp
        - b.stream_buffer_bytes
    )
    cpu_pool = host_pool_bytes(section, b.weight_bytes_cpu, b.host_memory_bytes)
    gpu_tok = policy.gpu_bytes_per_token() * b.kv_share
    cpu_tok = policy.cpu_bytes_per_token() * b.kv_share
    if gpu_free <= 0:
        raise InfersimError(
            f"{source}: model '{b.model_name}' ({b.weight_bytes_gpu / 1e9:.1f} GB of weights on the GPU at weights_gpu_percent="
            f"{section.weights_gpu_percent:g}) leaves no GPU memory on {b.gpu_label}; lower offload.weights_gpu_percent"
        )
    if not policy.kv_on_gpu and cpu_pool <= 0:
        raise InfersimError(
            f"{source}: no CPU memory left for the KV pool ({section.cpu_memory_gb:g} GB x "
            f"{section.cpu_memory_utilization} less {b.weight_bytes_cpu / 1e9:.1f} GB of CPU weights)"
        )
    gpu_tokens = gpu_free / gpu_tok if gpu_tok > 0 else float("inf")
    cpu_tokens = cpu_pool / cpu_tok if cpu_tok > 0 else float("inf")
    if section.pool_blocks is not None:
        blocks, bound = int(section.pool_blocks), "explicit"
    else:
        tokens = min(gpu_tokens, cpu_tokens)
        blocks, bound = int(tokens // b.block_size), ("gpu" if gpu_tokens <= cpu_tokens else "cpu")
    if blocks <= 0:
        raise InfersimError(f"{source}: the offload memory plan leaves no KV blocks ({bound}-bound)")
    return PoolBlocks(blocks, bound, cpu_pool, gpu_free, cpu_tok, gpu_tok)


def plan_offload_memory(
    model: ModelSpec,
    hw: HardwareProfile,
    policy: PlacementPolicy,
    section: OffloadSection,
    opts: MemoryOptions,
    source: str = "workload",
) -> OffloadMemoryPlan:
    """The offload plan for the serving fields in `opts` (its swap space and fixed block counts
    do not apply: the pool is the host memory's, or `offload.pool_blocks`)."""
    tp = opts.tp
    frac = section.weights_gpu_percent / 100.0
    weights = model.weight_bytes_per_gpu(tp, opts.dtype)
    w_gpu, w_cpu = frac * weights, (1.0 - frac) * weights
    act = opts.activation_bytes(model)
    budget = PoolBudget(
        usable_gpu_bytes=opts.usable_bytes(hw),
        weight_bytes_gpu=w_gpu,
        weight_bytes_cpu=w_cpu,
        activation_bytes=act,
        stream_buffer_bytes=2.0 * (1.0 - frac) * weights / model.num_layers,
        kv_share=model.kv_heads_per_gpu(tp) / model.kv_heads,
        tp=tp,
        block_size=opts.block_size,
        gpu_label=opts.budget_label(hw),
        model_name=model.name,
    )
    p = pool_blocks(policy, section, budget, source)
    return OffloadMemoryPlan(
        p.blocks,
        opts.block_size,
        p.bound_by,
        p.cpu_pool_bytes,
        p.gpu_free_bytes,
        p.cpu_bytes_per_token,
        p.gpu_bytes_per_token,
        w_gpu,
        w_cpu,
        act,
        model.bytes_kv_per_block_per_gpu(opts.block_size, tp, opts.kv_dtype),
        opts.reserve_bytes(hw),
        hw.memory_bytes(),
    )
