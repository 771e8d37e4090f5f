"""The simulator driven by the executor's own measured times: a check of the scheduling
alone.

ReplayCostModel answers the i-th iteration the simulation runs with the i-th iteration time
the executor measured (and each swap with its measured copy time), so any difference left
between the simulated and the executed run comes from the simulator's scheduling, admission,
preemption and clock semantics, not from the cost model. With the same times the two engines,
which call the same policy objects, should make the same decisions at every iteration; where
an arrival falls in the few microseconds between the executor's clock and the simulated one,
a batch may form one iteration apart and the schedules drift. The comparison uses this to
tell a scheduling mismatch from a cost-model error."""

from __future__ import annotations

import numpy as np

from .base import CostModel, Direction
from .batch import BatchShape


def intake_s(it: dict) -> np.ndarray:
    """Each iteration's decision point on the executor's clock: when the arrivals its schedule saw
    were taken in (t_intake_s); runs recorded without it: start - schedule - swap, which misses
    the batch's set-up between them (on a slow host arrivals 0.3 ms before that point had not been
    taken in)."""
    if "t_intake_s" in it:
        return np.asarray(it["t_intake_s"], dtype=np.float64)
    return (
        np.asarray(it["t_start_s"], dtype=np.float64)
        - np.asarray(it["schedule_s"], dtype=np.float64)
        - np.asarray(it["swap_s"], dtype=np.float64)
    )


class ReplayCostModel(CostModel):
    name = "replay"

    def __init__(self, run, fallback):
        self.fallback = fallback
        it = run.iterations
        start = np.asarray(it["t_start_s"], dtype=np.float64)
        busy = np.asarray(it["t_end_s"], dtype=np.float64) - start
        # The simulator decides an iteration's batch the moment the previous one ends; the
        # executor decides it after taking in arrivals, scheduling (schedule_s) and swapping
        # (swap_s). Timing each replayed iteration between the executor's decision points
        # (start - schedule - swap) lets both see the same arrivals at each decision.
        decide = intake_s(it)
        swap = np.asarray(it["swap_s"], dtype=np.float64)
        # where the simulation starts an iteration that follows an idle wait (and the first):
        # at the arrival that woke the engine; the executor may start it later (first-call
        # overheads), which the replayed time then absorbs
        sim_decide = decide.copy()
        arrivals = np.sort(np.asarray(run.requests["arrival_s"], dtype=np.float64))
        woke = np.concatenate(([True], run.idle_after[:-1])) if start.size else np.zeros(0, dtype=bool)
        end = np.asarray(it["t_end_s"], dtype=np.float64)
        for k in np.nonzero(woke)[0]:
            after = end[k - 1] if k > 0 else -np.inf
            j = np.searchsorted(arrivals, after, side="right")
            if j < arrivals.size and arrivals[j] <= decide[k]:
                sim_decide[k] = arrivals[j]
        step = np.full(start.size, np.nan)
        step[:-1] = decide[1:] - sim_decide[:-1] - swap[:-1]
        # after an idle wait (or the last iteration): its own forward time
        self.times = np.where(np.isfinite(run.iteration_period_s) & np.isfinite(step), step, busy).tolist()
        self._i = 0
        bpb = run.bytes_per_block
        self.copies: list[float] = []  # measured copy times in the order the simulator asks for them
        for o, i, s in zip(it["swap_out_blocks"], it["swap_in_blocks"], it["swap_s"]):
            if o == 0 and i == 0:
                continue
            # the executor times out + in together: split in proportion to the fit's prediction
            po = fallback.transfer_time_s(float(o) * bpb, "d2h") if o else 0.0
            pi = fallback.transfer_time_s(float(i) * bpb, "h2d") if i else 0.0
            tot = po + pi
            if o:
                self.copies.append(float(s) * (po / tot if tot else 0.5))
            if i:
                self.copies.append(float(s) * (pi / tot if tot else 0.5))
        self._c = 0

    def iteration_time_s(self, batch: BatchShape) -> float:
        if self._i < len(self.times):
            t = self.times[self._i]
            self._i += 1
            return float(t)
        return self.fallback.iteration_time_s(batch)

    # the policies are given the fallback (simulate.py `policy_cost_model`): only the engine's
    # own iterations and copies come here, in the order the executor ran them
    def kv_transfer_time_s(self, nbytes: float, direction: Direction, copies: int = 1) -> float:
        return self.transfer_time_s(nbytes, direction)

    def transfer_time_s(self, nbytes: float, direction: Direction) -> float:
        if nbytes <= 0:
            return 0.0
        if self._c < len(self.copies):
            t = self.copies[self._c]
            self._c += 1
            return t
        return self.fallback.transfer_time_s(nbytes, direction)


class OffloadReplayCostModel(ReplayCostModel):
    """The replay for an offloading replica: the measured times, while the replica's byte
    counters and pipeline stages still ask the fallback (the calibrated offload model, which
    binds nothing)."""

    name = "offload_replay"

    def __init__(self, run, fallback):
        super().__init__(run, fallback)
        self.offloaded_weight_bytes = fallback.offloaded_weight_bytes

    def bind_final(self, final_tokens) -> None:
        pass

    def stages(self, *args, **kwargs):
        return self.fallback.stages(*args, **kwargs)
