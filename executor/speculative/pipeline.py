"""Minions section 3.4 on real models: the drafts (SSMs) and the target (LLM) run concurrently,
joined by an intermediate result pool.

Two threads share the batch of sequences, split into groups: the drafting thread takes up to
`ssm_batch_size` sequences whose last verification is done, drafts s tokens for them (every
draft, the majority vote) and puts them into the pool; the verifying thread (the caller's)
takes up to `llm_batch_size` drafted sequences from the pool, prefills newly admitted ones in
the same pass, verifies, updates the SSM weights and the selector, and hands the sequences
back for drafting. Back-pressure (the simulator's `PoolBackPressure`): the drafting thread
pauses while the pool holds at least `llm_batch_size` sequences. A sequence is in exactly one
place (ready, being drafted, pool, being verified), so its tokens and caches are touched by one
thread at a time; the drafts' caches belong to the drafting thread (finished sequences' draft
blocks are released there), the target's cache to the verifying thread.

Threads and torch: `torch.set_num_threads` is per process (intra-op pool), not per thread, so
"each engine its own thread count" is done here by setting the process to 1 intra-op thread
for the duration (restored after): each Python thread then runs its ops on its own core
(torch releases the GIL inside kernels). On models this small most of a step is Python and
dispatch work under the GIL, so the overlap is partial; benchmarks/RESULTS-speculative.md
measures it. The output is still token for token the target's greedy output; which sequences
share a verification depends on timing, so the statistics vary from run to run.

The selector (simulator's AdaptiveLengthSelector) sees t = the period between the ends of
successive verifications (Minions' `period` measure: equal to the LLM's time while the SSMs
keep up, larger when they do not) and vl = mean tokens per sequence of that verification."""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from infersim.simulator.errors import InfersimError
from infersim.simulator.speculative.minions import PoolBackPressure

from ..clock import Clock
from .decoder import DecodeStats, admit_arrived, round_row, verified_length
from .remote import RemoteProposer

# While both threads run Python (most of a step on small models), the one waiting for the GIL
# gets it only when the holder blocks or the interpreter's switch interval (5 ms by default)
# runs out: on passes of a few milliseconds that wait, not the two cores, was most of the
# contention (overlapped verifying passes took 1.3-2.6x their solo time and the factor moved
# from run to run). A 0.2 ms interval lets the threads hand over at a grain finer than a pass;
# restored when the run ends.
SWITCH_INTERVAL_S = 0.0002

# speculation_drafting.parquet: sequences drafted, s, pool depth after the round, wait for work,
# and the committed tokens of the sequences drafted for the first time (their prompts and first
# token), which each draft prefills in its first step (the simulator's lazy draft prefill)
DRAFTING_COLUMNS = ("t_start_s", "t_end_s", "sequences", "s", "pool_depth", "waited_s", "prompt_tokens")


@dataclass(frozen=True)
class PipelineOptions:
    """How the PipelinedDecoder splits the batch and shares the process between its threads."""

    llm_batch_size: int | None = field(
        default=None, metadata={"help": "drafted sequences one verification takes; None: half the max batch size"}
    )
    ssm_batch_size: int | None = field(
        default=None, metadata={"help": "ready sequences one drafting round takes; None: llm_batch_size"}
    )
    back_pressure: bool = field(
        default=True, metadata={"help": "drafting pauses while the pool holds llm_batch_size sequences"}
    )
    intra_op_threads: int = field(
        default=1, metadata={"help": "torch's intra-op threads for the process while the run lasts"}
    )
    switch_interval_s: float | None = field(
        default=SWITCH_INTERVAL_S,
        metadata={"help": "the interpreter's GIL switch interval while the two threads run; None: Python's (5 ms)"},
    )
    drafting: str = field(
        default="auto",
        metadata={
            "help": "where the drafts run: process (their own, remote.py: no contention for the interpreter), "
            "thread (this process's drafting thread), auto (a process when the target runs on the CPU, where "
            "two threads contended 2.3-2.9x; on a GPU the kernels run asynchronously and a thread holds the "
            "interpreter briefly)"
        },
    )


class _Exchange:
    """What the two threads share during one run, all guarded by `cond`: the sequences ready to
    draft, the pool of drafted ones, the finished ones whose draft caches the drafting thread
    frees, and the drafting thread's state."""

    def __init__(self):
        self.cond = threading.Condition()
        self.ready: deque = deque()
        self.pool: deque = deque()  # (seq, proposal, index in it, s drafted) per sequence
        self.finished_drafts: deque = deque()
        self.stop = False
        self.error: BaseException | None = None
        # the drafting thread sits in its wait for work (so does its process); a speed tick
        # (Clock.step) is taken only then, holding `cond`, so neither engine moves while the
        # clock stands still
        self.drafter_idle = False
        self.seen: set[int] = set()  # sequences the drafts have drafted for (touched by the drafting thread)


@dataclass
class _Verification:
    """One pass of the verifying thread: what it took and what it measured."""

    prefill: list  # sequences admitted for this pass (prefilled in it)
    taken: list  # (seq, proposal, index in it, s drafted) from the pool
    t_start_s: float  # engine clock
    released_blocks: int  # the target's count of released KV blocks before the pass
    results: list = field(default_factory=list)  # (accepted, last token) per taken sequence
    verify_s: float = 0.0  # the target's step, wall time
    t_end_s: float = 0.0  # engine clock, after the feedback
    accepted: int = 0  # drafted tokens accepted, all sequences


class PipelinedDecoder:
    def __init__(self, decoder, opts: PipelineOptions | None = None, **options):
        """decoder: a SpeculativeDecoder (its target, proposer, selector, s and temperature are
        used); opts and `options` (PipelineOptions' fields, which override it): how it pipelines.
        Call close() when done with a drafting process."""
        o = replace(opts or PipelineOptions(), **options)
        if decoder.temperature > 0:
            raise InfersimError("the pipelined decoder verifies greedily only (speculation.sampling.mode: greedy)")
        self.dec = decoder
        self.target, self.proposer = decoder.target, decoder.proposer
        self.drafting = self._drafting_place(o)
        self.remote = None
        if self.drafting == "process":
            # started here, before the engine's clock: loading the drafts takes seconds
            self.remote = RemoteProposer(self.proposer, threads=o.intra_op_threads)
        self.llm_batch_size = int(o.llm_batch_size or max(1, decoder.max_batch_size // 2))
        self.ssm_batch_size = int(o.ssm_batch_size or self.llm_batch_size)
        self.rule = PoolBackPressure(self.llm_batch_size, o.back_pressure)
        self.intra_op_threads = int(o.intra_op_threads)
        self.switch_interval_s = o.switch_interval_s
        self.stats: DecodeStats = decoder.stats
        self.draft_rounds: list[tuple] = []
        self.pool_depth_series: list[tuple[float, int]] = []
        self.s_series = decoder.s_series
        # MinionsProposer: its weights change in the verifying thread while the drafting thread votes
        self._weights_lock = threading.Lock()
        if hasattr(self.proposer, "lock"):
            self.proposer.lock = self._weights_lock

    def _drafting_place(self, o: PipelineOptions) -> str:
        """process or thread, as the options ask (auto: a process when the target is on the CPU
        and there are drafts to move there)."""
        if o.switch_interval_s is not None and not o.switch_interval_s > 0:
            raise InfersimError(f"pipelined decoder: switch_interval_s must be positive, got {o.switch_interval_s}")
        if o.drafting not in ("auto", "thread", "process"):
            raise InfersimError(f"pipelined decoder: drafting must be auto, thread or process, got {o.drafting!r}")
        if o.drafting != "auto":
            return o.drafting
        cpu = str(getattr(self.target, "device", "cpu")).startswith("cpu")
        return "process" if cpu and getattr(self.proposer, "drafts", None) else "thread"

    def drafting_table(self) -> dict[str, np.ndarray]:
        """speculation_drafting.parquet: one row per drafting round of the drafting thread
        (start, end, sequences, s, pool depth after, time it waited for work), which the
        validation needs to price the SSM engine (analysis/validate/spec_rounds.py)."""
        rows = np.array(self.draft_rounds, dtype=np.float64).reshape(-1, len(DRAFTING_COLUMNS))
        return {
            c: (rows[:, i] if c.endswith("_s") else rows[:, i].astype(np.int64)) for i, c in enumerate(DRAFTING_COLUMNS)
        }

    def generate(self, seqs, progress=None, clock=None, observer=None) -> list[list[int]]:
        old_threads, old_switch = torch.get_num_threads(), sys.getswitchinterval()
        torch.set_num_threads(self.intra_op_threads)
        if self.switch_interval_s is not None:
            sys.setswitchinterval(self.switch_interval_s)
        try:
            return self._run(list(seqs), progress, clock or Clock(realtime=False), observer)
        finally:
            torch.set_num_threads(old_threads)
            sys.setswitchinterval(old_switch)

    def _run(self, seqs, progress, clock, observer):
        ex = _Exchange()
        drafting_side = self.remote if self.remote is not None else self.proposer
        th = threading.Thread(
            target=self._drafting_loop, args=(ex, drafting_side, clock.now), name="ssm-drafter", daemon=True
        )
        th.start()
        try:
            self._verifying_loop(ex, seqs, progress, clock, observer)
        finally:
            with ex.cond:
                ex.stop = True
                ex.cond.notify_all()
            th.join()
        for seq in ex.finished_drafts:
            drafting_side.release(seq)
        return [s.output_ids for s in seqs]

    # ---- the drafting thread ----------------------------------------------------------------
    def _drafting_loop(self, ex: _Exchange, drafting_side, now) -> None:
        try:
            while True:
                work = self._wait_for_drafting_work(ex)
                if work is None:
                    return
                group, done, waited_s = work
                for seq in done:
                    drafting_side.release(seq)
                self._draft_group(ex, drafting_side, now, group, waited_s)
        except BaseException as exc:  # surfaced in the verifying thread
            with ex.cond:
                ex.error = exc
                ex.cond.notify_all()

    def _wait_for_drafting_work(self, ex: _Exchange):
        """(group to draft, finished sequences to release, seconds waited), or None once the run
        stops; waits while nothing is ready or back-pressure holds the drafts."""
        with ex.cond:
            tw = time.perf_counter()
            ex.drafter_idle = True
            while not ex.stop and not (ex.ready and self.rule.ssm_may_run(len(ex.pool))):
                ex.cond.wait()
            ex.drafter_idle = False
            if ex.stop:
                return None
            waited_s = time.perf_counter() - tw
            group = [ex.ready.popleft() for _ in range(min(self.ssm_batch_size, len(ex.ready)))]
            done = [ex.finished_drafts.popleft() for _ in range(len(ex.finished_drafts))]
        return group, done, waited_s

    def _draft_group(self, ex: _Exchange, drafting_side, now, group: list, waited_s: float) -> None:
        """Draft s tokens (fewer near a sequence's end) for the group and put it into the pool."""
        ts = now()
        s = self.dec.s
        s_list = [max(0, min(s, seq.remaining - 1)) for seq in group]
        fresh = sum(len(seq.tokens) for seq in group if seq.rid not in ex.seen)
        ex.seen.update(seq.rid for seq in group)
        prop = drafting_side.propose(group, s_list, 0.0, None)
        with ex.cond:
            ex.pool.extend((seq, prop, i, s_list[i]) for i, seq in enumerate(group))
            depth = len(ex.pool)
            ex.cond.notify_all()
        self.draft_rounds.append((ts, now(), len(group), s, depth, waited_s, fresh))

    # ---- the verifying thread (the caller's) ------------------------------------------------
    def _verifying_loop(self, ex: _Exchange, seqs, progress, clock, observer) -> None:
        waiting = sorted(seqs, key=lambda s: (s.arrival_s, s.rid))
        running = 0
        last_end = None
        while waiting or running:
            prefill = admit_arrived(self.dec, waiting, running, clock, observer)
            if not prefill and not running:
                if waiting and waiting[0].arrival_s > clock.now():
                    clock.wait_until(waiting[0].arrival_s)
                    continue
                raise InfersimError(f"request {waiting[0].rid} does not fit the KV pool")
            running += len(prefill)
            taken = self._take_drafted(ex, waiting, running, prefill, clock)
            if taken is None:
                continue
            v = _Verification(prefill, taken, clock.now(), self.target.released_blocks)
            self._verify(v)
            v.t_end_s = clock.now()
            self._adapt_s(v, last_end)
            last_end = v.t_end_s
            self._record_round(v, observer)
            running -= self._hand_back(ex, v, observer, progress)

    def _take_drafted(self, ex: _Exchange, waiting: list, running: int, prefill: list, clock):
        """Up to llm_batch_size drafted sequences from the pool (waiting for the drafting thread
        when there is nothing to verify or prefill); None: nothing to do yet."""
        with ex.cond:
            while not ex.pool and not prefill and ex.error is None:
                # nothing drafted yet: wait for the drafting thread, or for an arrival
                if waiting and running < self.dec.max_batch_size and waiting[0].arrival_s <= clock.now():
                    break
                ex.cond.wait(timeout=0.01 if waiting else None)
            if ex.error is not None:
                raise ex.error
            if not ex.pool and not prefill:
                return None
            taken = [ex.pool.popleft() for _ in range(min(self.llm_batch_size, len(ex.pool)))]
            self.pool_depth_series.append((clock.now(), len(ex.pool)))
            clock.step(may_tick=ex.drafter_idle, companion=self.remote)
            ex.cond.notify_all()  # the pool shrank: back-pressure may lift
        return taken

    def _verify(self, v: _Verification) -> None:
        """The target's pass (prefills and verifications), then the proposer's feedback and the
        acceptance record."""
        items = [(seq, prop.tokens[i], None) for seq, prop, i, _ in v.taken]
        tv = time.perf_counter()
        v.results = self.target.step(v.prefill, items, 0.0, None)
        self.dec._sync()
        v.verify_s = time.perf_counter() - tv
        self._feed_back(v.taken, v.results)
        for (_, _, _, si), (k, _) in zip(v.taken, v.results):
            self.stats.recorder.add(si, k)
            v.accepted += k

    def _feed_back(self, taken: list, results: list) -> None:
        """The proposer's feedback, per drafting group (its bookkeeping is per proposal)."""
        by_prop: dict[int, list] = {}
        for (seq, prop, i, si), res in zip(taken, results):
            by_prop.setdefault(id(prop), [prop, [], [], []])
            e = by_prop[id(prop)]
            e[1].append(i)
            e[2].append(res)
            e[3].append(si)
        with self._weights_lock:
            for prop, idx, res, sl in by_prop.values():
                sub = type(prop)(
                    [prop.tokens[i] for i in idx],
                    None,
                    [[o[i] for i in idx] for o in prop.outputs] if prop.outputs else None,
                    [prop.voted[i] for i in idx] if prop.voted else None,
                )
                self.proposer.feedback([None] * len(idx), sub, res, sl)

    def _adapt_s(self, v: _Verification, last_end: float | None) -> None:
        """The selector observes the period since the previous verification ended (Minions'
        `period`) and the tokens per sequence of this one."""
        if self.dec.selector is None or not sum(si for *_, si in v.taken):
            return
        period = v.t_end_s - (last_end if last_end is not None else v.t_start_s)
        s_used = max(x[3] for x in v.taken)
        self.dec.selector.observe(period, verified_length(v.results, [x[3] for x in v.taken], s_used))

    def _record_round(self, v: _Verification, observer) -> None:
        """The round's row of speculation_rounds, the s series, and the observer's metrics."""
        s_now = self.dec.s
        if not self.s_series or self.s_series[-1][1] != s_now:
            self.s_series.append((len(self.stats.rounds), s_now))
        drafted = sum(si for *_, si in v.taken)
        counts = (s_now, drafted, v.accepted, len(v.prefill) + v.accepted + len(v.results), 0)
        n_seqs = (len(v.prefill), len(v.taken))
        times_s = (v.t_start_s, v.t_end_s, 0.0, v.verify_s)
        self.stats.rounds.append(
            round_row(len(self.stats.rounds), times_s, n_seqs, counts, self.target, v.released_blocks)
        )
        if observer is not None and hasattr(observer, "note_drafted"):
            observer.note_drafted([x[3] for x in v.taken])  # what each verified sequence drafted
        if observer is not None:
            observer.on_round(
                v.prefill,
                [x[0] for x in v.taken],
                v.results,
                v.t_start_s,
                v.t_end_s,
                self.target.released_blocks - v.released_blocks,
            )

    def _hand_back(self, ex: _Exchange, v: _Verification, observer, progress) -> int:
        """Finished sequences leave (their target blocks freed here, their draft blocks by the
        drafting thread); the others go back for drafting. Returns how many finished."""
        dec = self.dec
        back, finished = [], 0
        for seq in v.prefill + [x[0] for x in v.taken]:
            seq.rounds += 1
            if not seq.done:
                back.append(seq)
                continue
            finished += 1
            dec._reserved -= dec._need(seq)
            self.target.release(seq)
            with ex.cond:
                ex.finished_drafts.append(seq)
            if observer is not None:
                observer.on_finish(seq, v.t_end_s)
            if progress is not None:
                progress(seq)
        with ex.cond:
            ex.ready.extend(back)
            ex.cond.notify_all()
        return finished

    def close(self) -> None:
        """Stop the drafting process (if any)."""
        if self.remote is not None:
            self.remote.close()
