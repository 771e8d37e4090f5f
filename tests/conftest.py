import os

import pytest

# plots and the CLI must never need a display
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture
def small_workload():
    """A workload spec built in code: OPT-125M-sized serving on an A100 with a tiny KV pool,
    so preemption happens within a few dozen requests."""
    from infersim.simulator.workload.schema import WorkloadSpec

    def make(**serving):
        base = {
            "name": "small",
            "model": "opt-1.3b",
            "hardware": {"profile": "a100-80gb-pcie"},
            "serving": {"gpu_blocks": 48, "cpu_blocks": 24, "block_size": 16, **serving},
            "requests": {"count": 60, "arrival": {"type": "poisson", "rate": 200.0},
                         "prompt_tokens": {"type": "lognormal", "mean": 60, "cv": 0.8, "max": 300},
                         "output_tokens": {"type": "lognormal", "mean": 40, "cv": 0.8, "max": 200}},
            "seed": 3,
        }
        return WorkloadSpec.model_validate(base)

    return make


# a validated run whose speed ticks moved more than this inside it (p90/p10) is not judged
TICK_RANGE_LIMIT = 1.25


@pytest.fixture
def judge_targets():
    """judge(result, again) for a validation result (analysis/validate/run.py): passes when every
    target held; when some missed on a machine the busy detector saw as quiet, runs `again()`
    (a fresh validation, calibrated again: a shared VM's CPU speed shifts by 10-15% for minutes
    at a time without any load the detector sees) and fails if that misses too; skips, printing
    what it measured, when the machine was busy or every miss was timing noise (`noisy`)."""

    def missed_in(result) -> list[str]:
        return [f"{c['metric']} {c['value']:+.1%} (target {c['target']:.0%}): {c['component']}"
                for c in result["checks"] if not c["ok"]]

    def noisy(result) -> bool:
        """The busy test saw the machine disturbed, or every miss follows the machine's speed
        inside the run (its speed ticks: compare.within_run_source names them timing noise), or
        the run's own speed ticks moved more than TICK_RANGE_LIMIT inside it (p90/p10 of their
        local speed: the machine, not the errors), as on the AVX2 host of 2026-11-25, where no
        iteration stalled while the speed moved ±30% inside a second: over the 24 validations of
        its two matrices the ranges were 1.05-1.65, 1.25 or more in 13 (plain-load, preempt-
        recompute and spec-draft, the cases judged here: 1.22-1.65)."""
        misses = [c for c in result["checks"] if not c["ok"]]
        w = result["comparison"]["cost_model"].get("within_run") or {}
        lo, hi = w.get("tick_range") or (1.0, 1.0)
        return (bool(result.get("busy")) or (bool(misses) and all(c.get("kind") == "timing noise" for c in misses))
                or hi / lo > TICK_RANGE_LIMIT)

    def judge(result, again, only=None) -> None:
        """only: the metrics judged (default: every check)."""
        def missed_of(r):
            return [m for m, c in zip(missed_in(r), [c for c in r["checks"] if not c["ok"]])
                    if only is None or c["metric"] in only]

        assert all(c["component"] for c in result["checks"] if not c["ok"])  # a miss names its source
        missed = missed_of(result)
        if missed and not noisy(result):
            first = missed
            result = again()
            missed = missed_of(result)
            if missed:
                missed = [f"first attempt: {'; '.join(first)}; second attempt:"] + missed
        if missed and noisy(result):
            meta = result["cost_model"]["fit"]["meta"]
            cal = meta.get("calibration_stalls", meta.get("iteration_fit", {}).get("stalls", float("nan")))
            pytest.skip(f"machine too unsteady to time: {result['comparison']['cost_model']['noise']['stalls']:.1%} of "
                        f"iterations stalled (calibration {cal:.1%}), speed moved "
                        f"{meta.get('speed_shift', float('nan')):+.1%} around the run; missed: {'; '.join(missed)}")
        assert not missed, "; ".join(missed)

    return judge
