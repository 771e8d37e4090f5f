"""`sim exec` for workloads with a `speculation:` section: requests arrive (real time, or
fast), are admitted up to serving.max_batch_size while their KV fits, and are served by the
speculative decoder (coupled) or the Minions pipeline, on the zoo (or local) models the
section names. The run directory is `sim run`'s (config.yaml, requests.parquet,
series.parquet, summary.json with a `speculation` entry like the simulator's, plots/) plus:

| file | what |
|---|---|
| speculation_rounds.parquet | one row per verification: times, batch, s, drafted / accepted / produced tokens, KV blocks released on rejection |
| speculation_ssm.parquet | Minions: one row per (verification, SSM): ACR, agreement rate, weight after the update, outputs voted |
| speculation_sequences.parquet | one row per (verification, sequence): round, request id, drafted s, accepted — per-request acceptance (fitted by validate_hooks) |
| speculation_drafting.parquet | pipelined runs: one row per drafting round of the drafting thread (pipeline.DRAFTING_COLUMNS) |
| acceptance.yaml | acceptance by position as the simulator's acceptance table (load it with `acceptance: {table: <path>, draft: ..., dataset: ...}`) |
| outputs.parquet | prompt and generated token ids per request |

What the section may ask: method draft | minions | medusa (Medusa: executor/medusa registers
its decoder with this engine, methods.py; its run directory adds medusa_accuracies.yaml, the head accuracies
measured in the run, instead of acceptance.yaml); each
draft's `model` is a zoo name or a checkpoint folder (its `acceptance` is what the simulator
would assume; here acceptance is measured); sampling greedy, or sampling at a temperature
with method draft (rejection sampling); voting / selector / pipeline as in the simulator."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from infersim.simulator.engine.memory import MemoryPlan
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.collector import MetricsCollector
from infersim.simulator.metrics.plots import plot_run
from infersim.simulator.metrics.rundir import staged_dir, write_table
from infersim.simulator.metrics.summary import write_result_files
from infersim.simulator.progress import ProgressBar
from infersim.simulator.speculative.minions import SSMWeights
from infersim.simulator.speculative.report import thin_rows
from infersim.simulator.speculative.selector import AdaptiveLengthSelector
from infersim.simulator.yamlio import atomic_path

from ..clock import Clock
from ..kv_memory import PoolSizes, pool_sizes
from ..options import ExecOptions
from ..prompts import make_prompts
from ..serving import (
    check_pools_fit,
    device_description,
    kv_block_bytes,
    load_served_model,
    model_summary,
    run_result,
    write_outputs,
)
from .acceptance import write_acceptance_table
from .methods import TREE_DECODINGS
from .sequence import SpecSequence

DATASET = "stdlib-heldout"


class _Observer:
    """Turns the decoder's rounds into the simulator's metrics (same meaning as sim run)."""

    def __init__(self, metrics, target_cache, waiting_count, round_s=None):
        self.m = metrics
        self.cache = target_cache
        self.waiting_count = waiting_count
        self.finished = []
        self.series_s = []
        self.round_s = round_s  # () -> the s of the round just recorded (None: unknown)
        self.seq_rows: list[tuple[int, int, int, int]] = []  # (round, rid, drafted, accepted)
        self._rounds = 0
        self._drafted = None

    def note_drafted(self, drafted) -> None:
        """The pipelined decoder tells what each sequence of the next on_round drafted."""
        self._drafted = list(drafted)

    def on_admit(self, seq, now):
        pass

    def on_round(self, prefill, ready, results, start, end, released):
        self._record_segment(prefill, ready, results, (start, end))
        for seq in prefill:
            seq.first_token_s = end
            seq.last_token_s = end
        self._record_sequence_rows(ready, results)
        self._rounds += 1
        self._record_itl(ready, results, end)

    def _record_segment(self, prefill, ready, results, span_s: tuple[float, float]) -> None:
        """The round as one segment of the simulator's metrics: one step, its batch, its
        query tokens (prompts prefilled + verified rows kept), the KV blocks in use."""
        q_pre = sum(s.prompt_len for s in prefill)
        q_ver = sum(k + 1 for k, _ in results)  # verified rows that stay (accepted + the last committed token)
        start, end = span_s
        self.m.segment(
            (
                start,
                end,
                0,
                1,
                len(prefill) + len(ready),
                q_pre + q_ver,
                q_pre,
                self.cache.used_gpu,
                0,
                self.waiting_count(),
                0,
                0.0,
                0.0,
            )
        )

    def _record_sequence_rows(self, ready, results) -> None:
        """(round, rid, drafted, accepted) per verified sequence; what each drafted as the
        pipelined decoder told, else as the decoder drafts: min(s, remaining - 1)."""
        drafted, self._drafted = self._drafted, None
        s_round = self.round_s() if self.round_s is not None else None
        for i, (seq, (k, _)) in enumerate(zip(ready, results)):
            if drafted is not None:
                si = int(drafted[i])
            else:  # the tokens are committed by now
                rem_before = seq.remaining + k + 1
                si = int(min(s_round, rem_before - 1)) if s_round is not None else -1
            self.seq_rows.append((self._rounds, int(seq.rid), si, int(k)))

    def _record_itl(self, ready, results, end: float) -> None:
        """Inter-token latencies: each sequence's k + 1 tokens spread evenly since its last token."""
        gaps, wts = [], []
        for seq, (k, _) in zip(ready, results):
            n = k + 1
            gaps.append((end - seq.last_token_s) / n)  # as the simulator spreads a round's tokens
            wts.append(float(n))
            seq.last_token_s = end
        if gaps:
            self.m.add_itl(np.array(gaps), np.array(wts))

    def on_finish(self, seq, now):
        seq.finish_s = now
        self.finished.append(seq)
        self.m.finish(seq, now)


def _settings(sp):
    if sp.method == "medusa":  # Medusa's settings are its TreeDecoding's (methods.py)
        raise InfersimError("speculation.method 'medusa': these settings are for draft and minions only")
    mode = sp.sampling.mode
    if mode == "typical":
        raise InfersimError("speculation.sampling.mode 'typical' is Medusa's; use greedy or sampling")
    temperature = float(sp.sampling.temperature) if mode == "sampling" else 0.0
    if temperature > 0 and (sp.method == "minions" or sp.pipeline_on or sp.voting_on):
        raise InfersimError(
            "speculation.sampling: rejection sampling runs with method 'draft' only "
            "(Minions votes and pipelines greedily); use sampling.mode: greedy"
        )
    return mode, temperature


@dataclass(frozen=True)
class _Method:
    """What the section's method means for the run."""

    medusa: bool  # Medusa: a registered TreeDecoding builds the decoder (methods.py)
    tree_decoding: Any  # that TreeDecoding; None for draft and minions
    mode: str  # acceptance rule reported and recorded: greedy, sampling, typical
    temperature: float  # rejection sampling's temperature; 0: greedy
    decoder_method: str  # build_decoder's method: minions with the majority vote, draft without


@dataclass(frozen=True)
class _Models:
    """The loaded target and the drafts that run."""

    target: Any  # the served model (serving.load_served_model)
    drafts: list  # the drafts that draft (loaded), in the section's order
    sections: list  # their `speculation.drafts` entries
    names: list  # their names in tables and summaries


@dataclass(frozen=True)
class _Setup:
    """Everything the serving loop and the run directory need, decided before the clock starts."""

    spec: Any  # the workload
    opts: ExecOptions
    method: _Method
    models: _Models
    seqs: list  # SpecSequence per request served, in arrival order
    truncated: int  # requests whose output was cut to fit max_model_len
    gpu_blocks: int  # KV blocks of each model's pool
    dec: Any  # the decoder (SpeculativeDecoder or Medusa's)
    runner: Any  # what generate() runs on: the decoder, or the PipelinedDecoder around it
    t_wall: float  # perf_counter when the execution began


def execute_speculative(spec, requests, model: str, out: Path, opts: ExecOptions = ExecOptions()) -> dict:
    """Serve the requests with the workload's `speculation:` method (draft models, Minions or
    Medusa); write a `sim exec` run directory at `out` atomically; return the summary."""
    t_wall = time.perf_counter()
    sp = spec.speculation
    how = _method_of(sp)
    if len(requests) and requests.closed_loop:
        raise InfersimError(
            "speculative sim exec replays open-loop arrivals only (requests.arrival), not closed-loop clients"
        )
    models = _load_models(requests, model, sp, opts)
    sel = AdaptiveLengthSelector.from_section(sp) if sp.selector_on else None
    mheads, mtree = how.tree_decoding.prepare(models.target, sp, log=opts.log) if how.medusa else (None, None)
    # the KV cache reserves room for what one verification writes: s drafted tokens, or a
    # Medusa tree's nodes
    s_max = mtree.nodes if how.medusa else (sel.s_max if sel is not None else sp.speculation_length)
    seqs, truncated = _sequences(spec, requests, models, s_max)
    gpu_blocks = _gpu_blocks(spec.serving, seqs, s_max)
    check_pools_fit(
        models.target,
        [_pool_of(m, gpu_blocks, spec.serving.block_size) for m in (models.target, *models.drafts)],
        opts.source,
    )
    if how.medusa:
        dec = _medusa_decoder(spec, how, models, gpu_blocks, mheads, mtree)
    else:
        dec = _draft_decoder(spec, how, models, gpu_blocks, sel)
    setup = _Setup(spec, opts, how, models, seqs, truncated, gpu_blocks, dec, _runner_for(dec, sp, how), t_wall)
    with staged_dir(Path(out), command="exec", force=opts.force) as tmp:
        metrics, obs = _serve(setup, tmp)
        summary = write_result_files(tmp, _run_result(setup, metrics), csv=opts.csv)
        _write_speculation_files(setup, tmp, obs)
    return summary


def _method_of(sp) -> _Method:
    medusa = sp.method == "medusa"
    tree_decoding = None
    if medusa:
        tree_decoding = TREE_DECODINGS.get(sp.method)  # registered by executor/medusa when imported
        mode, temperature = tree_decoding.acceptance_mode(sp), 0.0
    else:
        mode, temperature = _settings(sp)
    return _Method(medusa, tree_decoding, mode, temperature, "minions" if sp.voting_on else "draft")


def _load_models(requests, model: str, sp, opts: ExecOptions) -> _Models:
    from ..models import load_model

    lm = load_served_model(requests, model, opts)
    # as the simulator (proposers.DraftProposer): without the majority vote (voting.enabled:
    # false, or one draft) only the first SSM drafts; the others are neither run nor voted
    used = sp.drafts if sp.voting_on else sp.drafts[:1]
    dlms = [load_model(d.model, device=opts.device, dtype=opts.dtype, log=opts.log) for d in used]
    return _Models(lm, dlms, used, [d.name or d.model for d in used])


def _sequences(spec, requests, models: _Models, s_max: int) -> tuple[list, int]:
    """The requests that arrive within the duration, as SpecSequences whose prompt, output and
    s_max drafted tokens fit the models' positions; and how many outputs were cut to fit."""
    lm = models.target
    sv = spec.serving
    max_len = min(sv.max_model_len or lm.max_positions, lm.max_positions, *(d.max_positions for d in models.drafts))
    prompts = make_prompts(requests.prompt_tokens, tokenizer=lm.tokenizer, vocab_size=lm.vocab_size, seed=spec.seed)
    seqs, truncated = [], 0
    for i, t in enumerate(requests.arrival_s):
        if requests.duration_s is not None and t > requests.duration_s:
            break
        p = prompts[i][: max_len - 2]
        o = int(requests.output_tokens[i])
        if len(p) + o + s_max + 1 > max_len:
            o = max(1, max_len - len(p) - s_max - 1)  # drafted tokens need positions too
            truncated += 1
        seqs.append(SpecSequence(i, p, o, max(1, len(models.drafts)), float(t)))
    return seqs, truncated


def _gpu_blocks(sv, seqs, s_max: int) -> int:
    """serving.gpu_blocks, or the fewer of: every request's blocks at once, and max_batch_size
    times the largest request's plus one."""
    from .decoder import kv_blocks_for

    gpu_blocks = sv.gpu_blocks or min(
        kv_blocks_for(seqs, s_max, sv.block_size),
        sv.max_batch_size * max(kv_blocks_for([s], s_max, sv.block_size) for s in seqs) + 1,
    )
    return int(gpu_blocks)


def _pool_of(lm, gpu_blocks: int, block_size: int) -> PoolSizes:
    """One model's KV pool on the speculative path: gpu_blocks on its device, no host pool."""
    import torch

    elt = torch.empty((), dtype=lm.dtype).element_size()
    return pool_sizes(
        "speculative",
        device_type=lm.device.type,
        gpu_blocks=gpu_blocks,
        cpu_blocks=0,
        workload=None,
        block_bytes=kv_block_bytes(lm.config, block_size, elt),
    )


def _medusa_decoder(spec, how: _Method, models: _Models, gpu_blocks: int, heads, tree):
    sv = spec.serving
    return how.tree_decoding.build_decoder(
        models.target,
        spec.speculation,
        gpu_blocks=gpu_blocks,
        block_size=sv.block_size,
        max_batch_size=sv.max_batch_size,
        heads=heads,
        tree=tree,
    )


def _draft_decoder(spec, how: _Method, models: _Models, gpu_blocks: int, sel):
    from .build import DecoderOptions, build_decoder

    sp, sv = spec.speculation, spec.serving
    return build_decoder(
        models.target,
        models.drafts,
        DecoderOptions(
            method=how.decoder_method,
            s=sp.speculation_length,
            temperature=how.temperature,
            seed=spec.seed,
            block_size=sv.block_size,
            gpu_blocks=gpu_blocks,
            max_batch_size=sv.max_batch_size,
            selector=sel,
            weights=_ssm_weights(sp, models.sections) if how.decoder_method == "minions" else None,
            acr_scope=sp.voting.acr_scope,
            names=models.names,
        ),
    )


def _ssm_weights(sp, used) -> SSMWeights:
    """Minions' SSM weights: the drafts' initial weights and the section's update rule."""
    v = sp.voting
    return SSMWeights(
        np.array([d.weight for d in used], dtype=np.float64),
        reward_threshold=v.reward_threshold,
        punish_threshold=v.punish_threshold,
        reward_factor=v.reward_factor,
        punish_factor=v.punish_factor,
        threshold_mode=v.threshold_mode,
        ema=v.ema,
    )


def _runner_for(dec, sp, how: _Method):
    """The decoder, warmed up, or the pipeline around it when the section pipelines."""
    from .pipeline import PipelinedDecoder

    if not how.medusa:
        from .build import warm_up

        warm_up(dec)  # before the clock starts (the drafting process warms its own drafts)
    if not sp.pipeline_on:
        return dec
    pl = sp.pipeline
    return PipelinedDecoder(
        dec, llm_batch_size=pl.llm_batch_size, ssm_batch_size=pl.ssm_batch_size, back_pressure=pl.back_pressure
    )


def _serve(setup: _Setup, tmp: Path) -> tuple[MetricsCollector, _Observer]:
    """Run every request to its end on the engine clock; the metrics and the observer that saw
    each round."""
    seqs, dec, runner, opts = setup.seqs, setup.dec, setup.runner, setup.opts
    metrics = MetricsCollector(len(seqs), series_path=tmp / "series.parquet")
    for s in seqs:
        metrics.arrive(s)
    clock = Clock(realtime=opts.realtime)
    obs = _Observer(
        metrics,
        dec.target.cache,
        lambda: sum(1 for s in seqs if s.arrival_s <= clock.now() and s.first_scheduled_s < 0),
        round_s=lambda: int(dec.stats.rounds[-1][8]) if dec.stats.rounds else None,
    )
    try:
        with ProgressBar("speculative exec", quiet=opts.quiet, total=len(seqs), transient=True) as bar:
            runner.generate(seqs, progress=lambda seq: bar.update(advance=1), clock=clock, observer=obs)
    finally:
        if hasattr(runner, "close"):
            runner.close()  # the pipeline's drafting process
    return metrics, obs


def _run_result(setup: _Setup, metrics: MetricsCollector):
    """The run's result as `sim run` reports it, with the executor's and the speculation's entries."""
    spec, dec, lm, sv = setup.spec, setup.dec, setup.models.target, setup.spec.serving
    end = max((s.finish_s for s in setup.seqs), default=0.0)
    bpb = dec.target.cache.bytes_per_block
    memory = MemoryPlan(
        setup.gpu_blocks, 0, float(bpb), float(lm.weight_bytes()), 0.0, "explicit" if sv.gpu_blocks else "derived"
    )
    spec_x = _speculation_summary(setup)
    if hasattr(dec, "summary_extra"):  # Medusa: tree, accepted lengths, measured head accuracies
        spec_x.update(dec.summary_extra())
    ex = _executor_entry(setup)
    resolved = {
        "workload": spec.model_copy(update={"model": str(lm.path)}).model_dump(mode="json"),
        "model": model_summary(lm, sv.dtype),
        "hardware": device_description(lm.device),
        "memory": {"gpu_blocks": setup.gpu_blocks, "kv_bytes_per_block": float(bpb)},
        "step_mode": True,
        "num_requests": len(setup.seqs),
        "executor": {
            k: ex[k] for k in ("model", "model_path", "drafts", "device", "dtype", "realtime", "torch", "threads")
        },
    }
    return run_result(spec, metrics, memory, end, resolved, {"executor": ex, "speculation": spec_x})


def _executor_entry(setup: _Setup) -> dict:
    """summary.json's `executor` entry: the models, the device and where the rounds' time went."""
    import torch

    from ..models import dtype_name

    lm = setup.models.target
    tab = setup.dec.stats.table()
    fwd = float(tab["draft_s"].sum() + tab["verify_s"].sum())
    return {
        "model": lm.name,
        "model_path": str(lm.path),
        "drafts": setup.models.names,
        "device": str(lm.device),
        # forward: drafting + verification passes; schedule: the rest of the rounds (voting,
        # acceptance, bookkeeping); no swapping here
        "forward_s": fwd,
        "schedule_s": max(0.0, float((tab["t_end_s"] - tab["t_start_s"]).sum()) - fwd),
        "swap_s": 0.0,
        "dtype": dtype_name(lm.dtype),
        "realtime": setup.opts.realtime,
        "wall_s": time.perf_counter() - setup.t_wall,
        "outputs_truncated_to_max_model_len": setup.truncated,
        "torch": str(torch.__version__),
        "threads": torch.get_num_threads(),
    }


def _write_speculation_files(setup: _Setup, tmp: Path, obs: _Observer) -> None:
    """The speculative tables, the acceptance measured, the outputs and the plots beside the
    run's own files."""
    dec, runner = setup.dec, setup.runner
    write_table(tmp / "speculation_rounds.parquet", dec.stats.table())
    write_table(tmp / "speculation_sequences.parquet", _sequence_table(obs.seq_rows))
    if hasattr(runner, "drafting_table"):  # pipelined: the drafting thread's rounds
        write_table(tmp / "speculation_drafting.parquet", runner.drafting_table())
    ssm = _ssm_table(dec.proposer)
    if ssm is not None:
        write_table(tmp / "speculation_ssm.parquet", ssm)
    _write_acceptance(setup, tmp)
    write_outputs(tmp / "outputs.parquet", sorted(setup.seqs, key=lambda s: s.rid))
    if setup.opts.plots:
        plot_run(tmp)
        _plot_speculation(tmp, dec, runner)
        if hasattr(dec, "plot_extra"):  # Medusa: accepted lengths and measured head accuracies
            dec.plot_extra(tmp)


def _write_acceptance(setup: _Setup, tmp: Path) -> None:
    """acceptance.yaml (Medusa: its head accuracies) as the simulator loads it."""
    spec, dec, lm, names = setup.spec, setup.dec, setup.models.target, setup.models.names
    source = f"sim exec of workload {spec.name} (seed {spec.seed})"
    if hasattr(dec, "write_extra"):
        dec.write_extra(tmp, target=lm.name, source=source)
        return
    if not dec.stats.recorder.rounds:
        return
    how = setup.method
    label = names[0] if how.decoder_method == "draft" else "minions(" + "+".join(names) + ")"
    write_acceptance_table(
        tmp / "acceptance.yaml",
        target=lm.name,
        drafts={label: label},
        source=source,
        entries=[
            dec.stats.recorder.entry(
                label,
                spec.speculation.dataset or DATASET,
                mode=how.mode,
                temperature=how.temperature,
                source="measured by executor/speculative",
            )
        ],
    )


SEQUENCE_COLUMNS = ("round", "rid", "s", "accepted")


def _sequence_table(rows) -> dict[str, np.ndarray]:
    a = np.array(rows, dtype=np.int64).reshape(-1, len(SEQUENCE_COLUMNS))
    return {c: a[:, i] for i, c in enumerate(SEQUENCE_COLUMNS)}


def _speculation_summary(setup: _Setup) -> dict:
    """summary.json's `speculation` entry: what ran, its acceptance, and the round series
    thinned to the section's series_max_points."""
    dec, runner = setup.dec, setup.runner
    limit = setup.spec.speculation.series_max_points
    tab = dec.stats.table()
    out = {
        **_speculation_counts(setup, tab),
        "series": {
            "s": {"columns": ["round", "s"], "rows": thin_rows([list(x) for x in dec.s_series], limit)},
            "rounds": _round_series(tab, limit),
        },
    }
    if hasattr(dec.proposer, "history"):
        out["voting"], out["series"]["weights"] = _voting_entry(dec.proposer, setup.models.names, limit)
    if runner is not dec:
        out["pool"], out["series"]["pool_depth"] = _pool_entry(runner, limit)
    return out


def _speculation_counts(setup: _Setup, tab: dict) -> dict:
    """The method, its acceptance (rates, tokens, by position), rounds, steps and rolled-back blocks."""
    dec, runner = setup.dec, setup.runner
    st, rec = dec.stats, dec.stats.recorder
    return {
        "method": setup.spec.speculation.method,
        "mode": setup.method.mode,
        "temperature": setup.method.temperature,
        "executed": True,
        "pipelined": runner is not dec,
        "drafting": getattr(runner, "drafting", None),  # pipelined: the drafts' own process or a thread
        "acceleration_rate": st.acceleration_rate(),
        # the simulator's definition (mean over speculating sequence-rounds), so the
        # validation compares the same quantity; the pooled ratio alongside
        "acceptance_rate": rec.mean_round_acceptance(),
        "acceptance_rate_pooled": rec.mean_acceptance(),
        "accepted_tokens": int(tab["accepted_tokens"].sum()) if len(tab["round"]) else 0,
        "drafted_tokens": int(tab["drafted_tokens"].sum()) if len(tab["round"]) else 0,
        "rounds": int(len(tab["round"])),
        "sequence_rounds": st.verify_rounds,
        "target_steps": dec.target.steps,
        "kv_blocks_released_on_rejection": int(dec.target.released_blocks),
        "draft_kv_blocks_released_on_rejection": int(
            sum(d.released_blocks for d in getattr(dec.proposer, "drafts", []))
        ),
        "acceptance_by_position": rec.positional_probs(),
        "s": {"final": dec.s, "changes": max(0, len(dec.s_series) - 1)},
    }


def _round_series(tab: dict, limit: int) -> dict:
    """Per round: its end, batch, tokens per verified sequence, step time and speculation length."""
    rows = [
        [float(e), int(v), (float(o - p) / v) if v else 0.0, float(e - t), int(s)]
        for t, e, v, p, o, s in zip(
            tab["t_start_s"], tab["t_end_s"], tab["verify_seqs"], tab["prefill_seqs"], tab["tokens_out"], tab["s"]
        )
    ]
    return {"columns": ["t_s", "batch", "tokens_per_seq", "step_s", "s"], "rows": thin_rows(rows, limit)}


def _voting_entry(p, names: list, limit: int) -> tuple[dict, dict]:
    """Minions' majority vote: its counts and weights, and the weights' series."""
    voting = {
        "ssms": names,
        "voted_outputs": p.voted_counts.tolist(),
        "final_weights": [float(w) for w in p.weights.weights],
        "weight_updates": p.weights.updates,
        "per_ssm": p.summary(),
    }
    series = {
        "columns": ["round"] + names,
        "rows": thin_rows([[i] + h["weights"] for i, h in enumerate(p.history)], limit),
    }
    return voting, series


def _pool_entry(runner, limit: int) -> tuple[dict, dict]:
    """The pipelined decoder's pool of drafted sequences: its depth, batch sizes, drafting rounds."""
    pool = {
        "max_depth": max((d for _, d in runner.pool_depth_series), default=0),
        "llm_batch_size": runner.llm_batch_size,
        "ssm_batch_size": runner.ssm_batch_size,
        "drafting_rounds": len(runner.draft_rounds),
    }
    series = {"columns": ["t_s", "depth"], "rows": thin_rows([list(x) for x in runner.pool_depth_series], limit)}
    return pool, series


def _ssm_table(p):
    if not hasattr(p, "history") or not p.history:
        return None
    rows = {"verification": [], "ssm": [], "acr": [], "agreement_rate": [], "weight": [], "voted": []}
    for i, h in enumerate(p.history):
        for j, name in enumerate(p.names):
            rows["verification"].append(i)
            rows["ssm"].append(name)
            rows["acr"].append(h["acr"].get(j, float("nan")))
            rows["agreement_rate"].append(h["agreement"][j])
            rows["weight"].append(h["weights"][j])
            rows["voted"].append(h["voted"][j])
    return {k: np.asarray(v) for k, v in rows.items()}


def _plot_speculation(folder: Path, dec, runner) -> None:
    """plots/speculation.png: tokens per sequence per verification and s over time; Minions
    weights per SSM."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tab = dec.stats.table()
    p = dec.proposer
    has_w = hasattr(p, "history") and p.history
    fig, axes = plt.subplots(1, 3 if has_w else 2, figsize=(13 if has_w else 9, 3.4))
    v = np.maximum(tab["verify_seqs"], 1)
    axes[0].plot(tab["t_end_s"], (tab["tokens_out"] - tab["prefill_seqs"]) / v, ".", ms=3)
    axes[0].set(xlabel="engine time (s)", ylabel="tokens per sequence per step", title="acceleration")
    axes[1].step(tab["t_end_s"], tab["s"], where="post")
    axes[1].set(xlabel="engine time (s)", ylabel="s", title="speculation length")
    if has_w:
        w = np.array([h["weights"] for h in p.history])
        for j, name in enumerate(p.names):
            axes[2].plot(w[:, j], label=name)
        axes[2].set(xlabel="verification", ylabel="weight", title="SSM weights")
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    (folder / "plots").mkdir(exist_ok=True)
    with atomic_path(folder / "plots" / "speculation.png") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
