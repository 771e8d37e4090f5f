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
    block_size, dtype, kv_dtype, tp = opts.block_size, opts.dtype, opts.kv_dtype, opts.tp
    frac = section.weights_gpu_percent / 100.0
    weights = model.weight_bytes_per_gpu(tp, dtype)
    w_gpu, w_cpu = frac * weights, (1.0 - frac) * weights
    act = opts.activation_bytes(model)
    stream_buf = 2.0 * (1.0 - frac) * weights / model.num_layers
    gpu_free = opts.usable_bytes(hw) - w_gpu - act - policy.gpu_fixed_bytes() / tp - stream_buf
    cpu_pool = section.cpu_memory_gb * 1e9 * section.cpu_memory_utilization - w_cpu
    kv_share = model.kv_heads_per_gpu(tp) / model.kv_heads  # 1/tp, more where KV heads replicate
    gpu_tok = policy.gpu_bytes_per_token() * kv_share
    cpu_tok = policy.cpu_bytes_per_token() * kv_share
    kv_block = model.bytes_kv_per_block_per_gpu(block_size, tp, kv_dtype)
    if gpu_free <= 0:
        raise InfersimError(
            f"{source}: model '{model.name}' ({w_gpu / 1e9:.1f} GB of weights on the GPU at weights_gpu_percent="
            f"{section.weights_gpu_percent:g}) leaves no GPU memory on "
            f"{opts.budget_label(hw)}; lower offload.weights_gpu_percent"
        )
    if not policy.kv_on_gpu and cpu_pool <= 0:
        raise InfersimError(
            f"{source}: no CPU memory left for the KV pool ({section.cpu_memory_gb:g} GB x "
            f"{section.cpu_memory_utilization} less {w_cpu / 1e9:.1f} GB of CPU weights)"
        )
    gpu_tokens = gpu_free / gpu_tok if gpu_tok > 0 else float("inf")
    cpu_tokens = cpu_pool / cpu_tok if cpu_tok > 0 else float("inf")
    if section.pool_blocks is not None:
        blocks, bound = int(section.pool_blocks), "explicit"
    else:
        tokens = min(gpu_tokens, cpu_tokens)
        blocks, bound = int(tokens // block_size), ("gpu" if gpu_tokens <= cpu_tokens else "cpu")
    if blocks <= 0:
        raise InfersimError(f"{source}: the offload memory plan leaves no KV blocks ({bound}-bound)")
    reserve = opts.reserve_bytes(hw)
    return OffloadMemoryPlan(
        blocks,
        block_size,
        bound,
        cpu_pool,
        gpu_free,
        cpu_tok,
        gpu_tok,
        w_gpu,
        w_cpu,
        act,
        kv_block,
        reserve,
        hw.memory_bytes(),
    )
