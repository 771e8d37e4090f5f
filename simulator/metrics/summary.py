"""Per-request derived metrics and the run summary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .collector import REQUEST_BOOL_COLUMNS, REQUEST_INT_COLUMNS
from .rundir import write_json, write_table, write_yaml

PERCENTILES = (50, 90, 99)

# The flattened names (`ttft_s.p99`, as `sim sweep` names metrics) every summary has, so a sweep
# can refuse a misspelt objective before it runs; the sections a feature adds hold names only a
# run of that feature shows (tests/simulator/test_summary.py pins both against summarize).
_STATS = ("mean", *(f"p{p}" for p in PERCENTILES))
CORE_METRICS = frozenset(
    (
        "requests",
        "finished",
        "aborted",
        "makespan_s",
        "throughput_req_per_s",
        "throughput_output_tokens_per_s",
        "throughput_total_tokens_per_s",
        *(
            f"{m}.{s}"
            for m in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "normalized_latency_s", "weighted_turnaround", "queueing_s")
            for s in _STATS
        ),
        "preemptions.recompute",
        "preemptions.swap",
        "preemptions.recompute_forced_by_full_cpu",
        "swap_out_bytes",
        "swap_in_bytes",
        "iterations",
        "batch_size.mean_busy",
        "batch_size.max",
        "kv_utilization.mean_busy",
        "kv_utilization.max",
        "busy_fraction",
        "gpu_blocks",
        "cpu_blocks",
    )
)
FEATURE_SECTIONS = ("aborted_by_reason", "prefix_cache", "speculation", "offload", "disaggregation")


def derived_columns(req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """TTFT, TPOT, end-to-end and normalized latency (Minions), weighted turnaround
    (AdaptiveLLM eq. 5: (finish - send) / (finish - first scheduled)), queueing delay."""
    arrival, first_tok, finish = req["arrival_s"], req["first_token_s"], req["finish_s"]
    sched, out = req["first_scheduled_s"], req["output_tokens"]
    ok = req["aborted"] == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        e2e = finish - arrival
        decode_tokens = out - 1
        tpot = np.where(decode_tokens > 0, (finish - first_tok) / np.maximum(decode_tokens, 1), np.nan)
        cols = {
            "ttft_s": np.where(ok, first_tok - arrival, np.nan),
            "tpot_s": np.where(ok, tpot, np.nan),
            "e2e_s": np.where(ok, e2e, np.nan),
            "normalized_latency_s": np.where(ok, e2e / out, np.nan),
            "weighted_turnaround": np.where(ok, e2e / (finish - sched), np.nan),
            "queueing_s": np.where(ok, sched - arrival, np.nan),
        }
    return cols


def _stats(x: np.ndarray) -> dict[str, float]:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"mean": float("nan"), **{f"p{p}": float("nan") for p in PERCENTILES}}
    out = {"mean": float(x.mean())}
    for p, v in zip(PERCENTILES, np.percentile(x, PERCENTILES)):
        out[f"p{p}"] = float(v)
    return out


def summarize(result) -> dict:
    req = result.requests
    d = derived_columns(req)
    m = result.metrics
    ok = req["aborted"] == 0
    makespan = float(result.sim_time_s)
    out_tokens = float(req["output_tokens"][ok].sum())
    in_tokens = float(req["prompt_tokens"][ok].sum())
    replicas = result.spec.hardware.instances
    busy = m.tw["time_s"] or 1.0
    gpu_blocks = result.memory.gpu_blocks
    s = {
        "requests": int(len(ok)),
        "finished": int(ok.sum()),
        "aborted": int((~ok).sum()),
        # why (SchedulerLimits.abort_reason): exceeds_context, exceeds_kv_pool
        "aborted_by_reason": {k: m.abort_reasons[k] for k in sorted(m.abort_reasons)},
        "makespan_s": makespan,
        "throughput_req_per_s": float(ok.sum()) / makespan if makespan else 0.0,
        "throughput_output_tokens_per_s": out_tokens / makespan if makespan else 0.0,
        "throughput_total_tokens_per_s": (out_tokens + in_tokens) / makespan if makespan else 0.0,
        "ttft_s": _stats(d["ttft_s"]),
        "tpot_s": _stats(d["tpot_s"]),
        "itl_s": {"mean": m.itl_mean(), **{f"p{p}": m.itl_percentile(p) for p in PERCENTILES}},
        "e2e_s": _stats(d["e2e_s"]),
        "normalized_latency_s": _stats(d["normalized_latency_s"]),
        "weighted_turnaround": _stats(d["weighted_turnaround"]),
        "queueing_s": _stats(d["queueing_s"]),
        "preemptions": {
            "recompute": m.counters["preempt_recompute"],
            "swap": m.counters["preempt_swap"],
            "recompute_forced_by_full_cpu": m.counters["preempt_recompute_forced"],
        },
        "swap_out_bytes": m.counters["swap_out_bytes"],
        "swap_in_bytes": m.counters["swap_in_bytes"],
        "iterations": m.counters["iterations"],
        # averages over the time replicas were busy (idle gaps excluded)
        "batch_size": {"mean_busy": m.tw["batch_size"] / busy, "max": m.peak["batch_size"]},
        "kv_utilization": {
            "mean_busy": m.tw["gpu_blocks_used"] / busy / gpu_blocks,
            "max": m.peak["gpu_blocks_used"] / gpu_blocks,
        },
        "busy_fraction": m.tw["time_s"] / (makespan * replicas) if makespan else 0.0,
        "gpu_blocks": gpu_blocks,
        "cpu_blocks": result.memory.cpu_blocks,
    }
    s.update(result.extra)
    if "prefix_cache" in s:
        s["prefix_cache"] = prefix_cache_summary(req, result.spec.serving.block_size, s["prefix_cache"])
    return s


def prefix_cache_summary(req: dict[str, np.ndarray], block_size: int, counters: dict) -> dict:
    """Hit rates over the requests' first admissions (a recomputed request's second lookup is
    not a new request's hit): by tokens, cached prompt tokens / prompt tokens; by blocks, cached
    blocks / the blocks the prompts fill (a partial last block counts). prefill_tokens_saved counts
    every admission's cached tokens, re-admissions after a recompute preemption included."""
    admitted = req["first_scheduled_s"] >= 0
    prompt = req["prompt_tokens"][admitted].astype(np.int64)
    cached = req["cached_tokens"][admitted].astype(np.int64)
    blocks = -(-prompt // block_size)
    return {
        "hit_rate_tokens": float(cached.sum() / prompt.sum()) if prompt.size else 0.0,
        "hit_rate_blocks": float((cached // block_size).sum() / blocks.sum()) if prompt.size else 0.0,
        "cached_prompt_tokens": int(cached.sum()),
        "prompt_tokens": int(prompt.sum()),
        "prefill_tokens_saved": int(counters.get("hit_tokens", 0)),
        "admissions": int(counters.get("admissions", 0)),
        "evictions": int(counters.get("evictions", 0)),
        "swap_in_blocks_found_cached": int(counters.get("swap_in_cache_hits", 0)),
        "cached_blocks_at_end": int(counters.get("cached_blocks_at_end", 0)),
    }


def typed_requests(req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The per-request columns with their real types: counts and replica ids as int64, the
    aborted flag as bool, times as float64."""
    out = {}
    for col, values in req.items():
        if col in REQUEST_INT_COLUMNS:
            out[col] = np.asarray(values).astype(np.int64)
        elif col in REQUEST_BOOL_COLUMNS:
            out[col] = np.asarray(values) != 0
        else:
            out[col] = values
    return out


def write_result_files(run_dir, result, *, csv: bool = False, resolved: dict | None = None) -> dict:
    """The files every run directory has, simulated or executed: config.yaml (what was
    resolved; `resolved` replaces result.resolved), requests.parquet (+ requests.csv) with the
    derived per-request columns, and summary.json. Returns the summary."""
    run_dir = Path(run_dir)
    summary = summarize(result)
    write_yaml(run_dir / "config.yaml", result.resolved if resolved is None else resolved)
    table = typed_requests(result.requests)
    table.update(derived_columns(result.requests))
    write_table(run_dir / "requests.parquet", table)
    if csv:
        pd.DataFrame(table).to_csv(run_dir / "requests.csv", index=False)
    write_json(run_dir / "summary.json", summary)
    return summary
