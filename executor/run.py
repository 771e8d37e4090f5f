"""`sim exec`: serve a workload's requests on a real model and write a run directory in the
format of `sim run` (config.yaml, requests.parquet, series.parquet, summary.json, plots/),
plus what only a real run has:

| file | what |
|---|---|
| iterations.parquet | one row per engine iteration: start/end on the engine clock, measured forward, scheduling and swap times, batch composition (prefill and decode sequences and tokens, cached context), KV blocks, queues, admissions, preemptions, blocks swapped |
| iteration_batches.parquet | one row per (iteration, sequence): query tokens, cached context tokens, whether it produced a token: the exact BatchShape of every iteration, for calibration |
| outputs.parquet | one row per request: prompt and generated token ids |
"""
from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from infersim.simulator.errors import InfersimError
from infersim.simulator.machine import cpu_model


def _device_description(dev) -> dict:
    import torch

    d = {"device": str(dev), "torch": str(torch.__version__), "threads": torch.get_num_threads(),
         "machine": platform.machine()}
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
        act = activation_peak_bytes(shape, limits.max_batched_tokens, limits.max_batch_size, "fp32" if elt == 4 else "fp16", 1)
        gpu_blocks = int((total * sv.gpu_memory_utilization - weights - act) // block_bytes)
        if gpu_blocks <= 0:
            raise InfersimError(f"model {lm.name} ({weights / 1e9:.2f} GB of weights) leaves no KV blocks on {lm.device}")
    cpu_blocks = sv.cpu_blocks if sv.cpu_blocks is not None else int(sv.swap_space_gb * 2**30 // block_bytes)
    return {"gpu_blocks": int(gpu_blocks), "cpu_blocks": int(cpu_blocks), "kv_bytes_per_block": float(block_bytes),
            "weight_bytes_per_gpu": float(weights), "activation_bytes_per_gpu": float(act), "blocks_source": source}


def serve(engine, total: int | None) -> float:
    """Run the engine to completion, with a progress bar over `total` requests (None: quiet);
    returns the last finish time on the engine clock."""
    progress = None if total is None else _Progress(total)
    if progress is not None:
        prev = engine.on_finish

        def on_finish(seq, now):
            progress.update(len(engine.finished), now)
            if prev is not None:
                prev(seq, now)

        engine.on_finish = on_finish
    try:
        engine.run()
    finally:
        if progress is not None:
            progress.close()
    return max((s.finish_s for s in engine.finished), default=0.0)


def executor_record(lm, stats, *, realtime: bool, t_wall: float, truncated: int, swap_out_blocks: int,
                    swap_in_blocks: int) -> dict:
    """The summary's `executor` section: what ran, on what, and where the wall time went."""
    import torch

    from .models import dtype_name

    return {"model": lm.name, "model_path": str(lm.path), "family": lm.family, "device": str(lm.device),
            "dtype": dtype_name(lm.dtype), "realtime": realtime, "wall_s": time.perf_counter() - t_wall,
            "forward_s": stats.forward_s, "schedule_s": stats.schedule_s, "swap_s": stats.swap_s,
            "swap_out_blocks": int(swap_out_blocks), "swap_in_blocks": int(swap_in_blocks),
            "outputs_truncated_to_max_model_len": truncated, "torch": str(torch.__version__),
            "threads": torch.get_num_threads()}


def resolved_config(spec, lm, mem: dict, limits, num_requests: int, ex: dict) -> dict:
    """The run's resolved configuration (config.yaml), as a simulation writes it."""
    return {"workload": spec.model_dump(mode="json"), "model": _model_summary(lm, spec.serving.dtype),
            "hardware": _device_description(lm.device), "memory": mem, "limits": limits.__dict__,
            "step_mode": True, "num_requests": num_requests,
            "executor": {k: ex[k] for k in ("model", "model_path", "family", "device", "dtype", "realtime", "torch",
                                            "threads")}}


def execute(spec, requests, model: str, out: Path, *, device: str | None = "cpu", dtype: str | None = None,
            realtime: bool = True, plots: bool = True, csv: bool = False, quiet: bool = True,
            device_memory_gb: float | None = None, source: str = "workload", log=None) -> dict:
    """Serve the requests on the model and write the run directory atomically; returns the summary."""
    if getattr(spec, "speculation", None) is not None:
        # a `speculation:` section: the speculative engine (executor/speculative/engine.py)
        from .speculative.engine import execute_speculative

        return execute_speculative(spec, requests, model, out, device=device, dtype=dtype, realtime=realtime,
                                   plots=plots, csv=csv, quiet=quiet, log=log)
    if getattr(spec, "offload", None) is not None:
        # an `offload:` section: the KV cache in host memory under the policy (executor/offload/serve.py)
        from .offload.serve import execute as execute_offload

        return execute_offload(spec, requests, model, out, device=device, dtype=dtype, realtime=realtime,
                               plots=plots, quiet=quiet, csv=csv, device_memory_gb=device_memory_gb, log=log)
    from infersim.simulator.engine.memory import MemoryPlan
    from infersim.simulator.engine.simulation import SimulationResult
    from infersim.simulator.metrics.collector import MetricsCollector
    from infersim.simulator.metrics.rundir import staged_dir, write_table
    from infersim.simulator.metrics.summary import write_result_files
    from infersim.simulator.policies import SchedulerLimits, build_scheduler

    from .engine import Engine, ExecSequence
    from .models import load_model
    from .prompts import make_prompts

    t_wall = time.perf_counter()
    if len(requests) == 0:
        raise InfersimError("the workload produced no requests")
    lm = load_model(model, device=device, dtype=dtype, log=log)
    sv = spec.serving
    max_len = min(sv.max_model_len or lm.max_positions, lm.max_positions)
    max_batched = sv.max_batched_tokens or (2048 if sv.chunked_prefill else max(max_len, 2048))
    limits = SchedulerLimits(sv.max_batch_size, max_batched, max_len, sv.chunked_prefill)
    kv_dtype = lm.dtype
    mem = plan_blocks(lm, sv, limits, kv_dtype=kv_dtype, device_memory_gb=device_memory_gb)
    spec = spec.model_copy(update={"model": str(lm.path),
                                   "hardware": spec.hardware.model_copy(update={"replicas": 1, "tensor_parallel": 1})})
    out = Path(out)
    with staged_dir(out) as tmp:
        metrics = MetricsCollector(len(requests), series_path=tmp / "series.parquet")
        engine = Engine(lm, build_scheduler(sv.scheduler, sv.preemption), gpu_blocks=mem["gpu_blocks"],
                        cpu_blocks=mem["cpu_blocks"], block_size=sv.block_size, watermark=sv.watermark, limits=limits,
                        metrics=metrics, realtime=realtime, kv_dtype=kv_dtype)
        engine.warmup()
        prompts = make_prompts(requests.prompt_tokens, tokenizer=lm.tokenizer, vocab_size=lm.vocab_size, seed=spec.seed)
        truncated = 0
        seqs: list[ExecSequence] = []

        def new_seq(i: int, arrival: float, client: int = -1) -> ExecSequence:
            nonlocal truncated
            p = prompts[i]
            o = int(requests.output_tokens[i])
            if len(p) < max_len and len(p) + o > max_len:
                o = max_len - len(p)  # no position past the model's maximum
                truncated += 1
            s = ExecSequence(i, p, max(1, o), arrival, client)
            seqs.append(s)
            return s

        if requests.closed_loop:
            state = {"next": 0}

            def start_client(client: int, at: float) -> None:
                if state["next"] >= len(requests):
                    return
                if requests.duration_s is not None and at > requests.duration_s:
                    return
                i = state["next"]
                state["next"] += 1
                engine.submit(new_seq(i, at, client))

            engine.on_finish = lambda seq, now: start_client(seq.client, now + requests.think_time_s) \
                if seq.client >= 0 else None
            for c in range(requests.closed_loop_clients):
                start_client(c, 0.0)
        else:
            for i, t in enumerate(requests.arrival_s):
                if requests.duration_s is not None and t > requests.duration_s:
                    break
                engine.submit(new_seq(i, float(t)))
        end = serve(engine, None if quiet else (len(seqs) if not requests.closed_loop else len(requests)))
        series = metrics.close_series()
        memory = MemoryPlan(mem["gpu_blocks"], mem["cpu_blocks"], mem["kv_bytes_per_block"],
                            mem["weight_bytes_per_gpu"], mem["activation_bytes_per_gpu"], mem["blocks_source"])
        st = engine.stats
        ex = executor_record(lm, st, realtime=realtime, t_wall=t_wall, truncated=truncated,
                             swap_out_blocks=engine.counters["swap_out_blocks"],
                             swap_in_blocks=engine.counters["swap_in_blocks"])
        ex["cost_model_fit"] = {"fixed_s": engine.cost_model.fixed_s, "per_token_s": engine.cost_model.per_token_s,
                                "bandwidth_bytes_per_s": dict(engine.cost_model.bandwidth)}
        if lm.meta:
            ex["zoo"] = {k: lm.meta.get(k) for k in ("heldout_perplexity", "weights_sha256", "corpus_sha256")}
        resolved = resolved_config(spec, lm, mem, limits, len(seqs), ex)
        result = SimulationResult(spec, metrics.requests_table(), series, metrics, memory, float(end), resolved,
                                  {"executor": ex})
        summary = write_result_files(tmp, result, csv=csv)
        write_table(tmp / "iterations.parquet", st.iteration_table())
        write_table(tmp / "iteration_batches.parquet", st.batch_table())
        _write_outputs(tmp / "outputs.parquet", sorted(seqs, key=lambda s: s.rid))
        if plots:
            from infersim.simulator.metrics.plots import plot_run

            plot_run(tmp)
    return summary


def _model_summary(lm, dtype: str) -> dict:
    from infersim.simulator.models.catalog import load_model as load_spec

    try:
        s = load_spec(str(lm.path / "config.json")).summary(dtype)
    except InfersimError:
        s = {"name": lm.path.name, "family": lm.family}
    s.update(name=lm.name, path=str(lm.path), dtype_executed=str(lm.dtype).replace("torch.", ""))
    return s


def _write_outputs(path: Path, seqs) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "rid": pa.array([s.rid for s in seqs], type=pa.int64()),
        "aborted": pa.array([s.aborted for s in seqs], type=pa.bool_()),
        "prompt_ids": pa.array([s.tokens[:s.prompt_len] for s in seqs], type=pa.list_(pa.int32())),
        "output_ids": pa.array([s.output_ids for s in seqs], type=pa.list_(pa.int32())),
    })
    pq.write_table(table, str(path))


class _Progress:
    def __init__(self, total: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._p = Progress(TextColumn("executing"), BarColumn(), MofNCompleteColumn(),
                           TextColumn("engine time {task.fields[t]:.1f} s"), TimeElapsedColumn(), transient=True)
        self._p.__enter__()
        self._task = self._p.add_task("exec", total=total, t=0.0)

    def update(self, done: int, now: float) -> None:
        self._p.update(self._task, completed=done, t=now)

    def close(self) -> None:
        self._p.__exit__(None, None, None)
