"""The ranks of a data-parallel-attention group stepping in lockstep (parallel/dp_attention.py).

One SimPy process drives the group's N ranks (replicas `g N` to `g N + N - 1`, each with its own
scheduler, KV pool and queues). At each iteration boundary every rank with requests asks its
scheduler for a decision and carries it out as a lone replica does; the group then waits for the
slowest rank's swaps, and runs one iteration whose time the cost model prices from all the ranks'
batch shapes (a rank without a batch makes a dummy pass). Every rank's iteration starts and ends
with the group's; tokens, KV and metrics are recorded by each rank as its own. A group with
nothing to run on any rank waits for an arrival to one of them.

When every busy rank repeats a plain decode and the others have no requests, the group runs the
whole stretch of decode steps up to the next event in one go (a rank's sequence finishing or its
pool running short, or an arrival to any rank, which ends the stretch at the next step boundary),
as a lone replica does; `step_mode` turns this off, and both modes give identical timestamps
(tested)."""

from __future__ import annotations

from ..engine.replica import Replica, run_steps


class LockstepGroup:
    def __init__(self, ranks: list[Replica], cost_model, step_mode: bool):
        self.ranks, self.cost, self.step_mode = ranks, cost_model, step_mode
        self.env = ranks[0].env

    def _any_wakeup(self):
        return self.env.any_of([r.wakeup for r in self.ranks])

    def run(self):
        env = self.env
        while True:
            for r in self.ranks:
                if r.wakeup.triggered:
                    r.wakeup = env.event()
            if not any(r.outstanding for r in self.ranks):
                yield self._any_wakeup()
                continue
            steps = [r._schedule() if r.outstanding else None for r in self.ranks]
            yield from self._transfers(steps)
            batches = [s if s is not None and s[0].batch else None for s in steps]
            if any(batches):
                yield from self._execute(batches)
            elif not any(s is not None and (s[0].abort or s[0].preempt or s[0].swap_in) for s in steps):
                yield self._any_wakeup()  # nothing can run until something arrives

    def _transfers(self, steps):
        """Every rank's swaps over its own host link at once; the group starts when the last ends."""
        moves = [
            self.env.process(r._transfer(s[2], s[3]))
            for r, s in zip(self.ranks, steps)
            if s is not None and (s[2] or s[3])
        ]
        if moves:
            yield self.env.all_of(moves)

    def _execute(self, batches):
        if not self.step_mode and self._repeats(batches):
            yield from self._decode_stretch(batches)
        else:
            yield from self._iteration(batches)

    def _repeats(self, batches) -> bool:
        """Every busy rank decodes the same sequences again next step, and the others are empty."""
        for r, b in zip(self.ranks, batches):
            if b is None:
                if r.outstanding:
                    return False
            elif not (b[0].is_plain_decode and r.scheduler.repeats_while_decoding(b[1])):
                return False
        return True

    def _iteration(self, batches):
        begun = [None if b is None else r._begin_iteration(b[0].batch) for r, b in zip(self.ranks, batches)]
        start = self.env.now
        end = start + self.cost.group_iteration_time_s([None if x is None else x[1] for x in begun])
        yield self.env.timeout_at(end)
        for r, b, x in zip(self.ranks, batches, begun):
            if b is not None:
                r._end_iteration(b[0].batch, *x, start, end, b[2], b[3])

    def _decode_stretch(self, batches):
        seqs = [None if b is None else [s for s, _ in b[0].batch] for b in batches]
        plans = [None if s is None else r._stretch_plan(s) for r, s in zip(self.ranks, seqs)]
        k = min(p[2] for p in plans if p is not None)
        times = self.cost.group_decode_step_times_s([None if p is None else p[0] for p in plans], k)
        start, ends, k = yield from run_steps(self.env, times, self._any_wakeup())
        end = self.env.now
        for r, s, p in zip(self.ranks, seqs, plans):
            if s is not None:
                r._commit_stretch(s, p[0], p[1], times[:k], ends[:k], start, end, k)


def lockstep_groups(replicas: list[Replica], ep: int, cost_model, step_mode: bool) -> list[LockstepGroup]:
    """Every `ep` consecutive replicas form a group."""
    return [LockstepGroup(replicas[g : g + ep], cost_model, step_mode) for g in range(0, len(replicas), ep)]
