"""A decode replica: the engine's loop over sequences whose KV came from a prefill replica.

A handed-off sequence is offered to the replica the decode router picks and waits there
(`incoming`, first come first served) until the replica's pool has blocks for its prompt and
first token under vLLM's admission rule (the watermark kept free) and its batch has room
(max_batch_size counts running sequences and those on their way); the blocks are then taken
and the KV transfer starts. When the transfer ends the sequence joins the running batch with
its first token out. After that it is any running sequence: the replica's scheduler may
preempt it (swap, or recompute on this replica)."""

from __future__ import annotations

from collections import deque

from ..engine.replica import Replica
from ..engine.sequence import emit_token


class DecodeReplica(Replica):
    def __init__(self, *args, transfers, **kwargs):
        super().__init__(*args, **kwargs)
        self.transfers = transfers
        self.incoming: deque = deque()  # handoffs waiting for blocks here
        self.inbound = 0  # sequences with blocks taken here whose KV is on its way

    @property
    def outstanding(self) -> int:
        return super().outstanding + len(self.incoming) + self.inbound

    def offer(self, handoff) -> None:
        """Queue a handed-off sequence; the loop takes its blocks at its next decision."""
        handoff.seq.replica = self.index
        self.incoming.append(handoff)
        self.wake()

    def take_incoming(self, keep_blocks: int) -> None:
        """Take blocks for the head of `incoming` while they fit beside the `keep_blocks` the
        decided batch is about to use; each taken starts its transfer."""
        b, cap = self.blocks, self.limits.max_batch_size
        while self.incoming:
            if len(self.running) + self.inbound >= cap:  # vLLM's max_num_seqs bounds the batch
                return
            h = self.incoming[0]
            need = b.blocks_for_tokens(h.seq.prompt_len + 1)
            self.incoming.popleft()
            if b.total_gpu - need < b.watermark_blocks:
                self.transfers.abort(h)
                continue
            if b.free_gpu - keep_blocks - need < b.watermark_blocks:
                self.incoming.appendleft(h)
                return
            b.free_gpu -= need  # the sequence still holds its prefill blocks: these are the handoff's
            h.decode_blocks = need
            self.inbound += 1
            self.transfers.reserved(h)

    def land(self, h, now_s: float) -> None:
        """`h`'s KV has arrived: its first token is out and it decodes from the next iteration."""
        seq = h.seq
        self.inbound -= 1
        seq.num_gpu_blocks = h.decode_blocks
        emit_token(seq, now_s, [])
        self.running.append(seq)
        self.wake()

    def _apply(self, d):
        """The scheduler's decision first (the running batch comes before newcomers), then
        blocks for the prefilled sequences waiting here, from what the batch leaves free."""
        moved = super()._apply(d)
        if self.incoming:
            b = self.blocks
            keep = sum(max(0, b.blocks_for_tokens(seq.computed + n) - seq.num_gpu_blocks) for seq, n in d.batch)
            self.take_incoming(keep)
        return moved

    def _execute(self, decision, state, out_bytes: float, in_bytes: float):
        for seq, _ in decision.batch:
            self.transfers.phases.stamp_once("decode_start_s", seq.rid, self.env.now)
        yield from super()._execute(decision, state, out_bytes, in_bytes)
