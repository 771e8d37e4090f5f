"""KV pools of a pipelined replica: each stage's GPUs hold their layers' weights (1/tp of
them; a mixture of experts' sparse layers with all their experts) and the KV of their layers
only, so a block costs each stage its layers' share.

The replica holds as many blocks as its fullest stage allows (every block spans all layers),
and vLLM divides them evenly over its virtual engines (vllm/core/scheduler.py:
`num_gpu_blocks //= pipeline_parallel_size`), one per batch in flight."""

from __future__ import annotations

from ..engine.memory import MemoryOptions, MemoryPlan
from ..errors import InfersimError
from ..models.dtypes import lower_dtype_advice
from .placement import Placement


def stage_weight_bytes(model, placement: Placement, dtype: str) -> list[float]:
    """Weight bytes on one GPU of each stage: its dense and sparse layers (a sparse layer with all
    its experts) and the edges it holds."""
    tp = placement.tp
    eb = model.edge_bytes_per_element(dtype)
    dense, sparse = model.layer_weight_bytes_per_gpu(tp, dtype)
    head = (model.params_norm() + model.vocab_size * model.hidden_size) * eb / tp  # a tied head is a copy
    out = []
    for s, (n, m) in enumerate(zip(placement.layers, placement.sparse_layers(model))):
        w = (n - m) * dense + m * sparse
        if s == 0:
            w += model.params_embedding() * eb / tp
        if s == placement.pp - 1:
            w += head
        out.append(w)
    return out


def plan_pipeline_memory(
    model, hw, opts: MemoryOptions, placement: Placement, source: str = "workload"
) -> tuple[MemoryPlan, dict]:
    """The replica's pools and a per-stage account (weights, blocks that fit)."""
    per_layer_block = model.bytes_kv_per_block_per_gpu(opts.block_size, placement.tp, opts.kv_dtype) / model.num_layers
    weights = stage_weight_bytes(model, placement, opts.dtype)
    act = opts.activation_bytes(model)  # opts.tp is the placement's
    fits = []
    for s, (w, n) in enumerate(zip(weights, placement.layers)):
        blocks = int((opts.usable_bytes(hw) - w - act) // (n * per_layer_block))
        if blocks < placement.pp and opts.gpu_blocks is None:
            raise InfersimError(
                f"{source}: field 'hardware.pipeline_parallel': stage {s} of {placement.pp} ({n} layers, "
                f"{w / 1e9:.1f} GB of weights per GPU with tensor_parallel={placement.tp}) leaves no KV cache on "
                f"{opts.budget_label(hw)}; raise "
                f"hardware.pipeline_parallel or hardware.tensor_parallel{lower_dtype_advice(opts.dtype)}"
            )
        fits.append(blocks)
    gpu_blocks = opts.gpu_blocks if opts.gpu_blocks is not None else min(fits)
    widest = max(placement.layers) * per_layer_block
    cpu_blocks = opts.cpu_blocks if opts.cpu_blocks is not None else int(opts.swap_space_gb * 2**30 // widest)
    plan = MemoryPlan(
        int(gpu_blocks),
        int(cpu_blocks),
        widest,  # stages swap at once; the one with most layers sets the time
        max(weights),
        act,
        "explicit" if opts.gpu_blocks is not None else "derived",
        opts.reserve_bytes(hw),
        hw.memory_bytes(),
    )
    account = {
        "stage_weight_bytes_per_gpu": weights,
        "stage_gpu_blocks_fit": fits,
        "kv_bytes_per_block_per_stage": [n * per_layer_block for n in placement.layers],
    }
    return plan, account
