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


class PipelinedDecoder:
    def __init__(
        self,
        decoder,
        *,
        llm_batch_size: int | None = None,
        ssm_batch_size: int | None = None,
        back_pressure: bool = True,
        intra_op_threads: int = 1,
        switch_interval_s: float | None = SWITCH_INTERVAL_S,
        drafting: str = "auto",
    ):
        """decoder: a SpeculativeDecoder (its target, proposer, selector, s and temperature are used).
        switch_interval_s: the interpreter's GIL switch interval while the two threads run (None:
        leave Python's, 5 ms by default). drafting: where the drafts run: `process` (their own
        process, remote.py: no contention for the interpreter), `thread` (this process's
        drafting thread), `auto` (a process when the target runs on the CPU, where the two
        threads' contention was 2.3-2.9x; on a GPU the kernels run asynchronously and a thread
        holds the interpreter briefly). Call close() when done with a process."""
        if decoder.temperature > 0:
            raise InfersimError("the pipelined decoder verifies greedily only (speculation.sampling.mode: greedy)")
        self.dec = decoder
        self.target, self.proposer = decoder.target, decoder.proposer
        if switch_interval_s is not None and not switch_interval_s > 0:
            raise InfersimError(f"pipelined decoder: switch_interval_s must be positive, got {switch_interval_s}")
        if drafting not in ("auto", "thread", "process"):
            raise InfersimError(f"pipelined decoder: drafting must be auto, thread or process, got {drafting!r}")
        if drafting == "auto":
            cpu = str(getattr(self.target, "device", "cpu")).startswith("cpu")
            drafting = "process" if cpu and getattr(self.proposer, "drafts", None) else "thread"
        self.drafting = drafting
        self.remote = None
        if drafting == "process":
            # started here, before the engine's clock: loading the drafts takes seconds
            self.remote = RemoteProposer(self.proposer, threads=intra_op_threads)
        mb = decoder.max_batch_size
        self.llm_batch_size = int(llm_batch_size or max(1, mb // 2))
        self.ssm_batch_size = int(ssm_batch_size or self.llm_batch_size)
        self.rule = PoolBackPressure(self.llm_batch_size, back_pressure)
        self.intra_op_threads = int(intra_op_threads)
        self.switch_interval_s = switch_interval_s
        self.stats: DecodeStats = decoder.stats
        self.draft_rounds: list[tuple] = []
        self.pool_depth_series: list[tuple[float, int]] = []
        self.s_series = decoder.s_series
        # MinionsProposer: its weights change in the verifying thread while the drafting thread votes
        self._weights_lock = threading.Lock()
        if hasattr(self.proposer, "lock"):
            self.proposer.lock = self._weights_lock

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
        dec = self.dec
        cond = threading.Condition()
        ready: deque = deque()
        pool: deque = deque()  # (seq, tokens, s_i, proposal, index) per sequence
        finished_drafts: deque = deque()  # sequences whose draft caches the drafting thread frees
        # drafter_idle: the drafting thread sits in its wait for work (so does its process); a
        # speed tick (Clock.step) is taken only then, holding `cond`, so neither engine moves while
        # the clock stands still
        state = {"stop": False, "error": None, "drafter_idle": False}
        now = clock.now
        drafting_side = self.remote if self.remote is not None else self.proposer
        seen: set[int] = set()  # sequences the drafts have drafted for

        def drafter():
            try:
                while True:
                    with cond:
                        tw = time.perf_counter()
                        state["drafter_idle"] = True
                        while not state["stop"] and not (ready and self.rule.ssm_may_run(len(pool))):
                            cond.wait()
                        state["drafter_idle"] = False
                        if state["stop"]:
                            return
                        waited = time.perf_counter() - tw
                        group = [ready.popleft() for _ in range(min(self.ssm_batch_size, len(ready)))]
                        done = [finished_drafts.popleft() for _ in range(len(finished_drafts))]
                    for seq in done:
                        drafting_side.release(seq)
                    ts = now()
                    s = dec.s
                    s_list = [max(0, min(s, seq.remaining - 1)) for seq in group]
                    fresh = sum(len(seq.tokens) for seq in group if seq.rid not in seen)
                    seen.update(seq.rid for seq in group)
                    prop = drafting_side.propose(group, s_list, 0.0, None)
                    with cond:
                        pool.extend((seq, prop, i, s_list[i]) for i, seq in enumerate(group))
                        depth = len(pool)
                        cond.notify_all()
                    self.draft_rounds.append((ts, now(), len(group), s, depth, waited, fresh))
            except BaseException as exc:  # surfaced in the verifying thread
                with cond:
                    state["error"] = exc
                    cond.notify_all()

        th = threading.Thread(target=drafter, name="ssm-drafter", daemon=True)
        th.start()
        waiting = sorted(seqs, key=lambda s: (s.arrival_s, s.rid))
        running = 0
        last_end = None
        try:
            while waiting or running:
                prefill = admit_arrived(dec, waiting, running, clock, observer)
                if not prefill and not running:
                    if waiting and waiting[0].arrival_s > clock.now():
                        clock.wait_until(waiting[0].arrival_s)
                        continue
                    raise InfersimError(f"request {waiting[0].rid} does not fit the KV pool")
                running += len(prefill)
                with cond:
                    while not pool and not prefill and state["error"] is None:
                        # nothing drafted yet: wait for the drafting thread, or for an arrival
                        if waiting and running < dec.max_batch_size and waiting[0].arrival_s <= clock.now():
                            break
                        cond.wait(timeout=0.01 if waiting else None)
                    if state["error"] is not None:
                        raise state["error"]
                    if not pool and not prefill:
                        continue
                    taken = [pool.popleft() for _ in range(min(self.llm_batch_size, len(pool)))]
                    self.pool_depth_series.append((now(), len(pool)))
                    clock.step(may_tick=state["drafter_idle"], companion=self.remote)
                    cond.notify_all()  # the pool shrank: back-pressure may lift
                ts = now()
                items = [(seq, prop.tokens[i], None) for seq, prop, i, _ in taken]
                released = self.target.released_blocks
                tv = time.perf_counter()
                results = self.target.step(prefill, items, 0.0, None)
                dec._sync()
                verify_s = time.perf_counter() - tv
                # feedback per drafting group (the proposer's bookkeeping is per proposal)
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
                acc = 0
                for (_, _, _, si), (k, _) in zip(taken, results):
                    self.stats.recorder.add(si, k)
                    acc += k
                end = now()
                drafted = sum(si for *_, si in taken)
                if dec.selector is not None and drafted:
                    period = end - (last_end if last_end is not None else ts)
                    s_used = max(x[3] for x in taken)
                    dec.selector.observe(period, verified_length(results, [x[3] for x in taken], s_used))
                last_end = end
                s_now = dec.s
                if not self.s_series or self.s_series[-1][1] != s_now:
                    self.s_series.append((len(self.stats.rounds), s_now))
                counts = (s_now, drafted, acc, len(prefill) + acc + len(results), 0)
                n_seqs = (len(prefill), len(taken))
                row = round_row(len(self.stats.rounds), (ts, end, 0.0, verify_s), n_seqs, counts, self.target, released)
                self.stats.rounds.append(row)
                if observer is not None and hasattr(observer, "note_drafted"):
                    observer.note_drafted([x[3] for x in taken])  # what each verified sequence drafted
                if observer is not None:
                    observer.on_round(
                        prefill, [x[0] for x in taken], results, ts, end, self.target.released_blocks - released
                    )
                back = []
                for seq in prefill + [x[0] for x in taken]:
                    seq.rounds += 1
                    if seq.done:
                        running -= 1
                        dec._reserved -= dec._need(seq)
                        self.target.release(seq)
                        with cond:
                            finished_drafts.append(seq)
                        if observer is not None:
                            observer.on_finish(seq, end)
                        if progress is not None:
                            progress(seq)
                    else:
                        back.append(seq)
                with cond:
                    ready.extend(back)
                    cond.notify_all()
        finally:
            with cond:
                state["stop"] = True
                cond.notify_all()
            th.join()
        for seq in finished_drafts:
            drafting_side.release(seq)
        return [s.output_ids for s in seqs]

    def close(self) -> None:
        """Stop the drafting process (if any)."""
        if self.remote is not None:
            self.remote.close()
