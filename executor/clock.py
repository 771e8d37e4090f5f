"""The executor's engine clock: seconds since the engine started, where an idle wait for the
next arrival either sleeps (realtime) or is skipped, the clock jumping ahead instead (`--fast`).

Speed ticks (validation runs, `speed_ticks()`): on a shared machine the CPU core a run gets can
be 10-20% slower or faster for seconds at a time, and the same requests served twice in a row
took 945 to 1360 ms of forward time. A fixed reference kernel timed every few engine steps, in
the run's own thread, follows that level (its median per run against the run's forward time:
correlation 0.83-0.90 over 20 back-to-back runs of one workload), while a probe on the other core
did not (0.04). The kernel's time is hidden from the engine clock, so the run's timeline is the
same as without it."""

from __future__ import annotations

import time
from contextlib import contextmanager

TICK_EVERY = 8  # engine steps between ticks: ~0.5 ms of kernel per 8 iterations of 1-5 ms
# {"every": n, "rows": [(clock_s, tick_s[, companion tick_s]), ...]} under speed_ticks()
_recording: dict | None = None
_kernel: tuple | None = None


@contextmanager
def speed_ticks(every: int = TICK_EVERY):
    """Every engine clock made inside records speed ticks into the yielded list of
    (engine clock s, kernel s) rows, (engine clock s, kernel s, companion's kernel s) where the
    engine has a companion (Clock.step)."""
    global _recording
    prev, _recording = _recording, {"every": max(1, int(every)), "rows": []}
    try:
        yield _recording["rows"]
    finally:
        _recording = prev


def reference_kernel_s() -> float:
    """Seconds for a fixed small MLP on the host (10 passes of a batch of 8 through 192 -> 768 ->
    192, one thread's worth of the work a small model's step does)."""
    global _kernel
    import torch

    if _kernel is None:
        g = torch.Generator().manual_seed(0)
        _kernel = (
            torch.randn(8, 192, generator=g),
            torch.randn(192, 768, generator=g),
            torch.randn(768, 192, generator=g),
        )
    x, a, b = _kernel
    t = time.perf_counter()
    for _ in range(10):
        x = torch.relu(x @ a) @ b * 0.05 + x
    return time.perf_counter() - t


class Clock:
    def __init__(self, realtime: bool = False):
        self.realtime = realtime
        self._t0 = time.perf_counter()
        self._skipped = 0.0
        self._ticks = _recording
        self._steps = 0
        self._next_tick = _recording["every"] if _recording is not None else 0

    def now(self) -> float:
        return time.perf_counter() - self._t0 + self._skipped

    def wait_until(self, t: float) -> None:
        delay = t - self.now()
        if delay <= 0:
            return
        if self.realtime:
            time.sleep(delay)
        else:
            self._skipped += delay

    def step(self, may_tick: bool = True, companion=None) -> None:
        """An engine step is about to run: under speed_ticks(), every `every` steps time the
        reference kernel, the clock standing still meanwhile. Only while this thread is the
        clock's only reader: a concurrent reader would see time stop. An engine with another
        thread (the pipelined decoder) passes may_tick=False while that thread is busy; a tick
        that falls due then waits for the next step that may. companion: an engine on another
        core (the pipelined decoder's drafting process) with tick_start() / tick_finish() -> s,
        which times the same kernel there at the same moment (its own core's speed)."""
        if self._ticks is None:
            return
        self._steps += 1
        if self._steps < self._next_tick or not may_tick:
            return
        self._next_tick = self._steps + self._ticks["every"]
        t = time.perf_counter()
        if companion is not None:
            companion.tick_start()
        s = reference_kernel_s()
        other = companion.tick_finish() if companion is not None else None
        self._skipped -= time.perf_counter() - t
        self._ticks["rows"].append((self.now(), s) if other is None else (self.now(), s, other))
