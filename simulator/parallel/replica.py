"""A pipelined replica: vLLM's virtual engines over shared stages.

vLLM (v0, `pipeline_parallel_size` > 1) runs one scheduler per batch in flight ("virtual
engine"), each with its own requests and an equal share of the KV blocks; a new request goes
to the virtual engine with the fewest unfinished requests. Each virtual engine forms its next
batch as soon as its previous one has left the last stage, so while batch i is in stage 2 the
scheduler has batch i+1 in stage 1. Here a virtual engine is an ordinary `Replica` loop whose
iteration, instead of holding the GPUs for the whole batch time, passes the batch through the
stages: each stage takes batches in the order they were issued (every stage worker runs the
steps the driver issued, in order), starting a batch when the batch has arrived (its hand-off
from the previous stage done) and the stage has finished the batch before it.

A virtual engine's run of identical decode steps still enters the stages step by step (the
other virtual engines' batches interleave with it); the replica's conductor issues those steps
in time order without a simulation event each, so the event mode saves the scheduler calls,
the per-step costing and the per-step events; both modes give identical requests and summaries
(tested)."""

from __future__ import annotations

import heapq
import itertools
import math
from array import array

import numpy as np

from ..engine.replica import Replica


class StageTimeline:
    """When each stage is next free, and every interval each stage was busy (stored batch by
    batch: a batch's stages in order, so row i is stage i % stages)."""

    def __init__(self, stages: int):
        self.stages = stages
        self.free_at_s = [0.0] * stages
        self.engine = array("i")  # per batch
        self.start_s = array("d")  # per batch and stage
        self.end_s = array("d")
        # union of the intervals from a batch entering stage 0 to it leaving the last stage
        self.active_s = 0.0
        self._span: list[float] | None = None

    def reserve(self, now_s: float, stage_times_s, arrive_after_s, engine: int) -> float:
        """Pass a batch issued at now_s through the stages; returns when it leaves the last.
        `arrive_after_s[s]` is the hand-off before stage s (0 before stage 0). Times are plain
        floats (now_s too): this runs once per step of every virtual engine."""
        t = now_s
        starts, ends = [], []
        start, stop = starts.append, ends.append
        for free, dt, hand in zip(self.free_at_s, stage_times_s, arrive_after_s):
            t += hand
            if free > t:
                t = free
            start(t)
            t += dt
            stop(t)
        self.free_at_s = ends  # each stage is next free when this batch leaves it
        self.start_s.extend(starts)
        self.end_s.extend(ends)
        self.engine.append(engine)
        sp = self._span
        if sp is not None and starts[0] <= sp[1]:
            if t > sp[1]:
                sp[1] = t
        else:
            if sp is not None:
                self.active_s += sp[1] - sp[0]
            self._span = [starts[0], t]
        return t

    def active_total_s(self) -> float:
        return self.active_s + (self._span[1] - self._span[0] if self._span else 0.0)

    def columns(self) -> dict[str, np.ndarray]:
        start = np.frombuffer(self.start_s, dtype=np.float64).copy()
        n = start.size
        return {
            "stage": np.arange(n, dtype=np.int64) % self.stages,
            "virtual_engine": np.repeat(np.frombuffer(self.engine, dtype=np.int32).astype(np.int64), self.stages),
            "t_start_s": start,
            "t_end_s": np.frombuffer(self.end_s, dtype=np.float64).copy(),
        }

    def busy_s(self) -> list[float]:
        """Busy time of each stage, summed in time order."""
        c = self.columns()
        d = c["t_end_s"] - c["t_start_s"]
        return [math.fsum(d[s :: self.stages]) for s in range(self.stages)]


class VirtualEngine(Replica):
    """One batch in flight of a pipelined replica."""

    def __init__(self, number: int, timeline: StageTimeline, *args):
        super().__init__(*args)
        self.number = number
        self.timeline = timeline

    def _run_batch(self, batch, makes_token, shape):
        stages_s, handoffs_s = self.cost.stage_times_s(shape)
        arrive = [0.0, *handoffs_s.tolist()]
        yield self.env.timeout_at(self.timeline.reserve(self.env.now, stages_s.tolist(), arrive, self.number))

    def _decode_stretch(self, seqs):
        """A run of decode steps of the same sequences, handed to the replica's conductor: each
        step still enters the stages when the previous one has left them, in time order with
        the other virtual engines' steps, but the scheduler is not asked again, the step times
        are costed at once and no simulation event is spent per step; an arrival ends the run
        at the next step boundary, as stepping one by one would see it."""
        ctx, alloc, k = self._stretch_plan(seqs)
        run = DecodeRun(self, ctx, k, self.env.now)
        self.conductor.join(run)
        yield run.done
        self._commit_stretch(seqs, ctx, alloc, None, np.array(run.ends), run.start_s, self.env.now, len(run.ends))


class DecodeRun:
    """A virtual engine's run of up to `steps` decode steps: each step's stage times and the
    hand-off before each stage, and the steps' end times so far."""

    __slots__ = ("engine", "stages_s", "arrive_s", "start_s", "ends", "done")

    def __init__(self, engine: VirtualEngine, ctx: np.ndarray, steps: int, start_s: float):
        stages, handoffs = engine.cost.decode_stage_times_s(ctx, steps)
        self.stages_s = stages.T.tolist()
        self.arrive_s = np.vstack([np.zeros((1, steps)), handoffs]).T.tolist()
        self.engine, self.start_s = engine, start_s
        self.ends: list[float] = []
        self.done = engine.env.event()


class Conductor:
    """Issues the steps of the virtual engines' decode runs on the stage timeline in time order,
    without a simulation event per step.

    Steps are issued ahead of the simulation clock only before the next pending event of the
    whole simulation (`env.peek()`): nothing can happen before it (no arrival, no other
    engine's batch), so a step issued ahead is issued exactly as stepping would issue it. Every
    event created later lies at or after the time it is created, and the steps still pending
    lie beyond that time, so the order holds. A run's end (its last step, or the step boundary
    after an arrival to its engine) is an event at that time, where its engine takes over."""

    def __init__(self, env, timeline: StageTimeline):
        self.env, self.timeline = env, timeline
        self.heap: list = []  # (issue time, order, run)
        self._order = itertools.count()
        self._wake_s = math.inf

    def join(self, run: DecodeRun) -> None:
        heapq.heappush(self.heap, (self.env.now, next(self._order), run))
        self.advance()

    def advance(self, _event=None) -> None:
        env, heap, reserve = self.env, self.heap, self.timeline.reserve
        now, horizon = env.now, env.peek()
        while heap:
            t, order, run = heap[0]
            if t > now and t >= horizon:
                break
            heapq.heappop(heap)
            if run.ends and run.engine.wakeup.triggered:  # an arrival: the run ends at this boundary
                horizon = min(horizon, self._end(run, t))
                continue
            j = len(run.ends)
            end = reserve(t, run.stages_s[j], run.arrive_s[j], run.engine.number)
            run.ends.append(end)
            if j + 1 == len(run.stages_s):
                horizon = min(horizon, self._end(run, end))
            else:
                heapq.heappush(heap, (end, order, run))
        if heap and heap[0][0] < self._wake_s:
            self._wake_s = heap[0][0]
            self.env.timeout_at(self._wake_s).callbacks.append(self._wake)

    def _wake(self, event) -> None:
        if self.env.now >= self._wake_s:
            self._wake_s = math.inf
        self.advance()

    def _end(self, run: DecodeRun, at_s: float) -> float:
        self.env.timeout_at(at_s).callbacks.append(lambda _e, run=run: run.done.succeed())
        return at_s


class PipelineReplica:
    """A replica of `pp` stages serving through `pp` virtual engines."""

    def __init__(self, index: int, sim, make_engine, stages: int):
        self.index, self.env = index, sim.env
        self.timeline = StageTimeline(stages)
        self.conductor = Conductor(self.env, self.timeline)
        self.engines = [make_engine(v, self.timeline) for v in range(stages)]
        for e in self.engines:
            e.conductor = self.conductor

    @property
    def outstanding(self) -> int:
        return sum(e.outstanding for e in self.engines)

    def add(self, seq) -> None:
        loads = [e.outstanding for e in self.engines]
        self.engines[loads.index(min(loads))].add(seq)

    def run(self):
        for e in self.engines:
            self.env.process(e.run())
        return
        yield  # a SimPy process: the virtual engines do the work

    def stage_table(self) -> dict[str, np.ndarray]:
        cols = self.timeline.columns()
        return {"replica": np.full(cols["stage"].size, self.index, dtype=np.int64), **cols}

    def report(self, extra: dict) -> None:
        t = self.timeline
        active = t.active_total_s()
        busy = np.array(t.busy_s())
        entry = {
            "replica": self.index,
            "stage_busy_s": busy.tolist(),
            "active_s": active,
            "stage_utilization": (busy / active).tolist() if active > 0 else [0.0] * len(busy),
            "bubble_fraction": float(1.0 - busy.sum() / (len(busy) * active)) if active > 0 else 0.0,
        }
        extra.setdefault("pipeline", {}).setdefault("replicas", []).append(entry)
        for e in self.engines:
            e.report(extra)
