"""The KV transfers from the prefill pool to the decode pool.

A prefilled sequence is routed to a decode replica (the decode pool's router) and waits there
for blocks; once it has them its KV (prompt tokens x the model's KV bytes per token, every
layer and head: the whole cache moves whatever the pools' tensor parallelism) is sent over its
prefill replica's link, one transfer at a time per link, timed by the prefill pool's cost
model (`kv_link_transfer_time_s`). With layer-wise streaming, the sequences of one prefill
iteration that get their decode blocks the moment it ends are sent together while it runs
(`kv_link_streamed_time_s`: only the last layer's share follows the prefill when the link keeps
up); a sequence that had to wait for blocks or for the link is sent whole afterwards. The
prefill side's blocks are freed when the transfer ends."""

from __future__ import annotations

from dataclasses import dataclass

from .phases import PhaseTimes


@dataclass
class Handoff:
    seq: object
    source: object  # PrefillReplica
    held_blocks: int  # taken on the source until the transfer ends
    nbytes: float
    prefill_end_s: float
    prefill_time_s: float  # of the iteration that finished the prompt
    dest: object = None  # DecodeReplica


class KVTransfers:
    def __init__(self, sim, section, bytes_kv_per_token: float, phases: PhaseTimes):
        self.sim, self.env = sim, sim.env
        self.link = section.link
        self.streaming = section.layerwise_streaming
        self.layers = sim.model.num_layers
        self.bytes_kv_per_token = float(bytes_kv_per_token)
        self.phases = phases
        self.decode: list = []
        self.router = None
        self._streams: dict = {}  # prefill replica -> the handoffs it streams at this instant
        self.counters = {"transfers": 0, "streamed": 0, "bytes": 0.0, "time_s": 0.0}

    def prefilled(self, source, seqs: list, prefill_time_s: float) -> None:
        """`seqs` finished their prompts on `source` in an iteration of `prefill_time_s`."""
        now = self.env.now
        for seq in seqs:
            h = Handoff(seq, source, seq.num_gpu_blocks, seq.computed * self.bytes_kv_per_token, now, prefill_time_s)
            seq.num_gpu_blocks = 0  # the source's blocks are now the handoff's
            self.phases.stamp("prefill_end_s", seq.rid, now)
            self.phases.prefill_replica[seq.rid] = source.index
            h.dest = self.decode[self.router.route(seq, self.decode)]
            h.dest.offer(h)

    def reserved(self, h: Handoff) -> None:
        """A decode replica took blocks for `h`: send its KV. Streamed, the handoffs of one
        prefill iteration that get their blocks the moment it ends go together."""
        if self.streaming and h.prefill_end_s == self.env.now:
            group = self._streams.get(h.source)
            if group is None:
                group = self._streams[h.source] = []
                self.env.process(self._stream(h.source))
            group.append(h)
        else:
            self.env.process(self._send([h], streamed=False))

    def _stream(self, source):
        yield self.env.timeout(0)  # every decode replica that takes blocks at this instant joins the group
        yield from self._send(self._streams.pop(source), streamed=True)

    def abort(self, h: Handoff, now_s: float) -> None:
        """`h` can never fit in its decode replica's pool."""
        h.source.release(h.held_blocks)
        self.sim.finish(h.seq, now_s, aborted=True)

    def _send(self, handoffs: list[Handoff], streamed: bool):
        src, env = handoffs[0].source, self.env
        nbytes = sum(h.nbytes for h in handoffs)
        with src.kv_link.request() as req:
            yield req
            start = env.now
            streamed = streamed and start == handoffs[0].prefill_end_s  # the link was free during the prefill
            if streamed:
                dt = src.cost.kv_link_streamed_time_s(nbytes, self.link, handoffs[0].prefill_time_s, self.layers)
            else:
                dt = src.cost.kv_link_transfer_time_s(nbytes, self.link)
            for h in handoffs:
                self.phases.stamp("transfer_start_s", h.seq.rid, start)
            yield env.timeout_at(start + dt)
        end = env.now
        c = self.counters
        c["transfers"] += 1
        c["streamed"] += int(streamed)
        c["bytes"] += nbytes
        c["time_s"] += end - start
        for h in handoffs:
            src.release(h.held_blocks)
            self.phases.stamp("transfer_end_s", h.seq.rid, end)
            h.dest.land(h.seq, end)
