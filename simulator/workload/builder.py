"""Workload file -> Requests: find the file, validate it, replay a trace and/or sample.

Lengths and arrivals each come from the trace when it maps a column for them, otherwise from
the distributions in `requests`, so a trace's lengths can be replayed under Poisson arrivals or
a trace's arrival times under synthetic lengths."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..catalog_loader import canonical_names, resolve
from ..errors import InfersimError
from ..paths import workloads_dir
from ..validation import in_field
from ..yamlio import load_model_file
from .distributions import sample_arrivals, sample_lengths, streams
from .prefixes import TraceBlockKeys, conversation_turns
from .requests import Requests
from .schema import ClosedLoopArrivals, WorkloadSpec
from .traces import read_trace

_SUFFIXES = (".yaml", ".yml", ".json")


def list_workloads() -> list[str]:
    """Names of the built-in workloads (the files in the top-level traces/ folder)."""
    return canonical_names(workloads_dir())


def workload_path(name_or_path: str) -> Path:
    """A built-in name ("chatbot" or "chatbot.yaml") or a path to a workload file."""
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    name = p.stem if p.suffix in _SUFFIXES else name_or_path
    if p.is_dir() and (len(p.parts) > 1 or p.suffix in _SUFFIXES):  # not a bare name: load_mapping says so
        return p
    # a file name (a suffix or a folder) that is not a built-in workload is a missing file
    if len(p.parts) > 1 or (p.suffix in _SUFFIXES and name not in list_workloads()):
        raise InfersimError(f"{p}: file not found")
    return resolve("workload", name, workloads_dir())


def load_workload(name_or_path: str) -> tuple[WorkloadSpec, Path]:
    """The validated spec and the path of its file (relative paths inside it are relative to
    that file's folder: pass the path, or its folder, to build_requests; a `model` or
    `hardware.profile` file beside it is named by its path from here, `beside_workload`)."""
    path = workload_path(name_or_path)
    return beside_workload(load_model_file(WorkloadSpec, path), path.parent), path


# the workload fields that may name a file, found beside the workload file (`beside_workload`)
FILE_FIELDS = ("model", "hardware.profile")


def beside_workload(spec: WorkloadSpec, folder: Path) -> WorkloadSpec:
    """The spec with its `model` and `hardware.profile` files found beside the workload file when
    the current folder has no such file (the current folder's file wins, as it always did)."""
    model = find_beside(spec.model, folder)
    profile = find_beside(spec.hardware.profile, folder)
    if (model, profile) == (spec.model, spec.hardware.profile):
        return spec
    return spec.model_copy(update={"model": model, "hardware": spec.hardware.model_copy(update={"profile": profile})})


def find_beside(value: str, *folders: Path) -> str:
    """`value` (a catalog name, or a file or folder path, maybe with `:datasheet`) with a
    relative path that the current folder lacks taken from the first of `folders` that has it."""
    mode = ":datasheet" if value.lower().endswith(":datasheet") else ""
    name = value[: len(value) - len(mode)]
    p = Path(name).expanduser()
    looks_like_path = p.suffix in _SUFFIXES or len(p.parts) > 1
    if not looks_like_path or p.is_absolute() or p.exists():
        return value
    found = next((folder / p for folder in folders if (folder / p).exists()), None)
    return value if found is None else str(found) + value[len(name) :]


def build_requests(spec: WorkloadSpec, base_dir: Path | str = ".") -> Requests:
    """The requests a workload describes. `base_dir` (the workload file or its folder) anchors
    relative trace and empirical-distribution paths."""
    base_dir = Path(base_dir)
    source = str(base_dir) if base_dir.is_file() else "workload"
    if base_dir.is_file():
        base_dir = base_dir.parent
    r = spec.requests
    arrival_rng, prompt_rng, output_rng = streams(spec.seed)
    closed = isinstance(r.arrival, ClosedLoopArrivals)

    trace = None
    if r.trace is not None:
        trace = in_field(source, "requests.trace", read_trace, r.trace, base_dir / r.trace.file, r.count)
    arrival = None
    if trace is not None and trace.arrival_s is not None:
        arrival = trace.arrival_s
        if r.duration_s is not None:
            arrival = arrival[: np.searchsorted(arrival, r.duration_s, side="right")]
        n = len(arrival)
    elif closed:
        n = r.count if trace is None else len(trace)
    else:
        cap = r.count if trace is None else len(trace)  # trace lengths without times: at most its rows
        arrival = in_field(source, "requests.arrival", sample_arrivals, r.arrival, arrival_rng, cap, r.duration_s)
        n = len(arrival)

    def lengths(from_trace, dist, rng, limit, field):
        x = (
            from_trace[:n]
            if from_trace is not None
            else in_field(source, field, sample_lengths, dist, n, rng, base_dir)
        )
        return x if limit is None else np.minimum(x, limit)

    prompt = lengths(
        None if trace is None else trace.prompt_tokens,
        r.prompt_tokens,
        prompt_rng,
        r.max_prompt_tokens,
        "requests.prompt_tokens",
    )
    output = lengths(
        None if trace is None else trace.output_tokens,
        r.output_tokens,
        output_rng,
        r.max_output_tokens,
        "requests.output_tokens",
    )
    prefix = None
    if r.sharing is not None:
        prompt, prefix = conversation_turns(r.sharing, prompt, output, r.max_prompt_tokens)
    elif trace is not None and trace.hash_ids is not None:
        prefix = TraceBlockKeys(trace.hash_ids[:n], r.trace.hash_block_tokens)
    if prefix is not None:
        prefix.check_block_size(spec.serving.block_size, source)
    if closed:
        return Requests(
            prompt,
            output,
            None,
            closed_loop_clients=r.arrival.clients,
            think_time_s=r.arrival.think_time_s,
            duration_s=r.duration_s,
            prefix=prefix,
        )
    return Requests(prompt, output, arrival, duration_s=r.duration_s, prefix=prefix)


def load_requests(name_or_path: str) -> tuple[WorkloadSpec, Requests]:
    """load_workload + build_requests in one call."""
    spec, path = load_workload(name_or_path)
    return spec, build_requests(spec, path)
