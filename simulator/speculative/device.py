"""One GPU shared by the SSM engine and the LLM engine (MPS-like), as a SimPy helper.

Each engine submits work measured in seconds of solo execution. While only one engine is
busy it runs at full speed; while both are, each runs at its share of its solo speed
(processor sharing): when the other engine starts or stops, the remaining work is re-timed.
With `shares=None` the engines have separate devices and never slow each other.

`whole_pass=True`: a pass that meets the other engine at all (busy when it starts, or starting
while it runs) takes its solo time / its share in all, charged once when the contention begins,
however long the overlap; the rest runs at full speed. (Two threads of one Python process
contending for the GIL and the cores slowed a whole pass by about as much for a short overlap
as for a full one: analysis/validate/spec_costmodel.py.)"""

from __future__ import annotations


class SharedDevice:
    def __init__(self, env, shares: dict[str, float] | None, whole_pass: bool = False):
        self.env = env
        self.shares = shares
        self.whole_pass = bool(whole_pass)
        self.active: set[str] = set()
        self.changed = env.event()
        self.busy_s: dict[str, float] = {}

    def _notify(self) -> None:
        old, self.changed = self.changed, self.env.event()
        old.succeed()

    def run(self, name: str, work_s: float, share: float | None = None):
        """SimPy generator: `yield from device.run("llm", seconds)`; `share`: this pass's share
        instead of the engine's (a pass of another kind, e.g. one that prefills)."""
        env = self.env
        start = env.now
        if work_s <= 0:
            return
        if self.shares is None:
            yield env.timeout(work_s)
            self.busy_s[name] = self.busy_s.get(name, 0.0) + (env.now - start)
            return
        self.active.add(name)
        self._notify()
        run = self._run_whole_pass if self.whole_pass else self._run_sharing
        try:
            yield from run(name, float(work_s), share)
        finally:
            self.active.discard(name)
            self._notify()
            self.busy_s[name] = self.busy_s.get(name, 0.0) + (env.now - start)

    def _run_sharing(self, name: str, work_s: float, share: float | None = None):
        env = self.env
        remaining = work_s
        while True:
            rate = 1.0 if len(self.active) == 1 else float(share or self.shares[name])
            t0 = env.now
            done = env.timeout(remaining / rate)
            yield done | self.changed
            if done.processed:
                return
            remaining -= (env.now - t0) * rate
            if remaining <= work_s * 1e-12:
                return

    def _run_whole_pass(self, name: str, work_s: float, share: float | None = None):
        env = self.env
        remaining, charged = work_s, False
        while True:
            if not charged and len(self.active) > 1:
                remaining += work_s * (1.0 / float(share or self.shares[name]) - 1.0)  # the whole pass's slowdown, once
                charged = True
            t0 = env.now
            done = env.timeout(remaining)
            yield done | self.changed
            if done.processed:
                return
            remaining -= env.now - t0
            if remaining <= work_s * 1e-12:
                return
