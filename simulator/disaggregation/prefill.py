"""A prefill replica: the engine's loop (its own scheduler and batching) over prompts only. A
sequence whose prompt is done leaves the batch and is handed to the KV transfers with the blocks
it holds; those stay taken on this replica until its transfer ends. A one-token request has no
decode: it finishes here."""

from __future__ import annotations

import simpy

from ..engine.replica import Replica


class PrefillReplica(Replica):
    def __init__(self, *args, transfers, **kwargs):
        super().__init__(*args, **kwargs)
        self.transfers = transfers
        self.kv_link = simpy.Resource(self.env, capacity=1)  # KV transfers to the decode pool, one at a time
        self._prefilled: list = []

    def _token(self, seq, now: float, itl: list) -> None:
        if seq.output_len <= 1:
            super()._token(seq, now, itl)
            return
        self.running.remove(seq)
        self._prefilled.append(seq)

    def _iteration(self, batch, out_bytes: float, in_bytes: float):
        start = self.env.now
        yield from super()._iteration(batch, out_bytes, in_bytes)
        if self._prefilled:
            done, self._prefilled = self._prefilled, []
            self.transfers.prefilled(self, done, self.env.now - start)

    def release(self, blocks: int) -> None:
        """A transfer ended: the blocks its sequence held here are free."""
        self.blocks.free_gpu += int(blocks)
        self.wake()
