import os

import pytest

# plots and the CLI must never need a display
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture
def small_workload():
    """A workload spec built in code: OPT-125M-sized serving on an A100 with a tiny KV pool,
    so preemption happens within a few dozen requests."""
    from simulator.workload.schema import WorkloadSpec

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
