"""Serving with the KV cache offloaded to host memory: `executor/engine.py`'s continuous
batching loop (the simulator's scheduler objects, admission, recompute preemption, metrics)
with the forward pass replaced by `OffloadRunner` (runner.py) and the KV pool in host memory.

`execute` has `sim exec`'s signature and writes the same run directory as executor/run.py
(config.yaml, requests/series/summary, iterations.parquet, iteration_batches.parquet,
outputs.parquet), plus:

| file | what |
|---|---|
| offload_iterations.parquet | per iteration: bytes and tokens loaded and stored (per layer), measured load and store copy times |
| offload_layers.parquet | per iteration and layer: tokens loaded and stored (whole-token equivalents: per KV head / kv_heads) |
| offload_counts.parquet | per decoding sequence and layer: its context, the tokens loaded, and InfiniGen's predicted important-token count before the cap (NaN for other policies) |

The summary's `offload` entry holds the policy, its parameters, the overlap, the pool and the
totals (GB loaded and stored, copy seconds)."""

from __future__ import annotations

import time
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.collector import MetricsCollector
from infersim.simulator.metrics.rundir import staged_dir
from infersim.simulator.policies import build_scheduler

from .. import serving
from ..engine import Engine, ExecSequence
from ..kvcache import KVCacheConfig, PagedKVCache
from ..models import dtype_name, load_model
from ..options import ExecOptions
from ..prompts import make_prompts
from ..runner import plan_batch
from ..zoo.corpus import held_out_windows
from .model import DenseLlama
from .plan import check_offload_host, plan_offload_blocks
from .runner import OffloadRunner
from .skew import skew_matrices

OFFLOAD_COLUMNS = ("iteration", "loaded_bytes", "stored_bytes", "load_s", "store_s")


class HostKVPool(PagedKVCache):
    """The paged KV pool in host memory, pageable (plan.py says why); no second tier:
    preemption recomputes."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, config: KVCacheConfig):
        super().__init__(num_layers, num_kv_heads, head_dim, replace(config, cpu_blocks=0), "cpu")


class OffloadEngine(Engine):
    """Engine with the offloaded forward pass; per-iteration offload records besides the
    engine's own."""

    def __init__(
        self,
        model,
        scheduler,
        kv: KVCacheConfig,
        *,
        policy: str,
        params: dict | None = None,
        overlap: str = "none",
        skew=None,
        **kw,
    ):
        """kv: the host pool (gpu_blocks of them); the remaining `kw` as Engine takes them."""
        if kw.get("limits") is not None and kw["limits"].chunked_prefill:
            raise InfersimError("the offload executor prefills whole prompts: set serving.chunked_prefill: false")
        # the engine's own device pool is replaced below: keep it one block
        super().__init__(model, scheduler, replace(kv, gpu_blocks=1, cpu_blocks=0), **kw)
        self.cache = HostKVPool(
            self.runner.num_layers,
            self.runner.num_kv_heads,
            self.runner.head_dim,
            replace(self.kv_config, gpu_blocks=kv.gpu_blocks),
        )
        self.runner = OffloadRunner(model, self.cache, policy, params, overlap=overlap, skew=skew)
        self.offload_rows: list[tuple] = []
        self.counts: list[tuple] = []  # (iteration, context, layer, predicted count, loaded tokens)
        self.layer_rows: list[tuple] = []  # (iteration, layer, loaded tokens, stored tokens)

    def warmup(self, prompt_len: int = 32) -> None:
        """One prefill and one decode through the offloaded path (first-call overheads); no trace."""
        n = max(2, min(prompt_len, self.limits.max_model_len - 2))
        seq = ExecSequence(-1, [0] * n, 2, 0.0)
        self.cache.grow_to(seq, n + 1)
        for q in (n, 1):
            self.runner.begin([(seq, q)])
            self.runner.forward(plan_batch(self.cache, [(seq, q)], self.device), self.cache)
            seq.computed += q
            seq.tokens.append(0)
        self._sync()
        self.runner.release(seq.rid)
        self.cache.free(seq)

    def _run_batch(self, d, sched_s: float, moved: dict) -> None:
        it = self._iteration
        self.runner.begin(d.batch)
        super()._run_batch(d, sched_s, moved)  # synchronises (CUDA) before it returns
        self.runner.finish()
        r = self.runner.record
        self.offload_rows.append((it, r.loaded_bytes, r.stored_bytes, r.load_s, r.store_s))
        self.layer_rows.extend(
            (it, i, float(a), float(b)) for i, (a, b) in enumerate(zip(r.loaded_tokens, r.stored_tokens))
        )
        self.counts.extend((it, *row) for row in r.counts)

    def _finish(self, seq, now: float, aborted: bool = False) -> None:
        self.runner.release(seq.rid)
        super()._finish(seq, now, aborted=aborted)

    def tables(self) -> dict[str, dict[str, np.ndarray]]:
        o = np.array(self.offload_rows, dtype=np.float64).reshape(-1, len(OFFLOAD_COLUMNS))
        lr = np.array(self.layer_rows, dtype=np.float64).reshape(-1, 4)
        c = np.array(self.counts, dtype=np.float64).reshape(-1, 5)
        return {
            "offload_iterations": {
                "iteration": o[:, 0].astype(np.int64),
                "loaded_bytes": o[:, 1],
                "stored_bytes": o[:, 2],
                "load_s": o[:, 3],
                "store_s": o[:, 4],
            },
            "offload_layers": {
                "iteration": lr[:, 0].astype(np.int64),
                "layer": lr[:, 1].astype(np.int64),
                "loaded_tokens": lr[:, 2],
                "stored_tokens": lr[:, 3],
            },
            "offload_counts": {
                "iteration": c[:, 0].astype(np.int64),
                "context": c[:, 1].astype(np.int64),
                "layer": c[:, 2].astype(np.int64),
                "predicted": c[:, 3],
                "loaded": c[:, 4],
            },
        }


@lru_cache(maxsize=4)
def _skew_for(model_path: str, device: str, dtype: str):
    """InfiniGen's offline skewing matrices from a fixed sample of the zoo corpus's training
    files (never the served prompts), cached per model."""
    lm = load_model(model_path, device=device, dtype=dtype)
    sample = held_out_windows(lm.tokenizer, 4, 256, 0, split="train")
    return skew_matrices(DenseLlama(lm), sample.to(lm.device))


def _section(spec):
    off = getattr(spec, "offload", None)
    if off is None:
        raise InfersimError(f"workload {spec.name}: the offload executor needs an `offload:` section")
    key = {"flexgen": "full", "ideal": "gpu"}.get(off.policy, off.policy)
    if key not in ("full", "h2o", "infinigen"):
        # int4: executor/offload/policies.py quantizes and dequantizes in place (its accuracy), it
        # does not pack the cache, so the bytes copied would not be INT4's
        raise InfersimError(
            f"workload {spec.name}: offload.policy '{off.policy}' is not served by the offload "
            f"executor; it serves full (flexgen), h2o, infinigen"
        )
    if off.weights_gpu_percent < 100:
        raise InfersimError(
            f"workload {spec.name}: offload.weights_gpu_percent {off.weights_gpu_percent:g}: the "
            f"offload executor keeps all weights on the device"
        )
    return off, key


def execute(spec, requests, model: str, out: Path, opts: ExecOptions = ExecOptions()) -> dict:
    """Serve the requests with the KV cache in host memory under the workload's `offload:`
    policy; write a `sim exec` run directory at `out` atomically; return the summary."""
    off, policy = _section(spec)
    t_wall = time.perf_counter()
    lm = serving.load_served_model(requests, model, opts)
    sv = spec.serving
    if sv.chunked_prefill:
        raise InfersimError(
            f"workload {spec.name}: the offload executor prefills whole prompts: set " f"serving.chunked_prefill: false"
        )
    limits = serving.served_limits(sv, lm)  # without chunked prefill (refused above)
    max_len = limits.max_model_len
    # the host pool planned as the simulator plans it; refused whole if this host cannot hold it
    mem, plan = plan_offload_blocks(lm, sv, limits, off, device_memory_gb=opts.device_memory_gb, source=opts.source)
    check_offload_host(lm, mem, plan, serving.workload_blocks(requests, sv.block_size), opts.source)
    committed = serving.allocate_for(lm, mem, requests, sv.block_size, "offload", opts.source)
    skew = _skew_for(str(lm.path), str(lm.device), dtype_name(lm.dtype)) if policy == "infinigen" else None
    spec = serving.single_replica(spec, lm)
    with staged_dir(Path(out), command="exec", force=opts.force) as tmp:
        metrics = MetricsCollector(len(requests), series_path=tmp / "series.parquet")
        engine = OffloadEngine(
            lm,
            build_scheduler(sv.scheduler, "recompute"),
            KVCacheConfig.from_serving(sv, mem["gpu_blocks"], 0, lm.dtype, committed),
            policy=policy,
            params=off.params,
            overlap=off.overlap,
            skew=skew,
            limits=limits,
            metrics=metrics,
            realtime=opts.realtime,
        )
        engine.warmup()
        prompts = make_prompts(requests.prompt_tokens, tokenizer=lm.tokenizer, vocab_size=lm.vocab_size, seed=spec.seed)
        seqs: list[ExecSequence] = []
        truncated = 0
        if requests.closed_loop:
            raise InfersimError(f"workload {spec.name}: the offload executor replays open-loop arrivals only")
        for i, t in enumerate(requests.arrival_s):
            if requests.duration_s is not None and t > requests.duration_s:
                break
            p = prompts[i]
            o, cut = serving.clipped_output(len(p), requests.output_tokens[i], max_len)
            truncated += cut
            s = ExecSequence(i, p, o, float(t))
            seqs.append(s)
            engine.submit(s)
        end = serving.serve(engine, None if opts.quiet else len(seqs))
        memory = serving.memory_plan(mem)
        st = engine.stats
        tabs = engine.tables()
        oi = tabs["offload_iterations"]
        ex = serving.executor_record(
            lm, st, realtime=opts.realtime, t_wall=t_wall, truncated=truncated, swap_out_blocks=0, swap_in_blocks=0
        )
        offload = {
            "policy": policy,
            "params": dict(off.params),
            "overlap": off.overlap,
            "pool_blocks": int(mem["gpu_blocks"]),
            "pool_bound_by": plan.bound_by,
            "host_memory": True,
            "kv_loaded_gb": float(oi["loaded_bytes"].sum()) / 1e9,
            "kv_stored_gb": float(oi["stored_bytes"].sum()) / 1e9,
            "load_s": float(oi["load_s"].sum()),
            "store_s": float(oi["store_s"].sum()),
        }
        resolved = {**serving.resolved_config(spec, lm, mem, limits, len(seqs), ex), "offload_executor": offload}
        result = serving.run_result(spec, metrics, memory, end, resolved, {"executor": ex, "offload": offload})
        summary = serving.write_engine_run(tmp, result, engine, seqs, opts, tabs)
    return summary


__all__ = ["HostKVPool", "OffloadEngine", "execute"]
