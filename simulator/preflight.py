"""Checks a resolved workload passes before it is simulated or executed, beyond its schema and
the single-value rules of `validation.py`: the names it gives exist, tensor parallelism splits
the model, the requests fit in memory. They read the catalogs and registries, so they sit above
them (validation.py is the leaf every schema uses)."""

from __future__ import annotations

from pathlib import Path

from .costmodel import workload_cost_model
from .costmodel.moe import check_expert_parallel
from .disaggregation.config import POOLS
from .disaggregation.deployment import check_disaggregated
from .engine.router import ROUTERS
from .errors import InfersimError
from .hardware.catalog import load_hardware
from .hardware.quantization import require_weight_dtype
from .models.catalog import load_model
from .models.dtypes import kv_dtype_for, normalize_dtype
from .offload.policies import POLICIES as OFFLOAD_POLICIES
from .parallel.placement import check_deployment
from .policies import PREEMPTION_POLICIES, SCHEDULERS
from .validation import (
    BYTES_PER_REPLICA,
    BYTES_PER_REQUEST,
    check_memory,
    check_seed,
    expected_requests,
    in_field,
    simulation_bytes,
)
from .workload.schema import WorkloadSpec
from .workload.traces import trace_rows
from .yamlio import validate


def check_workload(
    spec,
    source: str,
    *,
    allow_large: bool = False,
    parallel: int = 1,
    what: str = "",
    flags: dict[str, str] | None = None,
    base_dir: Path | None = None,
) -> None:
    """Everything a resolved workload must satisfy before it is simulated or executed, beyond
    its schema: the names it gives exist (model, hardware profile, dtypes, policies, router,
    cost model), the seed is in range, tensor parallelism splits the model, and the requests
    fit in memory. `parallel` simulations of it run at once; `flags` maps a field to the
    command-line flag that set it, for the message; `base_dir` (the workload file's folder)
    finds a trace, whose rows are counted before it is read."""
    hw, sv = spec.hardware, spec.serving

    def named(field: str) -> str:  # a value a flag set is named by the flag
        return (flags or {}).get(field, field)

    model = in_field(source, named("model"), load_model, spec.model)
    hardware = in_field(source, named("hardware.profile"), load_hardware, hw.profile)
    if hw.host_link is not None:
        in_field(source, "hardware.host_link", load_hardware, hw.profile, host_link=hw.host_link)
    for field, get, name in (
        ("serving.dtype", normalize_dtype, sv.dtype),
        ("serving.kv_dtype", normalize_dtype, sv.kv_dtype or sv.dtype),
        ("serving.scheduler", SCHEDULERS.get, sv.scheduler),
        ("serving.preemption", PREEMPTION_POLICIES.get, sv.preemption),
        ("hardware.router", ROUTERS.get, hw.router),
        ("serving.cost_model", workload_cost_model, sv.cost_model),
    ):
        in_field(source, named(field), get, name)
    if spec.offload is not None:
        in_field(source, "offload.policy", OFFLOAD_POLICIES.get, spec.offload.policy)
    if spec.speculation is not None:
        for i, draft in enumerate(spec.speculation.drafts):
            in_field(source, f"speculation.drafts.{i}.model", load_model, draft.model)
        if spec.speculation.draft_hardware is not None:
            in_field(source, "speculation.draft_hardware", load_hardware, spec.speculation.draft_hardware)
    check_seed(spec.seed, "seed", source)
    require_weight_dtype(hardware, normalize_dtype(sv.dtype), f"{source}: field 'serving.dtype'", model)
    hardware.require_dtype(kv_dtype_for(sv.dtype, sv.kv_dtype), f"{source}: field 'serving.kv_dtype'")
    hardware.require_tensor_parallel(hw.tensor_parallel, f"{source}: field '{named('hardware.tensor_parallel')}'")
    if hw.data_parallel_attention:
        pass  # check_deployment checks the group (parallel/dp_attention.py)
    elif hw.disaggregated is None:
        check_expert_parallel(model, hw.tensor_parallel, hw.expert_parallel, source=source)
    else:  # experts spread over each pool's tensor-parallel group
        for name in POOLS:
            tp, tp_field = (
                getattr(hw.disaggregated, name).tensor_parallel,
                f"hardware.disaggregated.{name}.tensor_parallel",
            )
            check_expert_parallel(model, tp, hw.expert_parallel, source=source, tp_field=tp_field)
    if spec.offload is not None and (model.moe is not None or model.mla is not None):
        # the offload pipeline prices every layer alike and streams per-head K and V
        raise InfersimError(
            f"{source}: field 'offload': KV offload models dense layers with per-head K and V; "
            f"'{model.name}' has experts or latent attention"
        )
    check_disaggregated(spec, source)
    check_deployment(model, spec, source)
    if sv.max_model_len is not None and sv.max_model_len > model.max_position_embeddings:
        # positions past the trained context are not served (vLLM refuses the same setting)
        raise InfersimError(
            f"{source}: field 'serving.max_model_len': {sv.max_model_len:,} is longer than {model.name}'s context "
            f"of {model.max_position_embeddings:,} tokens; lower it or leave it out"
        )
    max_model_len = sv.max_model_len or model.max_position_embeddings
    if not sv.chunked_prefill and sv.max_batched_tokens is not None and sv.max_batched_tokens < max_model_len:
        # without chunking a prompt is prefilled in one iteration (vLLM refuses the same setting)
        raise InfersimError(
            f"{source}: field 'serving.max_batched_tokens': {sv.max_batched_tokens} is smaller than "
            f"max_model_len {max_model_len}; raise it, lower serving.max_model_len or set "
            f"chunked_prefill: true"
        )
    n = expected_requests(spec)
    field = "requests.count" if spec.requests.count is not None and n >= spec.requests.count else "requests.duration_s"
    count_by = f" (set by {flags['requests.count']})" if "requests.count" in (flags or {}) else ""
    _check_count_within_trace(spec, base_dir, f"{source}: field 'requests.count'{count_by}")
    rows = traced_requests(spec, base_dir)
    if rows is not None and rows > n:
        n, field = rows, "requests.trace"
    if BYTES_PER_REPLICA * hw.instances > BYTES_PER_REQUEST * n:
        field = "hardware.replicas"
    runs = f" x {parallel} parallel simulations" if parallel > 1 else ""
    on = f" on {hw.instances:,} replicas" if hw.instances > 1 else ""
    by = f" (set by {flags[field]})" if field in (flags or {}) else ""
    check_memory(
        simulation_bytes(n, parallel, hw.instances),
        what or f"{source}: field '{field}'{by}: {n:,.0f} requests{on}{runs}",
        allow_large,
    )


def _check_count_within_trace(spec, base_dir: Path | None, where: str) -> None:
    """A count (-n) larger than the trace it replays is refused naming the count (and its flag)."""
    r = spec.requests
    if r.trace is None or r.count is None or base_dir is None:
        return
    rows = trace_rows(r.trace, Path(base_dir) / r.trace.file)
    if rows is not None and r.count > rows:
        raise InfersimError(
            f"{where}: {r.count:,} requests, more than the {rows:,} rows of {r.trace.file} after start_row "
            f"{r.trace.start_row}"
        )


def traced_requests(spec, base_dir: Path | None) -> int | None:
    """The rows a trace workload without `count` replays (None: no such trace, or not countable)."""
    r = spec.requests
    if r.trace is None or r.count is not None or base_dir is None:
        return None
    return trace_rows(r.trace, Path(base_dir) / r.trace.file)


def revalidate(spec, source: str):
    """The spec validated again after `model_copy` overrides (which pydantic does not check):
    a flag that broke a rule is reported against the workload's field."""
    return validate(WorkloadSpec, spec.model_dump(), f"{source} (with command-line overrides)")
