"""One serving replica: an iteration-level (continuous batching) loop as a SimPy process.

Each loop asks the scheduler policy for a decision, carries it out on the block manager,
moves swapped KV over the host link (a SimPy resource, so transfers take time and queue),
and advances the clock by the cost model's iteration time. When the decision is a plain
decode of the same sequences (no admission, preemption or swap), the loop runs the whole
stretch up to the next event in one go: a sequence finishing, the block pool running short,
or a new arrival (which interrupts the stretch at the next step boundary). `step_mode` turns
this off; both modes give identical timestamps (tested)."""

from __future__ import annotations

import numpy as np

from ..costmodel.batch import BatchShape
from ..policies.state import SchedulerState
from .decision import apply_decision
from .sequence import emit_token

MAX_STRETCH_STEPS = 1024


def _new_blocks_by_step(ctx: np.ndarray, alloc: np.ndarray, new_alloc: np.ndarray, bs: int, k: int) -> np.ndarray:
    """Blocks a decode stretch has added by the end of each of its k steps (step j writes the KV
    of token ctx + j, so a sequence needs its m-th block from step (m - 1) * bs - ctx on)."""
    counts = new_alloc - alloc
    seq = np.repeat(np.arange(len(ctx)), counts)
    nth = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)  # 0, 1, .. within a sequence
    first_step = np.maximum(0, (alloc[seq] + nth) * bs - ctx[seq])
    return np.cumsum(np.bincount(first_step, minlength=k)[:k])


def run_steps(env, times: np.ndarray, interrupt):
    """Run consecutive steps of `times` from now, up to the first step boundary after `interrupt`
    fires (an arrival at time a: only the steps that start before a run). Returns the start, the
    steps' end times and how many ran."""
    start = env.now
    ends = np.cumsum(np.concatenate(([start], times)))[1:]
    done = env.timeout_at(float(ends[-1]))
    if interrupt is None:
        yield done
        return start, ends, len(times)
    yield done | interrupt
    k = len(times)
    if env.now < ends[-1]:
        starts = np.concatenate(([start], ends[:-1]))
        k = max(1, int(np.searchsorted(starts, env.now, side="left")))
        yield env.timeout_at(float(ends[k - 1]))
    return start, ends, k


class Replica:
    def __init__(self, index: int, sim, blocks, scheduler, limits, kv_bytes_per_block: float, link):
        self.index = index
        self.sim = sim
        self.env = sim.env
        self.cost = sim.cost_model
        self.metrics = sim.metrics
        self.blocks = blocks
        self.scheduler = scheduler
        self.limits = limits
        self.kv_bytes_per_block = kv_bytes_per_block
        self.link = link
        self.waiting: list = []
        self.running: list = []
        self.swapped: list = []
        self.wakeup = self.env.event()
        self.step_mode = sim.step_mode
        # vLLM 0.2's paged KV layout (per layer, a K and a V tensor indexed by block): a swap
        # is one copy per block per layer per K/V, not one per sequence
        self.kv_copies_per_block = getattr(sim, "kv_copies_per_block", None)

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def add(self, seq) -> None:
        seq.replica = self.index
        self.waiting.append(seq)
        self.wake()

    def wake(self) -> None:
        """Something changed that the loop waits for (an arrival, freed blocks)."""
        if not self.wakeup.triggered:
            self.wakeup.succeed()

    # ---- the loop ---------------------------------------------------------------------
    def run(self):
        env = self.env
        while True:
            if self.wakeup.triggered:
                self.wakeup = env.event()
            step = yield from self._decide()
            if step is not None:
                yield from self._execute(*step)

    def _decide(self):
        """Schedule and carry out one decision (its swaps transferred). Returns (decision, state,
        bytes out, bytes in) when it has a batch to run; None when it has not, after waiting for
        `_idle()` unless the decision changed the queues (aborts, preemptions, swap-ins)."""
        if not self.outstanding:
            yield self.wakeup
            return None
        decision, state, out_bytes, in_bytes = self._schedule()
        if out_bytes or in_bytes:
            yield from self._transfer(out_bytes, in_bytes)
        if decision.batch:
            return decision, state, out_bytes, in_bytes
        if not (decision.abort or decision.preempt or decision.swap_in):
            yield self._idle()  # nothing can run until something arrives
        return None

    def _schedule(self):
        """Ask the scheduler for a decision and carry it out on the pools, swaps not yet
        transferred: (decision, state, bytes out, bytes in)."""
        state = self._state()
        decision = self.scheduler.schedule(state)
        out_bytes, in_bytes = self._apply(decision)
        return decision, state, out_bytes, in_bytes

    def _idle(self):
        """The event a replica with nothing it can run waits for."""
        return self.wakeup

    def _execute(self, decision, state, out_bytes: float, in_bytes: float):
        """Run the decided batch: a stretch of decode steps when the decision would repeat,
        else one iteration. Subclasses (speculation) run their own kind of iteration here."""
        if decision.is_plain_decode and not self.step_mode and self.scheduler.repeats_while_decoding(state):
            yield from self._decode_stretch([s for s, _ in decision.batch])
        else:
            yield from self._iteration(decision.batch, out_bytes, in_bytes)

    def _state(self) -> SchedulerState:
        b = self.blocks
        return SchedulerState(
            now_s=self.env.now,
            waiting=self.waiting,
            running=self.running,
            swapped=self.swapped,
            free_gpu_blocks=b.free_gpu,
            free_cpu_blocks=b.free_cpu,
            total_gpu_blocks=b.total_gpu,
            block_size=b.block_size,
            watermark_blocks=b.watermark_blocks,
            kv_bytes_per_block=self.kv_bytes_per_block,
            limits=self.limits,
            cost_model=self.cost,
            kv_copies_per_block=self.kv_copies_per_block,
            releasable_blocks=b.releasable,
        )

    def _apply(self, d) -> tuple[float, float]:
        """Carry out a decision (engine/decision.py); returns the bytes swapped out and in."""
        done = apply_decision(
            d,
            self,
            self.blocks,
            now_s=self.env.now,
            swap_only=self.scheduler.preemption.swap_only,
            bytes_per_block=self.kv_bytes_per_block,
            metrics=self.metrics,
        )
        return done.out_blocks * self.kv_bytes_per_block, done.in_blocks * self.kv_bytes_per_block

    def abort(self, seq, now_s: float) -> None:
        self.sim.finish(seq, now_s, aborted=True)

    def _transfer(self, out_bytes: float, in_bytes: float):
        """Swap-out then swap-in over this replica's host link, before the iteration runs."""
        with self.link.request() as req:
            yield req
            for nbytes, direction in ((out_bytes, "d2h"), (in_bytes, "h2d")):
                if nbytes:
                    copies = self._swap_copies(nbytes)
                    yield self.env.timeout_at(self.env.now + self.cost.kv_transfer_time_s(nbytes, direction, copies))

    def _swap_copies(self, nbytes: float) -> int:
        """Separate copies a swap of nbytes (whole blocks) is issued as."""
        if not self.kv_copies_per_block:
            return 1
        return int(round(nbytes / self.kv_bytes_per_block)) * self.kv_copies_per_block

    # ---- one general iteration (prefill, chunks, mixed) -------------------------------
    def _iteration(self, batch, out_bytes: float, in_bytes: float):
        makes_token, shape = self._begin_iteration(batch)
        start = self.env.now
        yield from self._run_batch(batch, makes_token, shape)
        self._end_iteration(batch, makes_token, shape, start, self.env.now, out_bytes, in_bytes)

    def _begin_iteration(self, batch) -> tuple[np.ndarray, BatchShape]:
        """Grow the batch's blocks to what it computes; which sequences make a token, and its shape."""
        q = np.fromiter((n for _, n in batch), dtype=np.int64, count=len(batch))
        ctx = np.fromiter((s.computed for s, _ in batch), dtype=np.int64, count=len(batch))
        makes_token = np.fromiter((s.computed + n == s.num_tokens for s, n in batch), dtype=bool, count=len(batch))
        for seq, n in batch:
            self.blocks.grow_to(seq, seq.computed + n)
        return makes_token, BatchShape(q, ctx, makes_token.astype(np.int64))

    def _end_iteration(self, batch, makes_token, shape: BatchShape, start, end, out_bytes, in_bytes) -> None:
        """Record an iteration that ran from start to end and emit its tokens."""
        q = shape.query_tokens
        prefill_tokens = int(q[q > 1].sum())
        self._record_iteration(start, end, len(batch), int(q.sum()), prefill_tokens, out_bytes, in_bytes)
        itl = []
        for (seq, n), tok in zip(batch, makes_token):
            seq.computed += n
            if tok:
                self._token(seq, end, itl)
        if itl:
            self.metrics.add_itl(itl, 1.0)

    def _record_iteration(
        self, start: float, end: float, seqs: int, tokens: int, prefill_tokens: int, out_bytes: float, in_bytes: float
    ) -> None:
        """One iteration's row in the series (a segment of one step), with the pools and queues now."""
        b = self.blocks
        self.metrics.segment(
            (
                start,
                end,
                self.index,
                1,
                seqs,
                tokens,
                prefill_tokens,
                b.used_gpu,
                b.used_cpu,
                len(self.waiting),
                len(self.swapped),
                out_bytes,
                in_bytes,
                b.cached_gpu,
            )
        )

    def _run_batch(self, batch, makes_token: np.ndarray, shape: BatchShape):
        """Hold the GPUs for one iteration; a pipeline's virtual engine passes it through its
        stages instead (parallel/replica.py)."""
        start_s = self.env.now
        end_s = start_s + self.cost.iteration_time_s(shape)
        self._iteration_started(batch, makes_token, start_s, end_s)
        yield self.env.timeout_at(end_s)

    # ---- a stretch of identical decode steps ------------------------------------------
    def _stretch_plan(self, seqs) -> tuple[np.ndarray, np.ndarray, int]:
        """Contexts and blocks held of a decode stretch's sequences, and its length: up to the
        first sequence finishing or the block pool running short."""
        blocks, bs = self.blocks, self.blocks.block_size
        b = len(seqs)
        ctx = np.fromiter((s.computed for s in seqs), dtype=np.int64, count=b)
        alloc = np.fromiter((s.num_gpu_blocks for s in seqs), dtype=np.int64, count=b)
        remaining = np.fromiter((s.output_len - s.generated for s in seqs), dtype=np.int64, count=b)
        k = int(min(remaining.min(), MAX_STRETCH_STEPS))
        # step j writes the KV of token ctx + j: it needs ceil((ctx + j + 1) / bs) blocks
        worst = int(np.maximum(0, -(-(ctx + k) // bs) - alloc).sum())
        if worst > blocks.free_gpu:
            steps = np.arange(k, dtype=np.int64)
            need = np.maximum(0, -(-(ctx[:, None] + steps[None, :] + 1) // bs) - alloc[:, None]).sum(axis=0)
            k = max(1, int(np.argmax(need > blocks.free_gpu)))
        return ctx, alloc, k

    def _decode_stretch(self, seqs):
        ctx, alloc, k = self._stretch_plan(seqs)
        times = self.cost.decode_step_times_s(ctx, k)
        start, ends, k = yield from run_steps(self.env, times, None if self.step_mode else self.wakeup)
        self._commit_stretch(seqs, ctx, alloc, times[:k], ends[:k], start, self.env.now, k)

    def _commit_stretch(self, seqs, ctx, alloc, times, ends, start, end, k):
        blocks, bs, m = self.blocks, self.blocks.block_size, self.metrics
        new_alloc = np.maximum(alloc, -(-(ctx + k) // bs))
        added = int((new_alloc - alloc).sum())
        blocks.commit_stretch(seqs, ctx + k, new_alloc)
        b = len(seqs)
        last = np.fromiter((s.last_token_s for s in seqs), dtype=np.float64, count=b)
        m.add_itl(ends[0] - last, 1.0)
        if k > 1:  # gaps between step ends, as stepping one by one measures them (not the step times)
            m.add_itl(np.diff(ends), float(b))
        m.segment(
            (
                start,
                end,
                self.index,
                k,
                b,
                b,
                0,
                blocks.used_gpu,
                blocks.used_cpu,
                len(self.waiting),
                len(self.swapped),
                0.0,
                0.0,
                blocks.cached_gpu,
            ),
            gpu_blocks_steps=(ends, blocks.used_gpu - added + _new_blocks_by_step(ctx, alloc, new_alloc, bs, k)),
        )
        for seq in seqs:
            seq.computed += k
            seq.generated += k
            seq.last_token_s = end
            if seq.generated >= seq.output_len:
                self._finish(seq, end)

    def _iteration_started(self, batch, makes_token: np.ndarray, start_s: float, end_s: float) -> None:
        """A general iteration from start_s to end_s began (a disaggregated prefill replica
        announces the prompts it finishes, to stream their KV while it runs)."""

    def _token(self, seq, now: float, itl: list) -> None:
        """`seq` produced a token at `now` in a general iteration (a disaggregated prefill
        replica hands the sequence over here instead)."""
        if emit_token(seq, now, itl):
            self._finish(seq, now)

    def report(self, extra: dict) -> None:
        """Subclasses add their own summary entries (e.g. acceptance, prefetch bytes)."""

    def _finish(self, seq, now: float) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        self.sim.finish(seq, now)
