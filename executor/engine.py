"""The real engine: iteration-level (continuous) batching of real requests through a real
model, with the simulator's own scheduler, preemption and admission policies.

Each loop builds a `SchedulerState` from the engine's own sequences (the attributes policies
read, see simulator/policies/state.py), asks the same scheduler object the simulator uses for
a `Decision`, and carries it out through the simulator's own decision path
(infersim.simulator.engine.decision): aborts, then preemptions (swap = a real copy of the
sequence's KV blocks to the host pool, recompute = free the blocks and prefill prompt +
generated tokens again later, from the front of the waiting queue), swap-ins (copied back), admissions (blocks for the whole prompt); then it runs
`decision.batch` through the model on the paged KV cache, samples greedily, and times the
iteration (synchronising CUDA first). Arrivals are replayed on the wall clock (real time), or,
with realtime=False, as fast as possible: when the engine would sit idle waiting for the next
arrival, its clock jumps there instead.

Metrics go into the simulator's MetricsCollector with the same meaning (one series row per
iteration, with steps = 1), so the run directory is the same as `sim run`'s; per-iteration
records (batch composition, tokens, measured times) are kept besides."""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from infersim.simulator.costmodel.measured import MeasuredCostModel
from infersim.simulator.engine.decision import apply_decision
from infersim.simulator.engine.sequence import emit_token
from infersim.simulator.policies import build_scheduler
from infersim.simulator.policies.state import SchedulerLimits, SchedulerState
from infersim.simulator.workload.schema import ServingSection

from .clock import Clock
from .kvcache import KVCacheConfig, runner_cache
from .prefix_kv import PrefixCachedKV
from .runner import build_runner, plan_batch
from .sequence import CachedSequence, ExecSequence


@dataclass
class ExecRequest:
    prompt_ids: list[int]
    output_len: int
    arrival_s: float = 0.0


ITERATION_COLUMNS = (
    "iteration",
    "t_start_s",
    "t_end_s",
    "forward_s",
    "schedule_s",
    "swap_s",
    "batch_size",
    "prefill_seqs",
    "decode_seqs",
    "batch_tokens",
    "prefill_tokens",
    "decode_tokens",
    "context_tokens",
    "max_context_tokens",
    "attended_tokens",
    "tokens_out",
    "gpu_blocks_used",
    "cpu_blocks_used",
    "waiting",
    "swapped",
    "admitted",
    "preempt_swap",
    "preempt_recompute",
    "swap_out_blocks",
    "swap_in_blocks",
    "aborted",
    "swap_out_copies",
    "swap_in_copies",
    "t_intake_s",
)
BATCH_COLUMNS = ("iteration", "rid", "query_tokens", "context_tokens", "makes_token")


@dataclass
class EngineStats:
    iterations: list = field(default_factory=list)  # tuples in ITERATION_COLUMNS order
    batches: list = field(default_factory=list)  # tuples in BATCH_COLUMNS order
    forward_s: float = 0.0
    schedule_s: float = 0.0
    swap_s: float = 0.0

    def iteration_table(self) -> dict[str, np.ndarray]:
        a = np.array(self.iterations, dtype=np.float64).reshape(-1, len(ITERATION_COLUMNS))
        return {
            c: (a[:, i].astype(np.int64) if c not in _FLOAT_COLS else a[:, i]) for i, c in enumerate(ITERATION_COLUMNS)
        }

    def batch_table(self) -> dict[str, np.ndarray]:
        a = np.array(self.batches, dtype=np.int64).reshape(-1, len(BATCH_COLUMNS))
        return {c: a[:, i] for i, c in enumerate(BATCH_COLUMNS)}


_FLOAT_COLS = {"t_start_s", "t_end_s", "forward_s", "schedule_s", "swap_s", "t_intake_s"}


class _TimedSwaps:
    """The engine's KV operations (the paged cache, or its prefix-caching accounting) as the
    decision path's, with each swap timed (the device synchronised) and fed to the engine's
    measured cost model."""

    def __init__(self, cache, sync, cost_model):
        self.cache, self.sync, self.cost_model = cache, sync, cost_model
        self.swap_s = 0.0
        self.copies = {"d2h": 0, "h2d": 0}

    def free(self, seq) -> None:
        self.cache.free(seq)

    def grow_to(self, seq, tokens: int) -> int:
        return self.cache.grow_to(seq, tokens)

    def admit(self, seq, query_tokens: int) -> int:
        admit = getattr(self.cache, "admit", None)
        if admit is None:
            self.cache.grow_to(seq, seq.num_tokens)
            return query_tokens
        return admit(seq, query_tokens)

    def swap_out(self, seqs: list) -> int:
        return self._timed(self.cache.swap_out, seqs, "d2h")

    def swap_in(self, seqs: list) -> int:
        return self._timed(self.cache.swap_in, seqs, "h2d")

    def _timed(self, move, seqs: list, direction: str) -> int:
        calls = self.cache.copy_calls
        t = time.perf_counter()
        n = move(seqs)
        self.sync()
        dt = time.perf_counter() - t
        self.copies[direction] += self.cache.copy_calls - calls
        self.swap_s += dt
        self.cost_model.observe_transfer(n * self.cache.bytes_per_block, dt, direction)
        return n


class Engine:
    """One replica serving real requests.

    model: a LoadedModel (executor.models); scheduler: from simulator.policies.build_scheduler;
    kv: the paged cache's pools (its dtype None: the model's); metrics: a simulator
    MetricsCollector (or None for none)."""

    def __init__(
        self,
        model,
        scheduler,
        kv: KVCacheConfig,
        *,
        limits: SchedulerLimits | None = None,
        metrics=None,
        cost_model=None,
        realtime: bool = True,
        record: bool = True,
    ):
        self.lm = model
        self.runner = build_runner(model)
        self.device = model.device
        self.kv_config = replace(kv, dtype=kv.dtype or model.dtype)
        self.cache = runner_cache(self.runner, self.kv_config, model.device)
        # the KV operations the decisions go through: the cache itself, or with prefix caching
        # the simulator's prefix-caching accounting over its blocks (executor/prefix_kv.py)
        self._prefix_kv = None
        self.sequence_class = ExecSequence
        if kv.prefix_caching:
            self._prefix_kv = PrefixCachedKV(self.cache, kv.watermark)
            self.sequence_class = CachedSequence
        self.scheduler = scheduler
        self.limits = limits or SchedulerLimits(max_model_len=model.max_positions)
        self.metrics = metrics
        self.cost_model = cost_model or MeasuredCostModel()
        self.realtime = realtime
        self.record = record
        self.waiting: list[ExecSequence] = []
        self.running: list[ExecSequence] = []
        self.swapped: list[ExecSequence] = []
        self.finished: list[ExecSequence] = []
        self.stats = EngineStats()
        self.counters = {"preempt_swap": 0, "preempt_recompute": 0, "swap_out_blocks": 0, "swap_in_blocks": 0}
        self._iteration = 0
        self.clock: Clock | None = None  # started by the first run()
        self._arrivals: list = []  # heap of (time, order, factory)
        self._order = 0
        self.on_finish = None  # callback(seq, now) (closed-loop clients)

    @property
    def kv(self):
        """The KV operations decisions go through: the paged cache (which a subclass may
        replace), or the prefix-caching accounting over it."""
        return self.cache if self._prefix_kv is None else self._prefix_kv

    # ---- clock ---------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock.now()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _wait_until(self, t: float) -> None:
        self.clock.wait_until(t)

    # ---- requests --------------------------------------------------------------------------
    def submit(self, seq: ExecSequence) -> None:
        """A sequence that arrives at seq.arrival_s (engine clock)."""
        heapq.heappush(self._arrivals, (seq.arrival_s, self._order, seq))
        self._order += 1

    def _deliver(self) -> None:
        now = self.now()
        while self._arrivals and self._arrivals[0][0] <= now:
            _, _, seq = heapq.heappop(self._arrivals)
            if self.metrics is not None:
                self.metrics.arrive(seq)
            self.waiting.append(seq)

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    # ---- warm-up ---------------------------------------------------------------------------
    def warmup(self, prompt_len: int = 32) -> None:
        """One prefill and one decode through the cache (first-call overheads, a first
        estimate for the cost model, a probe of the host copy bandwidth); leaves no trace."""
        n = max(
            2, min(prompt_len, self.limits.max_model_len - 1, (self.cache.total_gpu - 1) * self.cache.block_size - 1)
        )
        seq = ExecSequence(-1, [0] * n, 2, 0.0)
        self.cache.grow_to(seq, n)
        self._sync()
        t = time.perf_counter()
        self.runner.forward(plan_batch(self.cache, [(seq, n)], self.device), self.cache)
        self._sync()
        t_prefill = time.perf_counter() - t
        seq.computed = n - 1
        t = time.perf_counter()
        self.runner.forward(plan_batch(self.cache, [(seq, 1)], self.device), self.cache)
        self._sync()
        t_decode = time.perf_counter() - t
        self.cost_model.observe_iteration(1, t_decode)
        self.cost_model.observe_iteration(n, t_prefill)
        if self.cache.total_cpu >= len(seq.block_table):
            nbytes = len(seq.block_table) * self.cache.bytes_per_block
            t = time.perf_counter()
            self.cache.swap_out([seq])
            self._sync()
            self.cost_model.observe_transfer(nbytes, time.perf_counter() - t, "d2h")
            t = time.perf_counter()
            self.cache.swap_in([seq])
            self._sync()
            self.cost_model.observe_transfer(nbytes, time.perf_counter() - t, "h2d")
        self.cache.free(seq)

    # ---- the loop ----------------------------------------------------------------------------
    def run(self) -> float:
        """Serve everything submitted (and whatever on_finish submits) to completion;
        returns the engine clock at the end."""
        if self.clock is None:
            self.clock = Clock(self.realtime)
        while True:
            self._deliver()
            # the decision point: the arrivals the next schedule sees are those taken in by now
            # (the replay decides there; grow_to, plan_batch and a speed tick come after it)
            self._intake_s = self.now()
            if not self.outstanding:
                if not self._arrivals:
                    break
                self._wait_until(self._arrivals[0][0])
                continue
            t_sched = time.perf_counter()
            state = self._state()
            decision = self.scheduler.schedule(state)
            sched_s = time.perf_counter() - t_sched
            moved = self._apply(decision)
            if not decision.batch:
                if decision.abort or decision.preempt or decision.swap_in:
                    continue
                if not self._arrivals:
                    raise RuntimeError(
                        f"engine stuck: {self.outstanding} requests can never be scheduled "
                        f"(waiting {len(self.waiting)}, swapped {len(self.swapped)})"
                    )
                self._wait_until(self._arrivals[0][0])
                continue
            self.clock.step()
            self._run_batch(decision, sched_s, moved)
        return self.now()

    def _state(self) -> SchedulerState:
        c = self.kv
        return SchedulerState(
            now_s=self.now(),
            waiting=self.waiting,
            running=self.running,
            swapped=self.swapped,
            free_gpu_blocks=c.free_gpu,
            free_cpu_blocks=c.free_cpu,
            total_gpu_blocks=c.total_gpu,
            block_size=c.block_size,
            watermark_blocks=c.watermark_blocks,
            kv_bytes_per_block=self.cache.bytes_per_block,
            limits=self.limits,
            cost_model=self.cost_model,
            releasable_blocks=None if self._prefix_kv is None else self._prefix_kv.releasable,
        )

    def _apply(self, d) -> dict:
        """Carry out a decision on the paged cache through the simulator's own decision path
        (infersim.simulator.engine.decision), timing the swaps."""
        swaps = _TimedSwaps(self.kv, self._sync, self.cost_model)
        done = apply_decision(
            d,
            self,
            swaps,
            now_s=self.now(),
            swap_only=self.scheduler.preemption.swap_only,
            bytes_per_block=self.cache.bytes_per_block,
            metrics=self.metrics,
        )
        moved = {
            "out_blocks": done.out_blocks,
            "in_blocks": done.in_blocks,
            "out_copies": swaps.copies["d2h"],
            "in_copies": swaps.copies["h2d"],
            "swap_s": swaps.swap_s,
            "preempt_swap": done.preempt_swap,
            "preempt_recompute": done.preempt_recompute,
            "admitted": done.admitted,
            "aborted": done.aborted,
        }
        for key in ("preempt_swap", "preempt_recompute"):
            self.counters[key] += moved[key]
        self.counters["swap_out_blocks"] += done.out_blocks
        self.counters["swap_in_blocks"] += done.in_blocks
        self.stats.swap_s += swaps.swap_s
        return moved

    def abort(self, seq: ExecSequence, now_s: float) -> None:
        seq.aborted = True
        self._finish(seq, now_s, aborted=True)

    def _run_batch(self, d, sched_s: float, moved: dict) -> None:
        batch = d.batch
        cache, kv = self.cache, self.kv
        q = np.fromiter((n for _, n in batch), dtype=np.int64, count=len(batch))
        ctx = np.fromiter((s.computed for s, _ in batch), dtype=np.int64, count=len(batch))
        makes = [s.computed + n == s.num_tokens for s, n in batch]
        for seq, n in batch:
            kv.grow_to(seq, seq.computed + n)
        plan = plan_batch(cache, batch, self.device)
        start = self.now()
        t = time.perf_counter()
        logits = self.runner.forward(plan, cache)
        next_tokens = logits.argmax(dim=-1).tolist()  # greedy; .tolist() synchronises
        self._sync()
        forward_s = time.perf_counter() - t
        end = self.now()
        self.stats.forward_s += forward_s
        self.stats.schedule_s += sched_s
        tokens = int(q.sum())
        self.cost_model.observe_iteration(tokens, forward_s)
        prefill_mask = ctx < np.fromiter((s.num_tokens - 1 for s, _ in batch), dtype=np.int64, count=len(batch))
        m = self.metrics
        if m is not None:
            bpb = cache.bytes_per_block
            m.segment(
                (
                    start,
                    end,
                    0,
                    1,
                    len(batch),
                    tokens,
                    int(q[q > 1].sum()),
                    kv.used_gpu,
                    kv.used_cpu,
                    len(self.waiting),
                    len(self.swapped),
                    moved["out_blocks"] * bpb,
                    moved["in_blocks"] * bpb,
                    getattr(kv, "cached_gpu", 0),
                )
            )
        it = self._iteration
        if self.record:
            st = self.stats
            st.iterations.append(
                (
                    it,
                    start,
                    end,
                    forward_s,
                    sched_s,
                    moved["swap_s"],
                    len(batch),
                    int(prefill_mask.sum()),
                    int((~prefill_mask).sum()),
                    tokens,
                    int(q[prefill_mask].sum()),
                    int(q[~prefill_mask].sum()),
                    int(ctx.sum()),
                    int(ctx.max()),
                    int((ctx + q).sum()),
                    len(next_tokens),
                    kv.used_gpu,
                    kv.used_cpu,
                    len(self.waiting),
                    len(self.swapped),
                    moved["admitted"],
                    moved["preempt_swap"],
                    moved["preempt_recompute"],
                    moved["out_blocks"],
                    moved["in_blocks"],
                    moved["aborted"],
                    moved["out_copies"],
                    moved["in_copies"],
                    self._intake_s,
                )
            )
            st.batches.extend((it, s.rid, int(n), int(c), int(mk)) for (s, n), c, mk in zip(batch, ctx, makes))
        self._iteration += 1
        itl = []
        k = 0
        for (seq, n), mk in zip(batch, makes):
            seq.computed += n
            if not mk:
                continue
            seq.tokens.append(int(next_tokens[k]))
            k += 1
            if emit_token(seq, end, itl):
                self.running.remove(seq)
                kv.free(seq)
                self._finish(seq, end)
        if itl and m is not None:
            m.add_itl(itl, 1.0)

    def _finish(self, seq: ExecSequence, now: float, aborted: bool = False) -> None:
        seq.finish_s = now
        self.finished.append(seq)
        if self.metrics is not None:
            reason = self.limits.abort_reason(seq.num_tokens) if aborted else "unknown"
            self.metrics.finish(seq, now, aborted=aborted, reason=reason)
        if self.on_finish is not None:
            self.on_finish(seq, now)


def generate(
    model, prompts: list[list[int]], max_new_tokens, serving: ServingSection | None = None, arrival_s=None
) -> tuple[list[list[int]], Engine]:
    """Greedy generation of many prompts at once through the engine (continuous batching):
    returns the generated token ids per prompt and the engine (its counters tell what
    happened: preemptions, swaps). `serving` is a workload's `serving:` section (scheduler,
    preemption, pools, batch limits; default its defaults), except that without gpu_blocks the
    pool holds every request and without cpu_blocks there is no host pool; with
    `serving.prefix_caching` `engine.kv.stats` has the cache hits. All requests arrive at once
    unless `arrival_s` is given."""
    sv = serving or ServingSection()
    n = len(prompts)
    outs = [int(max_new_tokens)] * n if np.isscalar(max_new_tokens) else [int(x) for x in max_new_tokens]
    gpu_blocks = sv.gpu_blocks
    if gpu_blocks is None:
        need = sum(-(-(len(p) + o) // sv.block_size) for p, o in zip(prompts, outs))
        gpu_blocks = need + 1
    max_len = min(sv.max_model_len or model.max_positions, model.max_positions)
    limits = SchedulerLimits(
        sv.max_batch_size, sv.max_batched_tokens or max(max_len, 2048), max_len, sv.chunked_prefill
    )
    kv = KVCacheConfig.from_serving(sv, gpu_blocks, sv.cpu_blocks or 0)
    eng = Engine(model, build_scheduler(sv.scheduler, sv.preemption), kv, limits=limits, realtime=False)
    seqs = []
    for i, (p, o) in enumerate(zip(prompts, outs)):
        s = eng.sequence_class(i, p, o, 0.0 if arrival_s is None else float(arrival_s[i]))
        seqs.append(s)
        eng.submit(s)
    eng.run()
    unfinished = [s for s in seqs if s.aborted]
    if unfinished:
        raise RuntimeError(f"{len(unfinished)} requests were aborted (too long for the KV pool or max_model_len)")
    return [s.output_ids for s in seqs], eng
