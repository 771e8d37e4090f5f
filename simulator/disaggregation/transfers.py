"""The KV transfers from the prefill pool to the decode pool.

Each request whose prompt a prefill replica finishes is handed off: the decode pool's router
picks a decode replica, where the request waits for blocks (decode.py). Its KV cache (prompt
tokens x the bytes one token puts on the link: every decode GPU's shard, link.py) goes over its
prefill replica's link (the resolved `link`), one transfer at a time per link, timed by the
prefill pool's cost model. The prefill side's blocks are freed when the
transfer ends, and the request's first token counts as delivered then.

Without streaming the hand-off happens when the prompt is done and the transfer
(`kv_link_transfer_time_s`) starts once the decode replica has taken blocks and the link is free.

With layer-wise streaming (Splitwise) the hand-off happens when the prefill iteration that
finishes the prompt starts, so that the decode side can take blocks while it runs; the
prompts of one iteration form one transfer, which starts when all of them have decode blocks
and the link is free. Started during the prefill, it sends each layer's share as the prefill
computes it (`kv_link_streamed_time_s`); started after it, it sends the whole cache. The
`transfer_s` phase is the part of the transfer after the prompt is done."""

from __future__ import annotations

from dataclasses import dataclass, field

from .phases import PhaseTimes


@dataclass
class Handoff:
    seq: object
    source: object  # PrefillReplica
    nbytes: float
    prefill_start_s: float  # of the iteration that finishes the prompt
    prefill_end_s: float
    dest: object = None  # DecodeReplica
    held_blocks: int = 0  # taken on the source from the prompt's end until the transfer ends
    decode_blocks: int = 0  # taken on the destination for it
    prefilled: bool = False
    aborted: bool = False


@dataclass
class _Group:
    """The handoffs sent as one transfer, and how many of them still wait for decode blocks."""

    handoffs: list = field(default_factory=list)
    waiting: int = 0
    ready: object = None  # SimPy event: every handoff has its blocks (or was aborted)


class KVTransfers:
    def __init__(self, sim, section, link, bytes_sent_per_token: float, phases: PhaseTimes):
        self.sim, self.env = sim, sim.env
        self.link = link  # ResolvedKVLink
        self.streaming = section.layerwise_streaming
        self.layers = sim.model.num_layers
        self.bytes_sent_per_token = float(bytes_sent_per_token)
        self.phases = phases
        self.decode: list = []
        self.router = None
        self._groups: dict[int, _Group] = {}  # id(handoff) -> its group
        self.counters = {"transfers": 0, "streamed": 0, "bytes": 0.0, "time_s": 0.0}

    # ---- hand-offs from the prefill replicas ------------------------------------------
    def starting(self, source, seqs: list, start_s: float, end_s: float) -> list[Handoff]:
        """A prefill iteration from start_s to end_s will finish the prompts of `seqs`; with
        streaming they are handed off now, as one group (returns the handoffs, else [])."""
        if not self.streaming or not seqs:
            return []
        group = _Group(waiting=len(seqs), ready=self.env.event())
        for seq in seqs:
            h = Handoff(seq, source, seq.num_tokens * self.bytes_sent_per_token, start_s, end_s)
            group.handoffs.append(h)
            self._groups[id(h)] = group
            self._offer(h)
        self.env.process(self._send_group(group))
        return group.handoffs

    def prefilled(self, source, seqs: list, start_s: float, handoffs: list[Handoff]) -> None:
        """The prompts of `seqs` are done on `source`; `handoffs` are theirs if streamed."""
        now = self.env.now
        by_seq = {id(h.seq): h for h in handoffs}
        for seq in seqs:
            h = by_seq.get(id(seq))
            if h is None:
                h = Handoff(seq, source, seq.computed * self.bytes_sent_per_token, start_s, now)
                self._offer(h)
            h.held_blocks, seq.num_gpu_blocks = seq.num_gpu_blocks, 0  # the source's blocks are the handoff's
            h.prefilled = True
            self.phases.stamp("prefill_end_s", seq.rid, now)
            self.phases.prefill_replica[seq.rid] = source.index
            if h.aborted:
                self._drop(h)

    def _offer(self, h: Handoff) -> None:
        h.dest = self.decode[self.router.route(h.seq, self.decode)]
        h.dest.offer(h)

    # ---- called by the decode replicas ------------------------------------------------
    def reserved(self, h: Handoff) -> None:
        """`h.dest` took blocks for `h`: send it (or count it ready in its group)."""
        group = self._groups.get(id(h))
        if group is None:
            self.env.process(self._send([h]))
        else:
            self._one_ready(group)

    def abort(self, h: Handoff) -> None:
        """`h` can never fit in its decode replica's pool: it ends once its prompt is done."""
        h.aborted = True
        group = self._groups.get(id(h))
        if group is not None:
            self._one_ready(group)
        if h.prefilled:
            self._drop(h)

    def _one_ready(self, group: _Group) -> None:
        group.waiting -= 1
        if group.waiting == 0:
            group.ready.succeed()

    def _drop(self, h: Handoff) -> None:
        h.source.release(h.held_blocks)
        h.held_blocks = 0
        self.sim.finish(h.seq, self.env.now, aborted=True)

    # ---- the transfers ----------------------------------------------------------------
    def _send_group(self, group: _Group):
        yield group.ready
        for h in group.handoffs:
            del self._groups[id(h)]
        live = [h for h in group.handoffs if not h.aborted]
        if live:
            yield from self._send(live)

    def _send(self, handoffs: list[Handoff]):
        src, env, first = handoffs[0].source, self.env, handoffs[0]
        nbytes = sum(h.nbytes for h in handoffs)
        with src.kv_link.request() as req:
            yield req
            start = env.now
            streamed = start < first.prefill_end_s
            if streamed:
                prefill_s = first.prefill_end_s - first.prefill_start_s
                exposed = src.cost.kv_link_streamed_time_s(
                    nbytes, self.link, prefill_s, self.layers, started_s=start - first.prefill_start_s
                )
                end = first.prefill_end_s + exposed
            else:
                end = start + src.cost.kv_link_transfer_time_s(nbytes, self.link)
            yield env.timeout_at(end)
        c = self.counters
        c["transfers"] += 1
        c["streamed"] += int(streamed)
        c["bytes"] += nbytes
        c["time_s"] += end - start
        for h in handoffs:
            # a streamed transfer delays the request only after its prompt is done
            self.phases.stamp("transfer_start_s", h.seq.rid, max(start, h.prefill_end_s))
            self.phases.stamp("transfer_end_s", h.seq.rid, end)
            src.release(h.held_blocks)
            h.dest.land(h, end)
