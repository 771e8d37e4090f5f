"""A prefill replica: the engine's loop (its own scheduler and batching) over prompts only. A
sequence whose prompt is done leaves the batch and is handed to the KV transfers with the blocks
it holds; those stay taken on this replica until its transfer ends. With layer-wise streaming
the sequences an iteration will finish are announced when it starts, so that their decode
blocks can be taken and their KV streamed while it runs. A one-token request has no decode: it
finishes here."""

from __future__ import annotations

import simpy

from ..engine.replica import Replica


class PrefillReplica(Replica):
    def __init__(self, *args, transfers, **kwargs):
        super().__init__(*args, **kwargs)
        self.transfers = transfers
        self.kv_link = simpy.Resource(self.env, capacity=1)  # KV transfers to the decode pool, one at a time
        self._prefilled: list = []
        self._streamed: list = []  # handoffs announced by the running iteration
        self._start_s = 0.0

    def _iteration_started(self, batch, makes_token, start_s: float, end_s: float) -> None:
        self._start_s = start_s
        finishing = [seq for (seq, _), tok in zip(batch, makes_token) if tok and seq.output_len > 1]
        self._streamed = self.transfers.starting(self, finishing, start_s, end_s)

    def _token(self, seq, now: float, itl: list) -> None:
        if seq.output_len <= 1:
            super()._token(seq, now, itl)
            return
        self.running.remove(seq)
        self._prefilled.append(seq)

    def _iteration(self, batch, out_bytes: float, in_bytes: float):
        yield from super()._iteration(batch, out_bytes, in_bytes)
        if self._prefilled:
            done, self._prefilled = self._prefilled, []
            self.transfers.prefilled(self, done, self._start_s, self._streamed)
        self._streamed = []

    def release(self, blocks: int) -> None:
        """A transfer ended: the blocks its sequence held here are free."""
        self.blocks.free_gpu += int(blocks)
        self.wake()
