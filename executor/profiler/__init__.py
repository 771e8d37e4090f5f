"""The profiler (`sim profile`): micro-benchmarks and whole-iteration step times on a torch
device, fitted into a HardwareProfile YAML plus a verified sidecar with the measured curves
and the step-time regressors (AdaptiveLLM 3.2-3.3). Importing this package does not import
torch; the benchmarks do, when they run."""

from __future__ import annotations

from . import run

__all__ = ["ProfileOptions", "run_profile", "sidecar_path"]


def __getattr__(name):
    if name in __all__:
        return getattr(run, name)
    raise AttributeError(name)
