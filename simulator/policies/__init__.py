"""Serving policies shared by the simulator and the executor (no SimPy in here)."""

from .preemption import PREEMPTION_POLICIES, PreemptionPolicy
from .scheduling import SCHEDULERS, Scheduler
from .state import Decision, SchedulerLimits, SchedulerState


def build_scheduler(scheduler: str, preemption: str) -> Scheduler:
    return SCHEDULERS.get(scheduler)(PREEMPTION_POLICIES.get(preemption)())


__all__ = [
    "PREEMPTION_POLICIES",
    "SCHEDULERS",
    "Decision",
    "PreemptionPolicy",
    "Scheduler",
    "SchedulerLimits",
    "SchedulerState",
    "build_scheduler",
]
