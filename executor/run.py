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

import time
from pathlib import Path

from infersim.simulator.engine.prefix_blocks import prefix_cache_counters
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.collector import MetricsCollector
from infersim.simulator.metrics.rundir import staged_dir
from infersim.simulator.policies import build_scheduler
from infersim.simulator.workload.schema import ServingSection

from . import medusa  # noqa: F401  (registers Medusa's decoder with the speculative engine)
from .engine import Engine, ExecSequence, generate
from .kvcache import KVCacheConfig
from .offload.serve import execute as execute_offload
from .options import ExecOptions
from .prompts import make_prompts
from .serving import (
    allocate_for,
    clipped_output,
    executor_record,
    load_served_model,
    memory_plan,
    plan_blocks,
    resolved_config,
    run_result,
    serve,
    served_limits,
    single_replica,
    write_engine_run,
)
from .speculative.engine import execute_speculative


def check_engine_features(spec, source: str) -> None:
    """Prefix caching runs on the plain engine only: refuse it beside speculation or offload."""
    if spec.serving.prefix_caching and (spec.speculation is not None or spec.offload is not None):
        raise InfersimError(
            f"{source}: serving.prefix_caching runs on the plain engine only, not with a "
            f"{'speculation' if spec.speculation is not None else 'offload'} section"
        )


def execute(spec, requests, model: str, out: Path, opts: ExecOptions = ExecOptions()) -> dict:
    """Serve the requests on the model and write the run directory atomically; returns the summary.
    Refuses, before any work, settings the engines cannot serve together (naming `opts.source`)."""
    check_engine_features(spec, opts.source)
    if getattr(spec, "speculation", None) is not None:
        # a `speculation:` section: the speculative engine (executor/speculative/engine.py)
        return execute_speculative(spec, requests, model, out, opts)
    if getattr(spec, "offload", None) is not None:
        # an `offload:` section: the KV cache in host memory under the policy (executor/offload/serve.py)
        return execute_offload(spec, requests, model, out, opts)

    t_wall = time.perf_counter()
    lm = load_served_model(requests, model, opts)
    sv = spec.serving
    limits = served_limits(sv, lm)
    max_len = limits.max_model_len
    kv_dtype = lm.dtype
    mem = plan_blocks(lm, sv, limits, kv_dtype=kv_dtype, device_memory_gb=opts.device_memory_gb, source=opts.source)
    committed = allocate_for(lm, mem, requests, sv.block_size, "engine", opts.source)
    spec = single_replica(spec, lm)
    with staged_dir(Path(out), command="exec", force=opts.force) as tmp:
        metrics = MetricsCollector(len(requests), series_path=tmp / "series.parquet")
        engine = Engine(
            lm,
            build_scheduler(sv.scheduler, sv.preemption),
            KVCacheConfig.from_serving(sv, mem["gpu_blocks"], mem["cpu_blocks"], kv_dtype, committed),
            limits=limits,
            metrics=metrics,
            realtime=opts.realtime,
        )
        engine.warmup()
        # a workload with token identity (requests.sharing, a trace's hash ids) gets prompts that
        # share tokens where it says, with prefix caching on or off; a conversation's turns hold
        # the model's own replies to the turns before (prompts.conversation_prompts)
        prompts = make_prompts(
            requests.prompt_tokens,
            tokenizer=lm.tokenizer,
            vocab_size=lm.vocab_size,
            seed=spec.seed,
            prefix=requests.prefix,
            outputs=[int(o) for o in requests.output_tokens],
            reply=lambda ps, outs: greedy_replies(lm, ps, outs, limits),
        )
        truncated = 0
        seqs: list[ExecSequence] = []

        def new_seq(i: int, arrival: float, client: int = -1) -> ExecSequence:
            nonlocal truncated
            p = prompts[i]
            o, cut = clipped_output(len(p), requests.output_tokens[i], max_len)
            truncated += cut
            s = engine.sequence_class(i, p, o, arrival, client)
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

            engine.on_finish = (
                lambda seq, now: start_client(seq.client, now + requests.think_time_s) if seq.client >= 0 else None
            )
            for c in range(requests.closed_loop_clients):
                start_client(c, 0.0)
        else:
            for i, t in enumerate(requests.arrival_s):
                if requests.duration_s is not None and t > requests.duration_s:
                    break
                engine.submit(new_seq(i, float(t)))
        end = serve(engine, None if opts.quiet else (len(seqs) if not requests.closed_loop else len(requests)))
        memory = memory_plan(mem)
        st = engine.stats
        ex = executor_record(
            lm,
            st,
            realtime=opts.realtime,
            t_wall=t_wall,
            truncated=truncated,
            swap_out_blocks=engine.counters["swap_out_blocks"],
            swap_in_blocks=engine.counters["swap_in_blocks"],
        )
        ex["cost_model_fit"] = {
            "fixed_s": engine.cost_model.fixed_s,
            "per_token_s": engine.cost_model.per_token_s,
            "bandwidth_bytes_per_s": dict(engine.cost_model.bandwidth),
        }
        if lm.meta:
            ex["zoo"] = {k: lm.meta.get(k) for k in ("heldout_perplexity", "weights_sha256", "corpus_sha256")}
        resolved = resolved_config(spec, lm, mem, limits, len(seqs), ex)
        sections = {"executor": ex}
        if sv.prefix_caching:
            sections["prefix_cache"] = prefix_cache_counters([engine.kv])
        result = run_result(spec, metrics, memory, end, resolved, sections)
        summary = write_engine_run(tmp, result, engine, seqs, opts)
    return summary


def greedy_replies(lm, prompts: list[list[int]], outputs: list[int], limits) -> list[list[int] | None]:
    """The model's greedy outputs (as served: cut at the maximum position) for the prompts that
    fit, None for those the engine would abort; for conversation turns built before serving."""
    max_len = limits.max_model_len
    fit = [k for k, p in enumerate(prompts) if len(p) < max_len]
    out: list[list[int] | None] = [None] * len(prompts)
    if fit:
        got, _ = generate(
            lm,
            [prompts[k] for k in fit],
            [clipped_output(len(prompts[k]), outputs[k], max_len)[0] for k in fit],
            ServingSection(max_batch_size=limits.max_batch_size),
        )
        for k, g in zip(fit, got):
            out[k] = g
    return out
