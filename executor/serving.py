"""What every executor entry point (plain, speculative, offload) shares: the KV blocks a run
gets, serving to completion with a progress bar, and the records of its run directory
(config.yaml's resolved configuration, the summary's `executor` section, outputs.parquet)."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from infersim.simulator.errors import InfersimError
from infersim.simulator.machine import cpu_model
from infersim.simulator.progress import ProgressBar


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


def plan_blocks(lm, sv, limits, *, kv_dtype, device_memory_gb: float | None = None) -> dict:
    """Device and host KV blocks, as the simulator plans them (simulator/engine/memory.py):
    explicit serving.gpu_blocks / cpu_blocks win; otherwise the device memory (CUDA: the GPU's;
    CPU: --device-memory-gb, default 4 GiB) x gpu_memory_utilization, less the weights and
    the activation peak, over the bytes of a block; host blocks from swap_space_gb."""
    import torch

    from infersim.simulator.engine.memory import activation_peak_bytes

    cfg = lm.config
    runner_layers = getattr(cfg, "num_hidden_layers")
    heads = cfg.num_attention_heads
    kvh = getattr(cfg, "num_key_value_heads", None) or heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    elt = torch.empty((), dtype=kv_dtype).element_size()
    block_bytes = 2 * runner_layers * sv.block_size * kvh * hd * elt
    weights = lm.weight_bytes()
    source = "explicit"
    gpu_blocks = sv.gpu_blocks
    act = 0.0
    if gpu_blocks is None:
        source = "derived"
        if lm.device.type == "cuda":
            total = torch.cuda.get_device_properties(lm.device).total_memory
        else:
            total = (device_memory_gb or 4.0) * 2**30
        from types import SimpleNamespace

        inter = getattr(cfg, "intermediate_size", None) or getattr(cfg, "ffn_dim", 4 * cfg.hidden_size)
        shape = SimpleNamespace(hidden_size=cfg.hidden_size, intermediate_size=inter, vocab_size=cfg.vocab_size)
        act = activation_peak_bytes(
            shape, limits.max_batched_tokens, limits.max_batch_size, "fp32" if elt == 4 else "fp16", 1
        )
        gpu_blocks = int((total * sv.gpu_memory_utilization - weights - act) // block_bytes)
        if gpu_blocks <= 0:
            raise InfersimError(
                f"model {lm.name} ({weights / 1e9:.2f} GB of weights) leaves no KV blocks on {lm.device}"
            )
    cpu_blocks = sv.cpu_blocks if sv.cpu_blocks is not None else int(sv.swap_space_gb * 2**30 // block_bytes)
    return {
        "gpu_blocks": int(gpu_blocks),
        "cpu_blocks": int(cpu_blocks),
        "kv_bytes_per_block": float(block_bytes),
        "weight_bytes_per_gpu": float(weights),
        "activation_bytes_per_gpu": float(act),
        "blocks_source": source,
    }


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
    from infersim.simulator.models.catalog import load_model as load_spec

    try:
        s = load_spec(str(lm.path / "config.json")).summary(dtype)
    except InfersimError:
        s = {"name": lm.path.name, "family": lm.family}
    s.update(name=lm.name, path=str(lm.path), dtype_executed=str(lm.dtype).replace("torch.", ""))
    return s


def write_outputs(path: Path, seqs) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "rid": pa.array([s.rid for s in seqs], type=pa.int64()),
            "aborted": pa.array([s.aborted for s in seqs], type=pa.bool_()),
            "prompt_ids": pa.array([s.tokens[: s.prompt_len] for s in seqs], type=pa.list_(pa.int32())),
            "output_ids": pa.array([s.output_ids for s in seqs], type=pa.list_(pa.int32())),
        }
    )
    pq.write_table(table, str(path))
