"""Speculative decoding in the serving engine: Replica subclasses.

`SpeculativeReplica` (tightly coupled, also Medusa): every loop asks the scheduler for a
decision as the plain engine does, then runs one speculation round over the batch: the SSMs
draft k_i = min(s, remaining_i - 1) tokens per decoding sequence (s autoregressive steps, costed
by the draft model's cost model), then the target verifies k_i + 1 tokens per sequence in one
pass (BatchShape with q = k_i + 1; Medusa: q = tree nodes, plus the heads' cost). KV blocks for
all candidate tokens are allocated before verification and the rejected ones are returned
after it; a sequence gains accepted + 1 tokens, never more than its remaining output. Prefill
entries in the batch (admissions, chunks) run in the same pass as in the plain engine, plus
the SSMs' prefill of the same tokens. The decode-stretch jump of the plain engine does not
apply (tokens per round vary), so each loop is one round.

The scheduler sees a state whose `new_blocks_for_step` asks room for the round's candidate
tokens (vLLM's lookahead slots), so its preemption decisions account for speculation; if the
pool is still short (e.g. right after a swap-in), sequences from the back of the batch
speculate less for that round.

`PipelinedReplica` (Minions section 3.4): the SSM engine and the LLM engine are two SimPy
processes on a SharedDevice, joined by the intermediate result pool; SSMs pause while the pool
holds at least the LLM batch size (back-pressure). The LLM loop keeps the scheduler: it admits,
preempts and swaps as the plain engine does, runs prefills, and verifies up to llm_batch_size
pool entries per pass; finished prefills and verified sequences go back to the SSMs' ready
queue. A sequence preempted while the SSMs draft it has its draft dropped.

Randomness: one numpy Generator per replica seeded from (workload seed, replica index)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..costmodel.batch import BatchShape
from ..engine.replica import Replica
from ..engine.sequence import emit_token
from ..errors import InfersimError
from ..models.dtypes import normalize_dtype
from ..policies.state import SchedulerState
from .config import SpeculationSection
from .device import SharedDevice
from .minions import PoolBackPressure
from .proposers import build_proposer
from .report import SpecStats, VerifiedRound


@dataclass
class LookaheadState(SchedulerState):
    """The scheduler's view with room for speculative candidates: a decoding sequence's next
    step writes tokens_for(remaining) tokens, not one."""

    tokens_for: Optional[Callable[[int], int]] = None

    def new_blocks_for_step(self, seq, query_tokens: int) -> int:
        if query_tokens == 1 and self.tokens_for is not None and seq.computed == seq.num_tokens - 1:
            query_tokens = self.tokens_for(seq.output_len - seq.generated)
        return super().new_blocks_for_step(seq, query_tokens)


def _is_decode(seq, n: int) -> bool:
    return n == 1 and seq.computed == seq.num_tokens - 1


class SpeculativeReplica(Replica):
    mode = "coupled"

    def __init__(self, index, sim, blocks, scheduler, limits, kv_bytes_per_block, link):
        super().__init__(index, sim, blocks, scheduler, limits, kv_bytes_per_block, link)
        self.cfg: SpeculationSection = sim.spec.speculation
        self.proposer = build_proposer(self.cfg, sim)
        self.rng = np.random.default_rng([int(sim.spec.seed) & 0xFFFFFFFF, 0x5BEC, int(index)])
        self.stats = SpecStats(self.proposer.names if self.proposer.voting else [])
        self.busy = {"ssm": 0.0, "llm": 0.0} if self.proposer.kind == "draft" else {"llm": 0.0}
        sel = self.cfg.selector
        self.measure = ("period" if self.mode == "pipelined" else "round") if sel.measure == "auto" else sel.measure
        self._last_verify_end = None
        self.memory_note = self._account_memory(sim)
        self.stats.s_series.append((0.0, self.proposer.s))
        if self.proposer.voting:
            self.stats.weight_series.append((0.0, *[float(w) for w in self.proposer.weights.weights]))

    # ---- memory ------------------------------------------------------------------------
    def _account_memory(self, sim) -> dict:
        """Colocated SSMs (weights + their KV) and Medusa heads take GPU memory the plain
        engine gave to the target's KV pool: shrink the pool when it was derived from memory."""
        p = self.proposer
        # pipelined SSMs placed on a GPU of their own (or on draft_hardware) leave the pool alone
        separate = self.mode == "pipelined" and self.cfg.pipeline.placement == "separate"
        colocated = p.kind == "medusa" or (p.same_device and not separate)
        if not (self.cfg.account_memory and colocated) or sim.memory.source != "derived":
            return {"kv_blocks_taken": 0}
        dtype = normalize_dtype(sim.spec.serving.dtype)
        b = self.blocks
        per_block = self.kv_bytes_per_block
        weight_blocks = int(np.ceil(p.weight_bytes(dtype) / per_block))
        target_token = per_block / b.block_size
        ratio = p.kv_bytes_per_token(sim.kv_dtype) / target_token if target_token else 0.0
        total = int((b.total_gpu - weight_blocks) / (1.0 + ratio))
        _check_target_holds_one_sequence(sim, p, total, b.total_gpu)
        taken = b.total_gpu - total
        wm = b.watermark_blocks / b.total_gpu if b.total_gpu else 0.0
        b.total_gpu = b.free_gpu = total
        b.watermark_blocks = int(wm * total)
        return {
            "kv_blocks_taken": taken,
            "kv_blocks_left": total,
            "weight_blocks": weight_blocks,
            "draft_kv_per_target_kv": ratio,
        }

    def _state(self) -> SchedulerState:
        st = super()._state()
        return LookaheadState(**vars(st), tokens_for=self.proposer.tokens_for)

    # ---- the loop ------------------------------------------------------------------------
    def _execute(self, decision, state, out_bytes: float, in_bytes: float):
        yield from self._round(decision.batch, out_bytes, in_bytes)

    # ---- shared pieces ---------------------------------------------------------------------
    def _fit_kv(self, seqs, q_fixed: np.ndarray, dec_pos: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Speculate less (k -> 0, from the back) until every candidate has a KV slot."""
        b = self.blocks
        bs = b.block_size
        comp = np.fromiter((s.computed for s in seqs), dtype=np.int64, count=len(seqs))
        have = np.fromiter((s.num_gpu_blocks for s in seqs), dtype=np.int64, count=len(seqs))
        k = k.copy()

        def need(kk):
            q = q_fixed.copy()
            q[dec_pos] = self.proposer.candidates(kk)
            return int(np.maximum(0, -(-(comp + q) // bs) - have).sum())

        i = len(dec_pos) - 1
        while need(k) > b.free_gpu and i >= 0:
            if k[i] > 0:
                k[i] = 0
                self.stats.kv_fit_shrinks += 1
            i -= 1
        if need(k) > b.free_gpu:
            raise RuntimeError("speculative round overdrew the GPU block pool")
        return k

    def _commit_prefills(self, entries, end: float, itl: list) -> list:
        """Prefill entries (admissions, chunks) as the plain engine commits them; returns the
        sequences that produced their first token and go on decoding."""
        started = []
        for seq, n in entries:
            makes = seq.computed + n == seq.num_tokens
            seq.computed += n
            if not makes:
                continue
            if emit_token(seq, end, itl):
                self._finish(seq, end)
            else:
                started.append(seq)
        return started

    def _commit_verified(self, seqs, tokens: np.ndarray, end: float) -> tuple[list, list, list]:
        """Decoding sequences gain `tokens` each; rejected candidates' blocks go back."""
        b = self.blocks
        gaps, weights, going = [], [], []
        released = 0
        for seq, t in zip(seqs, tokens.tolist()):
            seq.computed += t
            seq.generated += t
            keep = b.blocks_for_tokens(seq.computed)
            extra = seq.num_gpu_blocks - keep
            if extra > 0:
                b.free_gpu += extra
                seq.num_gpu_blocks = keep
                released += extra
            gaps.append((end - seq.last_token_s) / t)
            weights.append(float(t))
            seq.last_token_s = end
            if seq.generated >= seq.output_len:
                self._finish(seq, end)
            else:
                going.append(seq)
        self.stats.kv_released_blocks += released
        return gaps, weights, going

    def _plain_time(self, ctx_dec: np.ndarray) -> float:
        return self.cost.iteration_time_s(BatchShape.decode(ctx_dec)) if ctx_dec.size else 0.0

    def _learn(self, r: VerifiedRound, t_llm: float) -> None:
        """The proposer's feedback from a verified round; `t_llm` is the LLM's share of its step."""
        tokens, k = r.tokens, r.drafted
        if tokens.size == 0:
            return
        now = r.end_s
        if self.measure == "period":
            t = now - self._last_verify_end if self._last_verify_end is not None else t_llm
        else:
            t = t_llm if self.measure == "llm" else r.step_s
        self._last_verify_end = now
        if not np.any(np.asarray(k) > 0):
            return  # nothing drafted (every sequence on its last token): says nothing about s, as in the executor
        # verified length: over the sequences that drafted the full s (one cut short by its
        # remaining output says nothing about s); all of them if none did
        full = k >= r.s_drafted
        vl = float(tokens[full].mean()) if full.any() else float(tokens.mean())
        changed, updated = self.proposer.feedback(t, vl, r.voted, r.rates, r.lengths, k, r.accepted)
        if changed:
            self.stats.s_series.append((now, self.proposer.s))
        if updated:
            self.stats.weight_series.append((now, *[float(w) for w in self.proposer.weights.weights]))

    # ---- one coupled round -----------------------------------------------------------------
    def _round(self, batch, out_bytes: float, in_bytes: float):
        env, blocks, p = self.env, self.blocks, self.proposer
        seqs = [s for s, _ in batch]
        n_in = np.fromiter((n for _, n in batch), dtype=np.int64, count=len(batch))
        ctx = np.fromiter((s.computed for s in seqs), dtype=np.int64, count=len(batch))
        is_dec = np.fromiter((_is_decode(s, n) for s, n in batch), dtype=bool, count=len(batch))
        dec_pos = np.flatnonzero(is_dec)
        dec = [seqs[i] for i in dec_pos]
        rem = np.fromiter((s.output_len - s.generated for s in dec), dtype=np.int64, count=len(dec))
        k = p.plan(rem)
        k = self._fit_kv(seqs, n_in, dec_pos, k)
        q = n_in.copy()
        q[dec_pos] = p.candidates(k)
        makes = np.fromiter((s.computed + n == s.num_tokens for s, n in batch), dtype=np.int64, count=len(batch))
        logits = np.where(is_dec, q, makes)
        for seq, qi in zip(seqs, q.tolist()):
            blocks.grow_to(seq, seq.computed + qi)
        pre = ~is_dec
        # the drafts catch up on the new prompts in the same step as they decode the others (as executed)
        t_draft = p.draft_time_s(ctx[dec_pos], k) + p.draft_prefill_time_s(
            q[pre], ctx[pre], makes[pre], alongside=int(np.count_nonzero(k > 0))
        )
        t_verify = self.cost.iteration_time_s(BatchShape(q, ctx, logits)) + p.extra_time_s(
            len(dec), int(q[dec_pos].sum())
        )
        t_plain = self._plain_time(ctx[dec_pos])
        start = env.now
        yield env.timeout_at(start + t_draft + t_verify)
        end = env.now
        if "ssm" in self.busy:
            self.busy["ssm"] += t_draft
        self.busy["llm"] += t_verify
        acc, voted, rates, lengths = p.accept(self.rng, k, [x.rid for x in dec])
        tokens = np.minimum(acc + 1, rem)
        s_now = p.s
        self._record_iteration(start, end, len(batch), int(q.sum()), int(q[pre].sum()), out_bytes, in_bytes)
        itl: list = []
        self._commit_prefills([batch[i] for i in np.flatnonzero(pre)], end, itl)
        if itl:
            self.metrics.add_itl(itl, 1.0)
        if dec:
            gaps, wts, _ = self._commit_verified(dec, tokens, end)
            self.metrics.add_itl(np.array(gaps), np.array(wts))
            r = VerifiedRound(end, dec, k, acc, tokens, voted, rates, t_draft + t_verify, t_plain, s_now, lengths)
            self.stats.round(r)
            self._learn(r, t_verify)

    # ---- report ----------------------------------------------------------------------------------
    def report(self, extra: dict) -> None:
        now = self.env.now
        info = {
            "method": self.cfg.method,
            "mode": self.mode,
            "replica": self.index,
            "sampling": self.cfg.sampling.model_dump(mode="json"),
            "switches": {
                "voting": self.cfg.voting_on,
                "selector": self.cfg.selector_on,
                "pipeline": self.cfg.pipeline_on,
            },
            "proposer": self.proposer.describe(),
            "memory": self.memory_note,
            "step_time_s": self.stats.step_time_s,
            "plain_decode_time_s": self.stats.plain_time_s,
        }
        info.update(self._mode_info())
        summary = self.stats.summary(now, self.busy, self.proposer, self.cfg.series_max_points, info)
        merge_report(extra, summary)

    def _mode_info(self) -> dict:
        return {}


def merge_report(extra: dict, summary: dict) -> None:
    """One replica: extra['speculation'] is its summary. Several: the totals are combined and
    each replica's summary is kept under 'replicas'."""
    cur = extra.get("speculation")
    if cur is None:
        extra["speculation"] = summary
        return
    reps = cur["replicas"] if "replicas" in cur else [cur]
    reps = reps + [summary]
    rounds = sum(r["sequence_rounds"] for r in reps)
    tokens = sum(r["tokens"] for r in reps)
    step = sum(r["step_time_s"] for r in reps)
    plain = sum(r["plain_decode_time_s"] for r in reps)
    acc = tokens / rounds if rounds else float("nan")
    ovh = step / plain if plain else float("nan")
    extra["speculation"] = {
        "method": reps[0]["method"],
        "mode": reps[0]["mode"],
        "acceleration_rate": acc,
        "overhead": ovh,
        "speedup_model": acc / ovh if plain else float("nan"),
        "tokens": tokens,
        "sequence_rounds": rounds,
        "replicas": reps,
    }


@dataclass
class PoolEntry:
    seq: object
    k: int
    accepted: int
    voted: int
    rate: float
    s: int
    lengths: Optional[np.ndarray] = None  # every SSM's agreement length (voting)


class PipelinedReplica(SpeculativeReplica):
    mode = "pipelined"

    def __init__(self, index, sim, blocks, scheduler, limits, kv_bytes_per_block, link):
        super().__init__(index, sim, blocks, scheduler, limits, kv_bytes_per_block, link)
        pc = self.cfg.pipeline
        self.b_llm = int(pc.llm_batch_size or max(1, limits.max_batch_size // 2))
        self.b_ssm = int(pc.ssm_batch_size or self.b_llm)
        self.back_pressure = PoolBackPressure(self.b_llm, pc.back_pressure)
        shared = pc.placement == "shared" and self.cfg.draft_hardware is None
        self.device = SharedDevice(
            self.env,
            {"llm": pc.llm_share, "ssm": pc.ssm_share} if shared else None,
            whole_pass=pc.contention == "whole_pass",
        )
        self.ready: list = []
        self.pool: list[PoolEntry] = []
        self.epoch: dict[int, int] = {}
        self.draft_prefill: set[int] = set()
        self.ssm_wake = self.env.event()
        self.pool_wake = self.env.event()
        self._override = False
        self.ssm_paused_s = 0.0
        self.stats.pool_series.append((0.0, 0))

    # ---- events ----------------------------------------------------------------------------
    def _wake_ssm(self) -> None:
        if not self.ssm_wake.triggered:
            self.ssm_wake.succeed()

    def _wake_llm(self) -> None:
        if not self.pool_wake.triggered:
            self.pool_wake.succeed()

    def _pool_changed(self) -> None:
        self.stats.pool_series.append((self.env.now, len(self.pool)))

    # ---- queue bookkeeping on scheduler decisions ----------------------------------------------
    def _apply(self, d) -> tuple[float, float]:
        res = super()._apply(d)
        if d.preempt:
            gone = {id(s) for s, _ in d.preempt}
            for seq, mode in d.preempt:
                self.epoch[seq.rid] = self.epoch.get(seq.rid, 0) + 1
                if mode != "swap":
                    self.draft_prefill.add(seq.rid)
            self.ready = [s for s in self.ready if id(s) not in gone]
            before = len(self.pool)
            self.pool = [e for e in self.pool if id(e.seq) not in gone]
            if len(self.pool) != before:
                self._pool_changed()
                self._wake_ssm()
        for seq in d.admit:
            self.draft_prefill.add(seq.rid)
        if d.swap_in:
            for seq in d.swap_in:
                self.ready.append(seq)
            self._wake_ssm()
        return res

    # ---- the LLM engine (the replica's own process) ---------------------------------------------
    def _idle(self):
        return self.wakeup | self.pool_wake  # an arrival, or a draft the pool receives

    def run(self):
        env = self.env
        env.process(self._ssm_loop())
        while True:
            if self.wakeup.triggered:
                self.wakeup = env.event()
            if self.pool_wake.triggered:
                self.pool_wake = env.event()
            step = yield from self._decide()
            if step is None:
                continue
            decision, _, out_bytes, in_bytes = step
            prefill = [(s, n) for s, n in decision.batch if not _is_decode(s, n)]
            runnable = {id(s) for s, n in decision.batch if _is_decode(s, n)}
            entries = [e for e in self.pool if id(e.seq) in runnable][: self.b_llm]
            if not prefill and not entries:
                if self.pool and not self.back_pressure.ssm_may_run(len(self.pool)):
                    self._override = True  # nothing in the pool can run now: let the SSMs draft the rest
                    self._wake_ssm()
                yield self.wakeup | self.pool_wake
                continue
            if entries:
                taken = {id(e) for e in entries}
                self.pool = [e for e in self.pool if id(e) not in taken]
                self._pool_changed()
                self._wake_ssm()
            yield from self._llm_pass(prefill, entries, out_bytes, in_bytes)

    def _llm_pass(self, prefill, entries, out_bytes: float, in_bytes: float):
        env, blocks, p = self.env, self.blocks, self.proposer
        batch = list(prefill) + [(e.seq, 1) for e in entries]
        seqs = [s for s, _ in batch]
        n_in = np.fromiter((n for _, n in batch), dtype=np.int64, count=len(batch))
        ctx = np.fromiter((s.computed for s in seqs), dtype=np.int64, count=len(batch))
        npre = len(prefill)
        dec_pos = np.arange(npre, len(batch))
        k = np.array([e.k for e in entries], dtype=np.int64)
        k_fit = self._fit_kv(seqs, n_in, dec_pos, k)
        acc = np.array([e.accepted for e in entries], dtype=np.int64)
        acc = np.minimum(acc, k_fit)
        voted = np.array([e.voted if kf > 0 else -1 for e, kf in zip(entries, k_fit)], dtype=np.int64)
        rates = np.divide(acc, k_fit, out=np.zeros(len(entries)), where=k_fit > 0)
        q = n_in.copy()
        q[dec_pos] = p.candidates(k_fit)
        makes = np.fromiter((s.computed + n == s.num_tokens for s, n in batch), dtype=np.int64, count=len(batch))
        is_dec = np.zeros(len(batch), dtype=bool)
        is_dec[dec_pos] = True
        logits = np.where(is_dec, q, makes)
        for seq, qi in zip(seqs, q.tolist()):
            blocks.grow_to(seq, seq.computed + qi)
        work = self.cost.iteration_time_s(BatchShape(q, ctx, logits)) + p.extra_time_s(
            len(entries), int(q[dec_pos].sum())
        )
        t_plain = self._plain_time(ctx[dec_pos])
        start = env.now
        prefill_share = self.cfg.pipeline.llm_prefill_share
        yield from self.device.run("llm", work, prefill_share if npre and prefill_share is not None else None)
        end = env.now
        self.busy["llm"] += end - start
        dec = [e.seq for e in entries]
        rem = np.fromiter((s.output_len - s.generated for s in dec), dtype=np.int64, count=len(dec))
        tokens = np.minimum(acc + 1, rem)
        self._record_iteration(start, end, len(batch), int(q.sum()), int(q[:npre].sum()), out_bytes, in_bytes)
        itl: list = []
        started = self._commit_prefills(prefill, end, itl)
        if itl:
            self.metrics.add_itl(itl, 1.0)
        going = []
        if dec:
            gaps, wts, going = self._commit_verified(dec, tokens, end)
            self.metrics.add_itl(np.array(gaps), np.array(wts))
            lengths = (
                np.minimum(np.stack([e.lengths for e in entries]), k_fit[:, None])
                if entries[0].lengths is not None
                else None
            )
            s_drafted = np.array([e.s for e in entries])
            r = VerifiedRound(end, dec, k_fit, acc, tokens, voted, rates, end - start, t_plain, s_drafted, lengths)
            self.stats.round(r)
            self._learn(r, end - start)
        if self.cfg.pipeline.handoff_s > 0:
            # the verifying engine's host bookkeeping before the sequences return (no device
            # work); it holds this loop, so no scheduling decision lands in between
            yield env.timeout(self.cfg.pipeline.handoff_s)
        if started or going:
            self.ready.extend(started + going)
            self._wake_ssm()

    # ---- the SSM engine --------------------------------------------------------------------------
    def _ssm_loop(self):
        env, p = self.env, self.proposer
        while True:
            if self.ssm_wake.triggered:
                self.ssm_wake = env.event()
            if not self.back_pressure.ssm_may_run(len(self.pool)) and not self._override:
                t0 = env.now
                yield self.ssm_wake
                self.ssm_paused_s += env.now - t0
                continue
            if not self.ready:
                yield self.ssm_wake
                continue
            self._override = False
            batch = self.ready[: self.b_ssm]
            del self.ready[: len(batch)]
            epochs = [self.epoch.get(s.rid, 0) for s in batch]
            rem = np.fromiter((s.output_len - s.generated for s in batch), dtype=np.int64, count=len(batch))
            ctx = np.fromiter((s.computed for s in batch), dtype=np.int64, count=len(batch))
            s_now = p.s
            k = p.plan(rem)
            fresh = [i for i, s in enumerate(batch) if s.rid in self.draft_prefill]
            # the per-step host overhead (launches, sampling) leaves the GPU to the LLM: only the
            # SSMs' kernels contend for a shared device
            host = p.draft_overhead_s(k)
            work = p.draft_time_s(ctx, k) - host
            if fresh:
                qf = ctx[fresh]
                work += p.draft_prefill_time_s(
                    qf, np.zeros_like(qf), np.ones_like(qf), alongside=len(batch) - len(fresh)
                )
            start = env.now
            if host > 0:
                yield env.timeout(host)
            yield from self.device.run("ssm", work)
            self.busy["ssm"] += env.now - start
            acc, voted, rates, lengths = p.accept(self.rng, k, [x.rid for x in batch])
            running = {id(s) for s in self.running}
            added = 0
            for i, seq in enumerate(batch):
                if self.epoch.get(seq.rid, 0) != epochs[i] or id(seq) not in running:
                    continue  # preempted while being drafted: the draft is dropped
                self.draft_prefill.discard(seq.rid)
                self.pool.append(
                    PoolEntry(
                        seq,
                        int(k[i]),
                        int(acc[i]),
                        int(voted[i]),
                        float(rates[i]),
                        s_now,
                        None if lengths is None else lengths[i],
                    )
                )
                added += 1
            if added:
                self._pool_changed()
                self._wake_llm()

    def _mode_info(self) -> dict:
        return {
            "pipeline": {
                "placement": self.cfg.pipeline.placement,
                "shares": self.device.shares,
                "contention": self.cfg.pipeline.contention,
                "llm_batch_size": self.b_llm,
                "ssm_batch_size": self.b_ssm,
                "back_pressure": self.back_pressure.enabled,
                "ssm_paused_by_back_pressure_s": self.ssm_paused_s,
            }
        }


def replica_class(cfg: SpeculationSection):
    """The Replica subclass the simulation builds replicas from (simulation.py hook)."""
    return PipelinedReplica if cfg.pipeline_on else SpeculativeReplica


def _check_target_holds_one_sequence(sim, proposer, total: int, pool: int) -> None:
    """Colocated drafts (or Medusa heads) must leave the target a KV pool of one max_model_len
    sequence, the rule a plain pool is held to (engine/memory.py): a draft that does not fit
    beside the target is refused up front, not run with every request aborted."""
    tokens, longest = max(total, 0) * sim.spec.serving.block_size, sim.limits.max_model_len
    if tokens >= longest:
        return
    field = "speculation.medusa" if proposer.kind == "medusa" else "speculation.drafts"
    dtype = normalize_dtype(sim.spec.serving.dtype)
    raise InfersimError(
        f"{sim.source}: field '{field}': {proposer.weight_bytes(dtype) / 1e9:.1f} GB of colocated weights and "
        f"their KV leave {tokens:,} tokens of the {pool:,}-block KV pool to {sim.model.name}, fewer than "
        f"max_model_len {longest:,}; use a smaller draft, raise hardware.tensor_parallel, place the drafts "
        f"apart (speculation.pipeline.placement: separate) or lower serving.max_model_len"
    )
