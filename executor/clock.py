"""The executor's engine clock: seconds since the engine started, where an idle wait for the
next arrival either sleeps (realtime) or is skipped, the clock jumping ahead instead (`--fast`)."""
from __future__ import annotations

import time


class Clock:
    def __init__(self, realtime: bool = False):
        self.realtime = realtime
        self._t0 = time.perf_counter()
        self._skipped = 0.0

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
