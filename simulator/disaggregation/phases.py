"""Per-request phase times of a disaggregated run: when each request's prefill ended, its KV
transfer started and ended, and its first decode iteration started. With the collector's
arrival, first-scheduled and finish times they split a request's latency into queueing (the
prefill queue: `queueing_s`), prefill, transfer wait, transfer, decode queueing and decode."""

from __future__ import annotations

import numpy as np

STAMPS = ("prefill_end_s", "transfer_start_s", "transfer_end_s", "decode_start_s")
# duration column -> (from, to); `first_scheduled_s` and `finish_s` are the collector's
PHASES = {
    "prefill_s": ("first_scheduled_s", "prefill_end_s"),
    "transfer_wait_s": ("prefill_end_s", "transfer_start_s"),  # decode-side blocks, the link
    "transfer_s": ("transfer_start_s", "transfer_end_s"),
    "decode_queueing_s": ("transfer_end_s", "decode_start_s"),
    "decode_s": ("decode_start_s", "finish_s"),
}


class PhaseTimes:
    """One slot per request id for each stamp (NaN: the request never got there, e.g. a
    one-token request finishes on its prefill replica)."""

    def __init__(self, num_requests: int):
        n = max(1, int(num_requests))
        self.t = {c: np.full(n, np.nan) for c in STAMPS}
        self.prefill_replica = np.full(n, -1.0)

    def stamp(self, column: str, rid: int, now_s: float) -> None:
        self.t[column][rid] = now_s

    def stamp_once(self, column: str, rid: int, now_s: float) -> None:
        if np.isnan(self.t[column][rid]):
            self.t[column][rid] = now_s

    def columns(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The stamps and the phase durations for the collector's requests table `req`."""
        n = len(req["arrival_s"])
        ok = req["aborted"] == 0
        times = {c: v[:n] for c, v in self.t.items()}
        out = {"prefill_replica": self.prefill_replica[:n].copy(), **{c: v.copy() for c, v in times.items()}}
        times.update(first_scheduled_s=req["first_scheduled_s"], finish_s=req["finish_s"])
        for name, (a, b) in PHASES.items():
            out[name] = np.where(ok, times[b] - times[a], np.nan)
        return out
