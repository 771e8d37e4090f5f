"""The input rules every command shares: finite positive rates, seeds in range, tensor
parallelism that splits the heads, and work whose estimated memory fits this machine.

Schemas call these rules through pydantic (`STRICT_CONFIG` refuses NaN and infinity in every
float field); commands call them for their flags and, through `check_workload`, for the whole
resolved workload before any simulation starts. Each failure is one `InfersimError` line naming
the file or flag and the field."""

from __future__ import annotations

import math
from typing import Any

from pydantic import ConfigDict

from .errors import InfersimError
from .machine import host_available_bytes, usable_cpus

# Every strict schema: unknown keys and non-finite numbers (.nan, .inf in YAML) are errors.
STRICT_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)

# numpy's SeedSequence takes any non-negative integer; the run folder stores the seed as int64.
MAX_SEED = 2**63 - 1

# Peak resident memory of `sim run` grows by about 320 bytes per request (measured on a burst
# workload, where every request is queued at once: 137 MB at 2,000 requests, 198 MB at
# 200,000). The estimate rounds up to 512 bytes and adds the interpreter and libraries.
BYTES_PER_REQUEST = 512
BASE_BYTES = 256 * 2**20
# Each replica (its scheduler, block manager and queues) adds about 2 KB (40 MB at 20,000).
BYTES_PER_REPLICA = 4096

MEMORY_FLAG = "--no-memory-check"

# Token counts are int64; 2^40 is far beyond any context, yet safe to convert, clip and sum.
MAX_TOKENS = 2**40


def source_field(source: str, field: str) -> str:
    """'FILE: field 'a.b'' for a file, '--flag' alone for a command-line option."""
    return field if field.startswith("--") else f"{source}: field '{field}'"


def finite_positive(value: float, field: str, source: str = "") -> float:
    """A rate, a duration: a real number > 0 (not NaN, not infinite)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise InfersimError(f"{source_field(source, field)}: expected a finite number > 0, got {value!r}")
    return float(value)


def positive_int(value: int, field: str, source: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InfersimError(f"{source_field(source, field)}: expected a whole number >= 1, got {value!r}")
    return value


def check_threads(value: int, field: str = "--threads", zero_ok: bool = False) -> int:
    """Torch CPU threads: a whole number from 1 (from 0 where 0 means torch's default) to this
    machine's CPUs. More only contend for the same cores, and an absurd count fails deep inside
    the thread pool ("can't start new thread"). The bound is at least 2, the profiler's and the
    head trainer's default, so that a default never fails on a one-CPU machine."""
    lowest = 0 if zero_ok else 1
    most = max(usable_cpus(), 2)
    if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= most:
        raise InfersimError(
            f"{field}: expected a whole number from {lowest} to {most} (the CPUs this machine gives), got {value!r}"
        )
    return value


def check_seed(seed: int, field: str = "seed", source: str = "") -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise InfersimError(
            f"{source_field(source, field)}: a seed is a whole number from 0 to {MAX_SEED}, " f"got {seed!r}"
        )
    return seed


def whole_number(value: Any) -> Any:
    """A pydantic before-validator for counts: `1e3` (a string to YAML) or `1000.0` becomes 1000,
    so the range rules, not the parser, judge it; anything else passes through unchanged."""
    if isinstance(value, str):
        try:
            number = float(value.replace("_", ""))
        except ValueError:
            return value
        value = number
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def check_tensor_parallel(model, tp: int, field: str = "hardware.tensor_parallel", source: str = "") -> int:
    """One rule for every command: TP splits the attention heads evenly, and the KV heads either
    split evenly (kv_heads % tp == 0) or are replicated whole (tp % kv_heads == 0)."""
    where = source_field(source, field)
    positive_int(tp, field, source)
    if model.num_heads % tp:
        raise InfersimError(
            f"{where}: tensor parallel {tp} does not divide {model.name}'s {model.num_heads} " f"attention heads"
        )
    kv = model.kv_heads
    if kv % tp and tp % kv:
        raise InfersimError(
            f"{where}: tensor parallel {tp} neither divides {model.name}'s {kv} KV heads nor is " f"a multiple of them"
        )
    return tp


# ---- memory ---------------------------------------------------------------------------------


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:,.3g} GB" if n_bytes < 1e12 else f"{n_bytes / 1e12:,.3g} TB"


def check_memory(estimate_bytes: float, what: str, allow: bool = False) -> None:
    """Refuse up front work whose estimated memory exceeds what this machine has available,
    with the estimate in the message, unless `allow` (the command's --no-memory-check)."""
    if allow:
        return
    avail = host_available_bytes()
    if estimate_bytes > avail:
        raise InfersimError(
            f"{what} would need about {_gb(estimate_bytes)} of memory, more than the {_gb(avail)} "
            f"available; make it smaller, or pass {MEMORY_FLAG} to try anyway"
        )


def simulation_bytes(n_requests: float, parallel: int = 1, replicas: int = 1) -> float:
    """Estimated peak memory of `parallel` simulations of `n_requests` requests each."""
    return parallel * (BASE_BYTES + BYTES_PER_REQUEST * float(n_requests) + BYTES_PER_REPLICA * float(replicas))


def expected_requests(spec) -> float:
    """Requests a workload generates: its count, or rate x duration_s for open-loop arrivals
    (the smaller when both are given); a trace is bounded by its file and counts as its count."""
    r = spec.requests
    rate = getattr(r.arrival, "rate", None)
    by_time = rate * r.duration_s if rate is not None and r.duration_s is not None else None
    if r.count is not None and by_time is not None:
        return min(r.count, by_time)
    if r.count is not None:
        return r.count
    return by_time or 0.0


# ---- whole workloads ------------------------------------------------------------------------


def in_field(source: str, field: str, load, *args, **kwargs):
    """load(*args): an error it raises is reported against the file's field (or the flag)."""
    try:
        return load(*args, **kwargs)
    except InfersimError as exc:
        raise InfersimError(f"{source_field(source, field)}: {exc}") from None


def arrivals_notice(spec, n_requests: int) -> str | None:
    """The documented count + duration_s rule: arrivals stop at whichever limit comes first.
    When duration_s stopped them before `count`, a notice says so (the command prints it)."""
    r = spec.requests
    if (
        r.count is None
        or r.duration_s is None
        or n_requests >= r.count
        or r.arrival is not None
        and r.arrival.type == "closed_loop"
    ):
        return None
    return (
        f"notice: requests.duration_s {r.duration_s:g} s ended arrivals after {n_requests:,} of the "
        f"{r.count:,} requests of requests.count (arrivals stop at whichever limit comes first; raise "
        f"duration_s or the rate for more)"
    )
