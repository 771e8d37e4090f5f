"""Iteration-level schedulers: which sequences run this iteration, which are admitted,
preempted or swapped back in. Written once, called by the simulator and the executor.

`fcfs` follows vLLM 0.2-0.4: prefill-only iterations when anything can be admitted (and
nothing is swapped out), otherwise a decode iteration that preempts the most recent
arrivals until every running sequence has room for its next token, then swaps back in.
`fairness` is AdaptiveLLM Algorithm 2. With `chunked_prefill` (Sarathi) both build mixed
iterations: decodes first, then prefill chunks filling the token budget."""

from __future__ import annotations

from ..registry import Registry
from .preemption import PreemptionPolicy
from .state import AllocStatus, Decision, SchedulerState

SCHEDULERS: Registry = Registry("scheduler")


class Scheduler:
    name = "base"

    def __init__(self, preemption: PreemptionPolicy):
        self.preemption = preemption

    # -- ordering: lower key runs first, the last one is the preemption victim ----------
    def order_key(self, seq, state: SchedulerState):
        return (seq.arrival_s, seq.rid)

    def schedule(self, state: SchedulerState) -> Decision:
        raise NotImplementedError

    def repeats_while_decoding(self, state: SchedulerState) -> bool:
        """Would this scheduler keep returning the same plain decode, step after step, until
        a sequence finishes, blocks run short or something arrives? True when queue order is
        fixed (FCFS): a candidate that could not start will not start while free blocks only
        shrink. The engine then jumps over those steps instead of asking again."""
        return True

    # -- shared building blocks ---------------------------------------------------------
    def _reserve_running(self, state: SchedulerState, decision: Decision) -> tuple[list, int, int]:
        """Give every running sequence room for its next step, preempting from the back of
        the priority order as needed. A policy may answer "stall" (swap-only with a full CPU
        pool): the sequence then sits this iteration out holding its blocks. If every
        sequence stalls, nothing could ever free a block, so the last victim is recomputed.
        Returns (sequences to run, free GPU blocks, free CPU blocks)."""
        queue = sorted(state.running, key=lambda s: self.order_key(s, state))
        free, free_cpu = state.free_gpu_blocks, state.free_cpu_blocks
        kept, stalled = [], []
        while queue:
            seq = queue.pop(0)
            q = self._step_tokens(seq, state)
            need = state.new_blocks_for_step(seq, q)
            while need > free:
                victim = queue[-1] if queue else seq
                mode = self.preemption.choose(victim, state, free_cpu)
                if mode in ("stall", "stall_tail"):
                    stalled.append(seq)
                    if mode == "stall_tail":  # the batch stops growing here: the rest sit out too
                        stalled.extend(queue)
                        queue.clear()
                    break
                if queue:
                    queue.pop()
                decision.preempt.append((victim, mode))
                free += state.freed_by_preempting(victim)
                if mode == "swap":
                    free_cpu -= victim.num_gpu_blocks
                if victim is seq:
                    break
            else:
                free -= need
                kept.append(seq)
        if stalled and not kept and not decision.preempt:
            victim = stalled[-1]
            decision.preempt.append((victim, "recompute"))
            free += state.freed_by_preempting(victim)
        return kept, free, free_cpu

    def _step_tokens(self, seq, state: SchedulerState) -> int:
        """Tokens a running sequence processes this step: 1 when decoding, else its next
        prefill chunk (only with chunked prefill can a running sequence be mid-prefill)."""
        remaining = seq.num_tokens - seq.computed
        return 1 if remaining <= 1 else remaining

    def _admissible(
        self, state: SchedulerState, free: int, n_running: int, candidates: list, token_budget: int, decision: Decision
    ) -> tuple[list, int]:
        """Waiting sequences that can start now, in the given order: stop at the first that
        must wait (LATER), drop those that never can (NEVER / too long)."""
        chosen, tokens = [], 0
        for seq in candidates:
            n_tok = seq.num_tokens
            status = state.admission(n_tok, free)
            if n_tok > state.limits.max_model_len or status is AllocStatus.NEVER:
                decision.abort.append(seq)
                continue
            if status is AllocStatus.LATER:
                break
            if n_running + len(chosen) + 1 > state.limits.max_batch_size:
                break
            if not state.limits.chunked_prefill and tokens + n_tok > token_budget:
                break
            chosen.append(seq)
            free -= state.blocks_for_tokens(n_tok)
            tokens += n_tok
        return chosen, free

    def _swappable(
        self, state: SchedulerState, free: int, n_running: int, candidates: list, decision: Decision
    ) -> tuple[list, int]:
        """Swapped sequences that can come back now, in order; one that has outgrown the whole
        GPU pool never can (NEVER) and is aborted, as an over-long prompt is."""
        chosen = []
        for seq in candidates:
            # its blocks come back, plus room for the token it decodes in this same iteration
            need = max(seq.num_cpu_blocks, state.blocks_for_tokens(seq.computed + 1))
            if state.total_gpu_blocks - need < state.watermark_blocks:
                decision.abort.append(seq)
                continue
            if free - need < state.watermark_blocks or n_running + len(chosen) + 1 > state.limits.max_batch_size:
                break
            chosen.append(seq)
            free -= need
        return chosen, free

    def _chunked_batch(self, state: SchedulerState, decode: list, prefills: list) -> list[tuple]:
        """Sarathi: every decode takes one token of the budget, prefills share the rest."""
        budget = state.limits.max_batched_tokens
        batch = []
        for seq in decode:
            q = self._step_tokens(seq, state)
            if q == 1:
                batch.append((seq, 1))
                budget -= 1
        for seq in [s for s in decode if self._step_tokens(s, state) > 1] + prefills:
            if budget <= 0:
                break
            q = min(seq.num_tokens - seq.computed, budget)
            batch.append((seq, q))
            budget -= q
        return batch


@SCHEDULERS.register("fcfs")
class FCFSScheduler(Scheduler):
    name = "fcfs"

    def schedule(self, state: SchedulerState) -> Decision:
        d = Decision()
        lim = state.limits
        if lim.chunked_prefill:
            kept, free, _ = self._reserve_running(state, d)
            if not d.preempt and not state.swapped:
                d.admit, free = self._admissible(state, free, len(kept), state.waiting, lim.max_batched_tokens, d)
            elif not d.preempt:
                d.swap_in, free = self._swappable(state, free, len(kept), state.swapped, d)
            d.batch = self._chunked_batch(state, kept + d.swap_in, d.admit)
            admitted_running = {id(s) for s, _ in d.batch}
            d.admit = [s for s in d.admit if id(s) in admitted_running]
            return d
        if not state.swapped and state.waiting:
            d.admit, _ = self._admissible(
                state, state.free_gpu_blocks, len(state.running), state.waiting, lim.max_batched_tokens, d
            )
            if d.admit:
                d.batch = [(s, s.num_tokens) for s in d.admit]
                return d
        kept, free, _ = self._reserve_running(state, d)
        if not d.preempt and state.swapped:
            d.swap_in, free = self._swappable(state, free, len(kept), state.swapped, d)
        d.batch = [(s, 1) for s in kept + d.swap_in]
        return d


@SCHEDULERS.register("fairness")
class FairnessScheduler(Scheduler):
    """AdaptiveLLM Algorithm 2. priority = (now - first enqueue) / sequence length: short
    and long-waiting requests first. Each iteration admits either from the swapped queue or
    from the waiting queue, never both, whichever candidate set has the higher mean priority;
    an admission from waiting is a prefill-only iteration."""

    name = "fairness"

    @staticmethod
    def priority(seq, state: SchedulerState) -> float:
        return (state.now_s - seq.first_enqueue_s) / max(1, seq.num_tokens)

    def order_key(self, seq, state):
        return (-self.priority(seq, state), seq.arrival_s, seq.rid)

    def repeats_while_decoding(self, state: SchedulerState) -> bool:
        # priorities drift with time at different rates, so the head of the queue can change
        # mid-stretch; only when no candidate could start in any order is the decode stable
        if len(state.running) >= state.limits.max_batch_size:
            return True
        room = state.free_gpu_blocks - state.watermark_blocks
        smallest = min((state.blocks_for_tokens(s.num_tokens) for s in state.waiting), default=None)
        smallest_swapped = min(
            (max(s.num_cpu_blocks, state.blocks_for_tokens(s.computed + 1)) for s in state.swapped), default=None
        )
        return all(x is None or x > room for x in (smallest, smallest_swapped))

    def schedule(self, state: SchedulerState) -> Decision:
        d = Decision()
        lim = state.limits
        kept, free, _ = self._reserve_running(state, d)  # MemSchedule
        if d.preempt:
            # "when GPU memory is short, neither the swapped nor the waiting queue can be
            # scheduled (w_sche and s_sche are both empty)": this iteration only decodes
            s_sche, w_sche = [], []
        else:
            by_pri = lambda seqs: sorted(seqs, key=lambda s: self.order_key(s, state))
            s_sche, _ = self._swappable(state, free, len(kept), by_pri(state.swapped), d)
            probe = Decision()
            w_sche, _ = self._admissible(state, free, len(kept), by_pri(state.waiting), lim.max_batched_tokens, probe)
            d.abort.extend(probe.abort)
        mean = lambda seqs: sum(self.priority(s, state) for s in seqs) / len(seqs)
        if s_sche and (not w_sche or mean(w_sche) <= mean(s_sche)):
            d.swap_in = s_sche
        elif w_sche:
            d.admit = w_sche
            if not lim.chunked_prefill:
                d.batch = [(s, s.num_tokens) for s in w_sche]
                return d
        if lim.chunked_prefill:
            d.batch = self._chunked_batch(state, kept + d.swap_in, d.admit)
            admitted = {id(s) for s, _ in d.batch}
            d.admit = [s for s in d.admit if id(s) in admitted]
        else:
            d.batch = [(s, 1) for s in kept + d.swap_in]
        return d
