"""Device selection, timing and host buffers for the profiler.

One `Timer` interface with two implementations: on CUDA, events recorded around the work
on the current stream and a synchronize before reading them (kernel launches are
asynchronous, so a host clock would time the launch, not the kernel); on the CPU, the
host's monotonic `perf_counter` around the call (CPU kernels run synchronously).

`measure()` is the one place warm-up, repeats, median and spread are decided, so every
micro-benchmark reports the same statistics."""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

from infersim.simulator.errors import InfersimError
from infersim.simulator.machine import cpu_model, host_memory_gb  # noqa: F401  (re-exported)

from ..device import DEVICE_CHOICES, select_device  # noqa: F401  (re-exported)


# ---- timers -----------------------------------------------------------------------------
class Timer:
    """Seconds taken by one call of fn, with whatever the device needs to be exact."""

    kind = "base"

    def sync(self) -> None:
        pass

    def time(self, fn: Callable[[], object]) -> float:  # pragma: no cover - interface
        raise NotImplementedError


class CpuTimer(Timer):
    kind = "perf_counter"

    def time(self, fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


class CudaEventTimer(Timer):
    """CUDA events on the current stream: record start, run, record end, synchronize on the
    end event, read the elapsed time (ms on the GPU's clock)."""

    kind = "cuda_events"

    def __init__(self, device):
        import torch

        self.torch = torch
        self.device = device
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def sync(self):
        self.torch.cuda.synchronize(self.device)

    def time(self, fn):
        self.sync()  # nothing queued before the start event
        self._start.record()
        fn()
        self._end.record()
        self._end.synchronize()
        return self._start.elapsed_time(self._end) / 1e3


def timer_class_for(device_type: str) -> type[Timer]:
    """The Timer implementation a device type gets (cuda: events; cpu: perf_counter)."""
    if device_type == "cuda":
        return CudaEventTimer
    if device_type == "cpu":
        return CpuTimer
    raise InfersimError(f"no timer for device type '{device_type}'")


def make_timer(device) -> Timer:
    cls = timer_class_for(device.type)
    return cls(device) if cls is CudaEventTimer else cls()


# ---- statistics -----------------------------------------------------------------------
@dataclass
class Stats:
    median_s: float
    p10_s: float
    p90_s: float
    min_s: float
    max_s: float
    repeats: int
    warmup: int

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative spread of the repeats."""
        return (self.p90_s - self.p10_s) / self.median_s if self.median_s > 0 else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["spread"] = round(self.spread, 4)
        return d


def _quantile(sorted_xs: list[float], q: float) -> float:
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = q * (len(sorted_xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Repeats:
    """How hard to measure one point: warm-up calls, then at least `min_repeats` timed calls,
    more while under `target_s` of measured time, never more than `max_repeats`."""

    warmup: int = 1
    min_repeats: int = 3
    max_repeats: int = 15
    target_s: float = 0.05


def measure(fn: Callable[[], object], timer: Timer, rep: Repeats = Repeats()) -> Stats:
    for _ in range(rep.warmup):
        fn()
    timer.sync()
    samples: list[float] = []
    spent = 0.0
    while len(samples) < rep.min_repeats or (spent < rep.target_s and len(samples) < rep.max_repeats):
        t = timer.time(fn)
        samples.append(t)
        spent += t
    xs = sorted(samples)
    return Stats(statistics.median(xs), _quantile(xs, 0.1), _quantile(xs, 0.9), xs[0], xs[-1], len(xs), rep.warmup)


# ---- host buffers and copies -------------------------------------------------------------
def copy_variants(device_type: str) -> list[tuple[str, bool]]:
    """(label, pinned) host-buffer kinds the copy sweep measures: pinned (page-locked, DMA
    straight from the buffer) and pageable (staged through a driver buffer) on CUDA; plain
    buffer-to-buffer copies on the CPU, where there is no host link and nothing to pin."""
    return [("pinned", True), ("pageable", False)] if device_type == "cuda" else [("plain", False)]


def host_buffer(nbytes: int, *, pinned: bool, device_type: str, dtype=None):
    """A host tensor of nbytes; pinned only where that means something (CUDA)."""
    import torch

    if pinned and device_type != "cuda":
        raise InfersimError("pinned host memory needs a CUDA device (--device cuda)")
    dtype = dtype or torch.uint8
    n = max(1, nbytes // torch.empty((), dtype=dtype).element_size())
    return torch.empty(n, dtype=dtype, pin_memory=pinned)


# ---- what machine is this ----------------------------------------------------------------
def load_average() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


def device_info(device) -> dict:
    """What the profile says it was measured on."""
    import torch

    info = {
        "device": str(device),
        "torch": str(torch.__version__),
        "threads": torch.get_num_threads(),
        "host_cpu": cpu_model(),
        "host_cores": os.cpu_count(),
        "host_memory_gb": round(host_memory_gb(), 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            name=props.name,
            memory_gb=round(props.total_memory / 1e9, 1),
            memory_visible_gib=round(props.total_memory / 2**30, 2),
            cuda=str(torch.version.cuda),
            sm_count=props.multi_processor_count,
        )
        if torch.version.hip is None:  # ROCm reports its gfx version here, not a CUDA capability
            info["compute_capability"] = float(f"{props.major}.{props.minor}")
    else:
        info.update(name=info["host_cpu"], memory_gb=info["host_memory_gb"])
    return info
