"""Carrying out a scheduler's `Decision`: the one code path the simulator's replicas (plain,
speculative, offload) and the real executor's engine share, so that a policy's preemptions
are counted alike wherever it runs.

The order is vLLM's: aborts, then preemptions (swap: the victim's KV moves to the host pool;
recompute: its KV is dropped and it goes back to the front of the waiting queue, to be
prefilled again with the tokens it generated), then swap-ins, then admissions (blocks for the
whole prompt). The KV operations are the engine's own (`KVOps`): the simulator's
`BlockManager` counts blocks, the executor's paged cache copies tensors. With prefix caching an
admission may find part of the prompt cached (`KVOps.admit` sets `seq.computed`): the batch then
runs only the rest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..policies.state import Decision
from .sequence import without


class KVOps(Protocol):
    """What a decision does to the KV cache; every count is in blocks."""

    def free(self, seq) -> None:
        """Release every block `seq` holds, on the GPU and on the host."""

    def grow_to(self, seq, tokens: int) -> int:
        """Give `seq` GPU blocks for `tokens` cached tokens; returns the blocks added."""

    def admit(self, seq, query_tokens: int) -> int:
        """A waiting sequence starts, computing `query_tokens` tokens in this iteration: blocks
        for all its tokens; with prefix caching the cached leading blocks are shared,
        `seq.computed` counts their tokens and the blocks this iteration fills are registered
        (a later admission in the same decision may share them). Returns the query tokens left
        to compute. Optional: without it an admission is `grow_to(seq, seq.num_tokens)`."""

    def swap_out(self, seqs: list) -> int:
        """Move the sequences' GPU blocks to the host pool; returns the blocks moved."""

    def swap_in(self, seqs: list) -> int:
        """Move the sequences' host blocks back to the GPU; returns the blocks moved."""


class ServingQueues(Protocol):
    """The engine whose queues a decision rearranges (a simulator replica, the executor)."""

    waiting: list
    running: list
    swapped: list

    def abort(self, seq, now_s: float) -> None:
        """`seq` can never be served: it leaves (its blocks are already freed)."""


@dataclass
class AppliedDecision:
    """What carrying out one decision did, for the engine's counters and iteration records."""

    admitted: int = 0
    aborted: int = 0
    preempt_swap: int = 0
    preempt_recompute: int = 0
    preempt_recompute_forced: int = 0  # recomputes a swap-only policy fell back to
    out_blocks: int = 0
    in_blocks: int = 0


def apply_decision(
    d: Decision,
    queues: ServingQueues,
    kv: KVOps,
    *,
    now_s: float,
    swap_only: bool,
    bytes_per_block: float,
    metrics=None,
) -> AppliedDecision:
    """Carry out `d` on `queues` and `kv`. swap_only: the scheduler's preemption policy never
    chooses a recompute (`PreemptionPolicy.swap_only`), so any recompute is counted as forced.
    metrics: a MetricsCollector (per-request preemptions, swap bytes) or None."""
    done = AppliedDecision(admitted=len(d.admit), aborted=len(d.abort))
    if d.abort:
        queues.waiting = without(queues.waiting, d.abort)
        queues.swapped = without(queues.swapped, d.abort)
        for seq in d.abort:
            kv.free(seq)
            queues.abort(seq, now_s)
    if d.preempt:
        _preempt(d, queues, kv, swap_only, metrics, done)
    if d.swap_in:
        queues.swapped = without(queues.swapped, d.swap_in)
        done.in_blocks = kv.swap_in(list(d.swap_in))
        queues.running.extend(d.swap_in)
    if d.admit:
        queues.waiting = without(queues.waiting, d.admit)
        admit = getattr(kv, "admit", None)
        queries = {id(seq): n for seq, n in d.batch} if admit is not None else None
        for seq in d.admit:
            if admit is None:
                kv.grow_to(seq, seq.num_tokens)
            else:
                queries[id(seq)] = admit(seq, queries[id(seq)])
            if seq.first_scheduled_s < 0:
                seq.first_scheduled_s = now_s
            queues.running.append(seq)
        if admit is not None:  # prefix-cache hits: the batch computes only the rest
            d.batch = [(seq, queries[id(seq)]) for seq, _ in d.batch]
    if metrics is not None:
        metrics.counters["swap_out_bytes"] += done.out_blocks * bytes_per_block
        metrics.counters["swap_in_bytes"] += done.in_blocks * bytes_per_block
    return done


def _preempt(d: Decision, queues: ServingQueues, kv: KVOps, swap_only: bool, metrics, done: AppliedDecision) -> None:
    queues.running = without(queues.running, [s for s, _ in d.preempt])
    front, out = [], []
    for seq, mode in d.preempt:
        if mode == "swap":
            out.append(seq)
            queues.swapped.append(seq)
            done.preempt_swap += 1
        else:
            kv.free(seq)
            seq.computed = 0
            front.append(seq)
            done.preempt_recompute += 1
            done.preempt_recompute_forced += int(swap_only)
        if metrics is not None:
            metrics.preempt(seq, mode, forced=swap_only and mode != "swap")
    if out:
        # one call for all victims: the executor copies their blocks in as few runs as it can
        done.out_blocks = kv.swap_out(out)
    # vLLM puts recomputed sequences back at the front of the waiting queue
    queues.waiting[:0] = sorted(front, key=lambda s: (s.arrival_s, s.rid))
