"""What every executor entry point (plain, speculative, offload) shares: the KV blocks a run
gets, serving to completion with a progress bar, and the records of its run directory
(config.yaml's resolved configuration, the summary's `executor` section, outputs.parquet)."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq

from infersim.simulator.engine.memory import MemoryPlan, activation_peak_bytes, non_torch_reserve_bytes
from infersim.simulator.errors import InfersimError
from infersim.simulator.machine import cpu_model, host_available_bytes, host_memory_gb
from infersim.simulator.metrics.plots import plot_run
from infersim.simulator.metrics.rundir import write_table
from infersim.simulator.metrics.summary import write_result_files
from infersim.simulator.models.catalog import load_model as load_spec
from infersim.simulator.policies.state import SchedulerLimits
from infersim.simulator.progress import ProgressBar
from infersim.simulator.simulation import SimulationResult

from . import kv_memory


def device_description(dev) -> dict:
    import torch

    d = {
        "device": str(dev),
        "torch": str(torch.__version__),
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
    }
    if dev.type == "cuda":
        d["name"] = torch.cuda.get_device_name(dev)
        d["memory_bytes"] = torch.cuda.get_device_properties(dev).total_memory
    else:
        d["name"] = cpu_model()
        d["cores"] = os.cpu_count()
    return d


def load_served_model(requests, model: str, opts):
    """The model a run serves, once there is something to serve (ExecOptions `opts`)."""
    from .models import load_model

    if len(requests) == 0:
        raise InfersimError("the workload produced no requests")
    return load_model(model, device=opts.device, dtype=opts.dtype, log=opts.log)


def single_replica(spec, lm):
    """The workload as executed: the loaded checkpoint on one device (no replicas, no tensor
    parallelism), which is what config.yaml records."""
    return spec.model_copy(
        update={
            "model": str(lm.path),
            "hardware": spec.hardware.model_copy(update={"replicas": 1, "tensor_parallel": 1}),
        }
    )


def clipped_output(prompt_len: int, output_tokens: int, max_len: int) -> tuple[int, bool]:
    """A request's output length cut so that no position passes the model's maximum, and
    whether it was cut (at least one token is generated)."""
    o = int(output_tokens)
    cut = prompt_len < max_len and prompt_len + o > max_len
    if cut:
        o = max_len - prompt_len
    return max(1, o), cut


def served_limits(sv, lm) -> SchedulerLimits:
    """The scheduler's limits a workload's `serving:` section sets on the loaded model: the
    context cut at the model's positions; batched tokens by default 2,048 with chunked prefill,
    else the context or 2,048 if that is longer."""
    max_len = min(sv.max_model_len or lm.max_positions, lm.max_positions)
    max_batched = sv.max_batched_tokens or (2048 if sv.chunked_prefill else max(max_len, 2048))
    return SchedulerLimits(sv.max_batch_size, max_batched, max_len, sv.chunked_prefill)


def workload_blocks(requests, block_size: int) -> int:
    """The most KV blocks the requests can hold at once (kv_memory.workload_blocks): what a
    pool allocates up front, KVCacheConfig.committed_blocks."""
    return kv_memory.workload_blocks(requests.prompt_tokens, requests.output_tokens, block_size)


def _check_host_pools(device_type: str, gpu_blocks: int, cpu_blocks: int, block_bytes: int, source: str) -> None:
    """Refuse planned KV pools larger than this machine's memory: the host pool always lives
    there, and on cpu the device pool too (a workload that fills them writes every page)."""
    pool_bytes = (cpu_blocks + (gpu_blocks if device_type == "cpu" else 0)) * block_bytes
    total_bytes = host_memory_gb() * 1e9
    if pool_bytes > total_bytes:
        device = "--device-memory-gb, serving.gpu_blocks, " if device_type == "cpu" else ""
        raise InfersimError(
            f"{source}: the KV pools ({gpu_blocks:,} device and {cpu_blocks:,} host blocks: {pool_bytes / 1e9:,.3g} GB in "
            f"host memory) exceed this machine's {total_bytes / 1e9:.3g} GB; lower {device}"
            f"serving.swap_space_gb or serving.cpu_blocks"
        )


def kv_block_bytes(config, block_size: int, element_bytes: int) -> int:
    """K and V of one block over every layer of a Hugging Face config."""
    heads = config.num_attention_heads
    kvh = getattr(config, "num_key_value_heads", None) or heads
    hd = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * block_size * kvh * hd * element_bytes


def plan_pools(sv, budget: "DeviceBudget"):
    """plan_blocks' arithmetic on a device budget: (gpu_blocks, cpu_blocks, blocks_source).
    A derived device pool is vLLM's KV budget over a block: the usable memory less the weights
    and the activation peak."""
    gpu_blocks, blocks_source = sv.gpu_blocks, "explicit"
    if gpu_blocks is None:
        blocks_source = "derived"
        free = budget.usable_bytes(sv) - budget.weight_bytes - budget.act_bytes
        gpu_blocks = int(free // budget.block_bytes)
    cpu_blocks = sv.cpu_blocks if sv.cpu_blocks is not None else int(sv.swap_space_gb * 2**30 // budget.block_bytes)
    return int(gpu_blocks), int(cpu_blocks), blocks_source


@dataclass(frozen=True)
class DeviceBudget:
    """The loaded model's numbers the KV pools are planned from."""

    device_type: str  # "cuda" or "cpu"
    total_bytes: float  # a GPU's total_memory, or --device-memory-gb on cpu (default 4 GiB)
    block_bytes: int  # K and V of one block, every layer, in the KV dtype
    weight_bytes: float
    act_bytes: float  # the activation peak of the batch limits (0 when not asked for)

    def usable_bytes(self, sv) -> float:
        """What a `serving:` section lets the pools and weights use: the total x
        gpu_memory_utilization, less the non-torch reserve (a GPU's; none on a CPU)."""
        device = "gpu" if self.device_type == "cuda" else "cpu"
        return self.total_bytes * sv.gpu_memory_utilization - non_torch_reserve_bytes(device, sv.non_torch_reserve_gib)


def device_budget(lm, sv, limits, *, kv_dtype, device_memory_gb: float | None, activations: bool) -> DeviceBudget:
    """The device memory, block and weight sizes of a loaded model under a `serving:` section;
    the activation peak only when `activations` (a derived pool)."""
    import torch

    cfg = lm.config
    elt = torch.empty((), dtype=kv_dtype).element_size()
    if lm.device.type == "cuda":
        total = torch.cuda.get_device_properties(lm.device).total_memory
    else:
        total = (device_memory_gb or 4.0) * 2**30
    act = 0.0
    if activations:
        inter = getattr(cfg, "intermediate_size", None) or getattr(cfg, "ffn_dim", 4 * cfg.hidden_size)
        shape = SimpleNamespace(hidden_size=cfg.hidden_size, intermediate_size=inter, vocab_size=cfg.vocab_size)
        act = activation_peak_bytes(
            shape, limits.max_batched_tokens, limits.max_batch_size, "fp32" if elt == 4 else "fp16", 1
        )
    return DeviceBudget(lm.device.type, float(total), kv_block_bytes(cfg, sv.block_size, elt), lm.weight_bytes(), act)


def plan_blocks(lm, sv, limits, *, kv_dtype, device_memory_gb: float | None = None, source: str = "workload") -> dict:
    """Device and host KV blocks, as the simulator plans them (simulator/engine/memory.py):
    explicit serving.gpu_blocks / cpu_blocks win; otherwise the device memory (CUDA: the GPU's;
    CPU: --device-memory-gb, default 4 GiB) x gpu_memory_utilization, less the weights, the
    activation peak and the non-torch reserve (CUDA only), over the bytes of a block; host blocks
    from swap_space_gb. These are the pools' accounting; what is allocated is `pool_sizes`.
    The offload executor plans its host pool with executor/offload/plan.py instead."""
    b = device_budget(
        lm, sv, limits, kv_dtype=kv_dtype, device_memory_gb=device_memory_gb, activations=sv.gpu_blocks is None
    )
    gpu_blocks, cpu_blocks, blocks_source = plan_pools(sv, b)
    if gpu_blocks <= 0:
        raise InfersimError(
            f"model {lm.name} ({b.weight_bytes / 1e9:.2f} GB of weights) leaves no KV blocks on {lm.device}"
        )
    _check_host_pools(b.device_type, gpu_blocks, cpu_blocks, b.block_bytes, source)
    return {
        "gpu_blocks": gpu_blocks,
        "cpu_blocks": cpu_blocks,
        "kv_bytes_per_block": float(b.block_bytes),
        "weight_bytes_per_gpu": float(b.weight_bytes),
        "activation_bytes_per_gpu": float(b.act_bytes),
        "blocks_source": blocks_source,
    }


def device_free_bytes(dev) -> float | None:
    """Free memory on a GPU now (after the weights), None on a CPU."""
    if dev.type != "cuda":
        return None
    import torch

    return float(torch.cuda.mem_get_info(dev)[0])


def check_pools_fit(lm, sizes: list, source: str) -> None:
    """Refuse, before any pool is allocated, pools (kv_memory.PoolSizes) that the host's available
    memory or the GPU's free memory cannot hold."""
    kv_memory.check_pools_fit(
        sizes,
        host_available_bytes=host_available_bytes(),
        device_free_bytes=device_free_bytes(lm.device),
        source=source,
    )


def allocate_for(lm, mem: dict, requests, block_size: int, path: str, source: str) -> int:
    """The blocks each pool of plan_blocks' `mem` allocates up front for these requests on
    `path` (kv_memory.PATHS), refused first if they do not fit; recorded in `mem`
    (config.yaml's memory section). Returns the workload's bound (KVCacheConfig.committed_blocks)."""
    bound = workload_blocks(requests, block_size)
    sizes = kv_memory.pool_sizes(
        path,
        device_type=lm.device.type,
        gpu_blocks=mem["gpu_blocks"],
        cpu_blocks=mem["cpu_blocks"],
        workload=bound,
        block_bytes=int(mem["kv_bytes_per_block"]),
    )
    check_pools_fit(lm, [sizes], source)
    mem.update(
        allocated_device_blocks=sizes.device_blocks,
        allocated_host_blocks=sizes.host_blocks,
        allocated_device_bytes=float(sizes.device_memory_bytes),
        allocated_host_bytes=float(sizes.host_memory_bytes),
    )
    return bound


def serve(engine, total: int | None) -> float:
    """Run the engine to completion, with a progress bar over `total` requests (None: quiet);
    returns the last finish time on the engine clock."""
    with ProgressBar(
        "executing",
        quiet=total is None,
        total=total,
        fields="engine time {task.fields[t]:.1f} s",
        transient=True,
        t=0.0,
    ) as bar:
        if total is not None:
            prev = engine.on_finish

            def on_finish(seq, now):
                bar.update(completed=len(engine.finished), t=now)
                if prev is not None:
                    prev(seq, now)

            engine.on_finish = on_finish
        engine.run()
    return max((s.finish_s for s in engine.finished), default=0.0)


def executor_record(
    lm, stats, *, realtime: bool, t_wall: float, truncated: int, swap_out_blocks: int, swap_in_blocks: int
) -> dict:
    """The summary's `executor` section: what ran, on what, and where the wall time went."""
    import torch

    from .models import dtype_name

    return {
        "model": lm.name,
        "model_path": str(lm.path),
        "family": lm.family,
        "device": str(lm.device),
        "dtype": dtype_name(lm.dtype),
        "realtime": realtime,
        "wall_s": time.perf_counter() - t_wall,
        "forward_s": stats.forward_s,
        "schedule_s": stats.schedule_s,
        "swap_s": stats.swap_s,
        "swap_out_blocks": int(swap_out_blocks),
        "swap_in_blocks": int(swap_in_blocks),
        "outputs_truncated_to_max_model_len": truncated,
        "torch": str(torch.__version__),
        "threads": torch.get_num_threads(),
    }


def resolved_config(spec, lm, mem: dict, limits, num_requests: int, ex: dict) -> dict:
    """The run's resolved configuration (config.yaml), as a simulation writes it."""
    return {
        "workload": spec.model_dump(mode="json"),
        "model": model_summary(lm, spec.serving.dtype),
        "hardware": device_description(lm.device),
        "memory": mem,
        "limits": limits.__dict__,
        "step_mode": True,
        "num_requests": num_requests,
        "executor": {
            k: ex[k] for k in ("model", "model_path", "family", "device", "dtype", "realtime", "torch", "threads")
        },
    }


def model_summary(lm, dtype: str) -> dict:
    try:
        s = load_spec(str(lm.path / "config.json")).summary(dtype)
    except InfersimError:
        s = {"name": lm.path.name, "family": lm.family}
    s.update(name=lm.name, path=str(lm.path), dtype_executed=str(lm.dtype).replace("torch.", ""))
    return s


def memory_plan(mem: dict):
    """plan_blocks' dict as the simulator's MemoryPlan (summary.json's memory section)."""
    keys = ("gpu_blocks", "cpu_blocks", "kv_bytes_per_block", "weight_bytes_per_gpu", "activation_bytes_per_gpu")
    return MemoryPlan(*(mem[k] for k in keys), mem["blocks_source"])


def run_result(spec, metrics, memory, end_s: float, resolved: dict, sections: dict):
    """A real run as the simulator's SimulationResult (its series closed), so that its summary
    and tables are written exactly as a simulation's; `sections`: the summary's extra sections."""
    series = metrics.close_series()
    return SimulationResult(spec, metrics.requests_table(), series, metrics, memory, float(end_s), resolved, sections)


def write_engine_run(tmp: Path, result, engine, seqs, opts, tables: dict | None = None) -> dict:
    """The run folder of an engine run (plain or offload): the simulator's result files, the
    iteration tables, any further `tables` (name -> table), the outputs and the plots;
    returns the summary."""
    summary = write_result_files(tmp, result, csv=opts.csv)
    write_table(tmp / "iterations.parquet", engine.stats.iteration_table())
    write_table(tmp / "iteration_batches.parquet", engine.stats.batch_table())
    for name, table in (tables or {}).items():
        write_table(tmp / f"{name}.parquet", table)
    write_outputs(tmp / "outputs.parquet", sorted(seqs, key=lambda s: s.rid))
    if opts.plots:
        plot_run(tmp)
    return summary


def write_outputs(path: Path, seqs) -> None:
    table = pa.table(
        {
            "rid": pa.array([s.rid for s in seqs], type=pa.int64()),
            "aborted": pa.array([s.aborted for s in seqs], type=pa.bool_()),
            "prompt_ids": pa.array([s.tokens[: s.prompt_len] for s in seqs], type=pa.list_(pa.int32())),
            "output_ids": pa.array([s.output_ids for s in seqs], type=pa.list_(pa.int32())),
        }
    )
    pq.write_table(table, str(path))
