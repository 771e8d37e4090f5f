"""Preemption mode: when GPU KV blocks run out, does a victim go to CPU (swap) or lose its
KV and get prefilled again later (recompute)? AdaptiveLLM Algorithm 1 compares the two costs."""

from __future__ import annotations

from ..registry import Registry
from .state import SchedulerState

PREEMPTION_POLICIES: Registry = Registry("preemption policy")


class PreemptionPolicy:
    name = "base"

    swap_only = False  # a recompute is then forced (every running sequence stalled), not chosen

    def choose(self, seq, state: SchedulerState, free_cpu_blocks: int) -> str:
        """ "swap", "recompute", "stall" (do not preempt: the sequence needing room waits) or
        "stall_tail" (it and every lower-priority sequence wait)."""
        raise NotImplementedError

    @staticmethod
    def fits_on_cpu(seq, free_cpu_blocks: int) -> bool:
        # a half-prefilled sequence has no complete KV worth moving
        return seq.computed >= seq.num_tokens - 1 and seq.num_gpu_blocks <= free_cpu_blocks


@PREEMPTION_POLICIES.register("recompute")
class RecomputePreemption(PreemptionPolicy):
    """vLLM's default for single-sequence requests."""

    name = "recompute"

    def choose(self, seq, state, free_cpu_blocks):
        return "recompute"


@PREEMPTION_POLICIES.register("swap")
class SwapPreemption(PreemptionPolicy):
    """Always swap (AdaptiveLLM's vLLM_s baseline). vLLM aborts when CPU swap space runs out;
    AdaptiveLLM reports that its swap-only baseline instead ran smaller batches when the CPU
    pool was full. So a victim that does not fit on the CPU is not preempted: the sequence that
    needed the block waits ("stall") until blocks free up. Only when every running sequence
    waits is one recomputed (counted apart as forced)."""

    name = "swap"
    swap_only = True

    def choose(self, seq, state, free_cpu_blocks):
        return "swap" if self.fits_on_cpu(seq, free_cpu_blocks) else "stall"


@PREEMPTION_POLICIES.register("swap_tail")
class SwapTailPreemption(SwapPreemption):
    """Swap-only, but a full CPU pool stops the batch from growing: the sequence that needed a
    block and every lower-priority one after it sit the iteration out ("stall_tail"), as if
    vLLM's reservation loop were left at the first victim that does not fit. An alternative
    reading of the paper's unstated vLLM_s behaviour, for the AdaptiveLLM study."""

    name = "swap_tail"

    def choose(self, seq, state, free_cpu_blocks):
        return "swap" if self.fits_on_cpu(seq, free_cpu_blocks) else "stall_tail"


@PREEMPTION_POLICIES.register("cost_aware")
class CostAwarePreemption(PreemptionPolicy):
    """AdaptiveLLM Algorithm 1: swap when the KV fits on the CPU and moving it out and back
    (KV bytes / D2H + KV bytes / H2D) is predicted cheaper than prefilling it again."""

    name = "cost_aware"

    def swap_cost_s(self, seq, state: SchedulerState) -> float:
        nbytes = seq.num_gpu_blocks * state.kv_bytes_per_block
        copies = state.swap_copies(seq.num_gpu_blocks)
        cm = state.cost_model
        return cm.kv_transfer_time_s(nbytes, "d2h", copies) + cm.kv_transfer_time_s(nbytes, "h2d", copies)

    def recompute_cost_s(self, seq, state: SchedulerState) -> float:
        return state.cost_model.prefill_time_s(seq.num_tokens)

    def choose(self, seq, state, free_cpu_blocks):
        if not self.fits_on_cpu(seq, free_cpu_blocks):
            return "recompute"
        return "swap" if self.swap_cost_s(seq, state) < self.recompute_cost_s(seq, state) else "recompute"
