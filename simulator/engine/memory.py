"""How many KV blocks fit: the card's memory as the driver reports it x utilisation, less the
weights, the activation peak of the largest iteration (as vLLM's profiling run finds it) and the
memory the engine's process holds outside torch's allocator, over the bytes of a block."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InfersimError
from ..hardware.profile import HardwareProfile
from ..models.dtypes import bytes_per_element, compute_dtype_for, lower_dtype_advice
from ..models.spec import ModelSpec

# Memory a vLLM worker allocates outside torch's caching allocator while it profiles (cuBLAS
# workspaces, NCCL and custom all-reduce buffers), GiB per GPU: its log's `non_torch_memory`.
# Measured since vLLM counts torch's reserved, not allocated, bytes as torch's
# (https://github.com/vllm-project/vllm/pull/11809): 0.16 GiB at TP 1 on an H100
# (https://github.com/vllm-project/vllm/pull/12126), 0.25 GiB at TP 2 on RTX 4090s
# (https://github.com/vllm-project/vllm/issues/13061), 0.20 GiB per worker of a TP group of 24 GB
# cards (https://github.com/vllm-project/vllm/pull/14447). No trend with TP shows, so every TP
# degree takes the largest, 0.25 GiB. The CUDA context is not in it: vLLM's baseline is taken after
# the context exists (https://github.com/vllm-project/vllm/issues/12059).
VLLM_NON_TORCH_RESERVE_GIB = 0.25


def non_torch_reserve_bytes(device: str, reserve_gib: float | None) -> float:
    """The non-torch memory one device ("gpu" or "cpu") keeps out of the KV budget: the user's
    serving.non_torch_reserve_gib, else vLLM's measured value on a GPU and none on a CPU."""
    if reserve_gib is None:
        reserve_gib = 0.0 if device == "cpu" else VLLM_NON_TORCH_RESERVE_GIB
    return reserve_gib * 2**30


@dataclass(frozen=True)
class MemoryPlan:
    gpu_blocks: int
    cpu_blocks: int
    kv_bytes_per_block: float  # per GPU (a block's KV heads split over the TP group, replicated past kv_heads)
    weight_bytes_per_gpu: float
    activation_bytes_per_gpu: float
    source: str  # "explicit" or "derived"
    non_torch_reserve_bytes: float = 0.0  # per GPU, kept out of the KV budget
    memory_bytes_per_gpu: float = 0.0  # the card's total the budget starts from (driver-visible where measured)


def activation_peak_bytes(
    model: ModelSpec, max_batched_tokens: int, max_batch_size: int, act_dtype: str, tp: int
) -> float:
    """Rough peak of live activations in one forward: the hidden state and the MLP's
    intermediate for every batched token, plus fp32 logits for every sequence."""
    ab = bytes_per_element(act_dtype)
    per_token = (4 * model.hidden_size + 2 * model.intermediate_size / tp) * ab
    return max_batched_tokens * per_token + max_batch_size * model.vocab_size * 4.0


@dataclass(frozen=True)
class MemoryOptions:
    """What sizes the KV pools besides the model and the hardware: the serving section's
    fields, resolved (dtypes normalised, tensor parallelism checked)."""

    block_size: int
    dtype: str  # of the weights
    kv_dtype: str
    tp: int
    gpu_memory_utilization: float
    swap_space_gb: float
    max_batched_tokens: int
    max_batch_size: int
    gpu_blocks: int | None = None  # a fixed GPU pool instead of the one the memory budget gives
    cpu_blocks: int | None = None  # a fixed host pool instead of swap_space_gb's
    max_model_len: int | None = None  # the longest sequence served: a derived pool must hold one
    non_torch_reserve_gib: float | None = None  # serving.non_torch_reserve_gib; None: the engine's default
    # a split that is not 1/tp of everything (data-parallel attention: experts sharded, the rest whole)
    weight_bytes_per_gpu: float | None = None

    def reserve_bytes(self, hw: HardwareProfile) -> float:
        """The non-torch reserve one GPU of `hw` keeps out of the budget."""
        return non_torch_reserve_bytes(hw.device, self.non_torch_reserve_gib)

    def usable_bytes(self, hw: HardwareProfile) -> float:
        """What one GPU gives the weights, activations and KV cache: its memory x utilisation,
        less the non-torch reserve."""
        return hw.memory_bytes() * self.gpu_memory_utilization - self.reserve_bytes(hw)

    def budget_terms(self, hw: HardwareProfile) -> str:
        """The budget as messages name it: total, share and reserve."""
        reserve = self.reserve_bytes(hw)
        less = f", less {reserve / 2**30:.2f} GiB non-torch" if reserve else ""
        return f"{hw.memory_label()} x {self.gpu_memory_utilization}{less}"

    def budget_label(self, hw: HardwareProfile) -> str:
        return f"'{hw.name}' ({self.budget_terms(hw)})"

    def activation_bytes(self, model: ModelSpec) -> float:
        """The activation peak per GPU, in the dtype the cost model computes in (16 bits under
        int8, int4 and FP8 weights)."""
        act_dtype = compute_dtype_for(self.dtype)
        return activation_peak_bytes(model, self.max_batched_tokens, self.max_batch_size, act_dtype, self.tp)


def _no_kv_cache_reason(
    model: ModelSpec, hw: HardwareProfile, opts: MemoryOptions, weights: float, act: float, block_bytes: float
) -> str:
    """Why not one KV block fits, naming what to change: the weights alone, the activation peak
    of the batch limits beside them, or a block larger than what is left."""
    where = opts.budget_label(hw)
    usable = opts.usable_bytes(hw)
    if weights >= usable and weights < hw.memory_bytes():  # the card holds them: the share given is too small
        return (
            f"field 'serving.gpu_memory_utilization': model '{model.name}' ({weights / 1e9:.1f} GB of weights per GPU "
            f"in {opts.dtype}) does not fit in {where}; raise serving.gpu_memory_utilization or "
            f"hardware.tensor_parallel{lower_dtype_advice(opts.dtype)}"
        )
    if weights >= usable:
        return (
            f"model '{model.name}' ({weights / 1e9:.1f} GB of weights per GPU in {opts.dtype}) does not fit on "
            f"{where} with tensor_parallel={opts.tp}; raise hardware.tensor_parallel or "
            f"hardware.pipeline_parallel{lower_dtype_advice(opts.dtype)}"
        )
    if weights + act >= usable:
        logits = opts.max_batch_size * model.vocab_size * 4.0  # activation_peak_bytes's per-sequence part
        field = "serving.max_batch_size" if logits >= act - logits else "serving.max_batched_tokens"
        return (
            f"field '{field}': the activation peak of {opts.max_batch_size:,} sequences and "
            f"{opts.max_batched_tokens:,} batched tokens ({act / 1e9:,.3g} GB) beside {weights / 1e9:.1f} GB of "
            f"weights leaves no KV cache on {where}; lower serving.max_batch_size or serving.max_batched_tokens, "
            f"or raise hardware.tensor_parallel"
        )
    return (
        f"field 'serving.block_size': one KV block of {opts.block_size:,} tokens ({block_bytes / 1e9:,.3g} GB) is "
        f"larger than the {(usable - weights - act) / 1e9:.3g} GB left on {where} after the weights and "
        f"activations; lower serving.block_size"
    )


def _check_explicit_pool(
    model: ModelSpec, hw: HardwareProfile, opts: MemoryOptions, weights: float, block_bytes: float, source: str
) -> None:
    """A fixed GPU pool (serving.gpu_blocks, as the papers' setups give it) replaces the memory
    budget, so its size is the user's what-if (an unbounded prefix cache is one); weights that
    do not fit on the card are not: such a deployment cannot run at all, and is refused."""
    if weights >= opts.usable_bytes(hw):
        raise InfersimError(f"{source}: {_no_kv_cache_reason(model, hw, opts, weights, 0.0, block_bytes)}")


def _check_holds_one_sequence(
    model: ModelSpec, hw: HardwareProfile, opts: MemoryOptions, gpu_blocks: int, weights: float, source: str
) -> None:
    """A pool the memory budget gives must hold one sequence of max_model_len tokens: vLLM
    refuses to start otherwise, and such a deployment would abort every long request."""
    tokens = gpu_blocks * opts.block_size
    if opts.max_model_len is None or tokens >= opts.max_model_len:
        return
    raise InfersimError(
        f"{source}: field 'serving.max_model_len': the KV pool of '{hw.name}' ({opts.budget_terms(hw)}, "
        f"less {weights / 1e9:.1f} GB of {model.name} weights per GPU at "
        f"tensor_parallel={opts.tp}) holds {tokens:,} tokens, fewer than max_model_len {opts.max_model_len:,}; "
        f"raise hardware.tensor_parallel or serving.gpu_memory_utilization, or lower serving.max_model_len"
    )


def plan_memory(model: ModelSpec, hw: HardwareProfile, opts: MemoryOptions, source: str = "workload") -> MemoryPlan:
    block_size, dtype, kv_dtype, tp = opts.block_size, opts.dtype, opts.kv_dtype, opts.tp
    gpu_blocks, cpu_blocks = opts.gpu_blocks, opts.cpu_blocks
    explicit = gpu_blocks is not None
    block_bytes = model.bytes_kv_per_block_per_gpu(block_size, tp, kv_dtype)
    weights = model.weight_bytes_per_gpu(tp, dtype) if opts.weight_bytes_per_gpu is None else opts.weight_bytes_per_gpu
    act = opts.activation_bytes(model)
    if gpu_blocks is None:
        budget = opts.usable_bytes(hw) - weights - act
        gpu_blocks = int(budget // block_bytes)
        if gpu_blocks <= 0:
            raise InfersimError(f"{source}: {_no_kv_cache_reason(model, hw, opts, weights, act, block_bytes)}")
        _check_holds_one_sequence(model, hw, opts, gpu_blocks, weights, source)
    else:
        _check_explicit_pool(model, hw, opts, weights, block_bytes, source)
    if cpu_blocks is None:
        cpu_blocks = int(opts.swap_space_gb * 2**30 // block_bytes)
    return MemoryPlan(
        int(gpu_blocks),
        int(cpu_blocks),
        block_bytes,
        weights,
        act,
        "explicit" if explicit else "derived",
        opts.reserve_bytes(hw),
        hw.memory_bytes(),
    )
