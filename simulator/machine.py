"""What machine this is, for the headers of measured results (torch-free, so the simulator's
reports can say it too)."""

from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what platform knows."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def host_memory_gb() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return 16.0


def host_available_bytes() -> int:
    """Memory a new allocation of this process can take without swapping: the kernel's
    MemAvailable (free pages plus reclaimable caches), else the free physical pages, capped by
    the cgroup's memory limit where one is set (a container sees the host's MemAvailable)."""
    avail = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            avail = int(host_memory_gb() * 1e9)
    try:
        with open("/sys/fs/cgroup/memory.max") as fh:
            text = fh.read().strip()
        if text.isdigit():
            avail = min(avail, int(text))
    except OSError:
        pass
    return avail


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which a container or `taskset` narrows)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def machine_line() -> str:
    """One line: CPU, cores, Python, OS."""
    return f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"
