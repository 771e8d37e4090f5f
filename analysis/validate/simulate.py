"""The simulator on exactly the executor's requests and policy configuration.

Requests: the executor run's own table (arrival times as replayed, prompt lengths, output
lengths after any cut at the model's maximum position), by request id. Policy: the run's
resolved workload (scheduler, preemption, chunked prefill, batch limits, block size,
watermark) with its measured KV pools (`gpu_blocks`, `cpu_blocks`) made explicit. Cost: any
`CostModel` (the executor fit, or a device profile's roofline/regression model).

The simulation runs in step mode, so its series has one row per iteration: that is the
per-iteration log the comparison aligns with the executor's iterations.parquet."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from infersim.simulator.engine.prefix_cache import chain_keys
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import staged_dir
from infersim.simulator.metrics.summary import write_result_files
from infersim.simulator.simulation import Simulation
from infersim.simulator.workload.requests import Requests
from infersim.simulator.workload.schema import WorkloadSpec

from .measured import ExecRun, load_run


def sim_spec(run: ExecRun, *, profile: str, cost_model_name: str = "roofline", updates: dict | None = None):
    """The executor run's workload as a simulator spec: same policy, same pools, the model's
    config.json, the given hardware profile."""
    w = dict(run.config["workload"])
    model_path = Path(str(w["model"]))
    if model_path.is_dir():
        model_path = model_path / "config.json"
    sv = dict(w["serving"])
    mem = run.config["memory"]
    sv.update(
        gpu_blocks=int(mem["gpu_blocks"]),
        cpu_blocks=int(mem["cpu_blocks"]),
        cost_model=cost_model_name,
        dtype=run.config.get("executor", {}).get("dtype", sv.get("dtype", "fp32")),
    )
    sv["kv_dtype"] = None
    hw = dict(w["hardware"])
    hw.update(profile=profile, replicas=1, tensor_parallel=1)
    w.update(model=str(model_path), serving=sv, hardware=hw)
    for section, values in (updates or {}).items():
        w[section] = {**(w.get(section) or {}), **values} if isinstance(values, dict) else values
    try:
        return WorkloadSpec.model_validate(w)
    except Exception as exc:  # pydantic: a recorded statistic the simulator's schema rejects
        from infersim.simulator.errors import pydantic_error_line

        raise InfersimError(pydantic_error_line(f"{run.path}/config.yaml (as simulated)", exc)) from None


@dataclass
class ExecutedKeys:
    """Token identity for prefix caching from the executed token ids (outputs.parquet: each
    request's prompt and generated tokens): request i's block keys are the executor's own
    (`chain_keys` over the same tokens), so the simulator shares, registers and evicts exactly
    the blocks the executor could."""

    tokens: list  # per request id, prompt + output token ids

    def keys(self, i: int, num_tokens: int, block_size: int) -> list[int]:
        return chain_keys(self.tokens[i][: int(num_tokens)], block_size)

    def check_block_size(self, block_size: int, source: str) -> None:
        pass


def executed_keys(run: ExecRun) -> ExecutedKeys:
    path = Path(run.path) / "outputs.parquet"
    if not path.is_file():
        raise InfersimError(f"{run.path}: missing outputs.parquet (the executed tokens prefix caching is keyed by)")
    t = pq.read_table(str(path), columns=["rid", "prompt_ids", "output_ids"]).to_pydict()
    tokens: list = [[] for _ in range(max(t["rid"], default=-1) + 1)]
    for rid, prompt, out in zip(t["rid"], t["prompt_ids"], t["output_ids"]):
        tokens[rid] = list(prompt) + list(out)
    return ExecutedKeys(tokens)


def sim_requests(run: ExecRun):
    """The executor's requests, in request-id order; with prefix caching, with the executed
    tokens' block keys (ExecutedKeys)."""
    r = run.requests
    n = int(np.sum(np.asarray(r["arrival_s"]) >= 0))
    arrival = np.asarray(r["arrival_s"], dtype=np.float64)[:n]
    prompt = np.asarray(r["prompt_tokens"], dtype=np.int64)[:n]
    output = np.asarray(r["output_tokens"], dtype=np.int64)[:n]
    order = np.argsort(arrival, kind="stable")
    if not np.array_equal(order, np.arange(n)):
        raise InfersimError(f"{run.path}: request ids are not in arrival order; cannot replay them as the same ids")
    prefix = executed_keys(run) if run.config["workload"]["serving"].get("prefix_caching") else None
    return Requests(prompt, output, arrival, prefix=prefix)


def simulate_run(
    run: ExecRun,
    out: Path,
    *,
    cost_model=None,
    profile: str = "cpu-reference",
    cost_model_name: str = "roofline",
    updates: dict | None = None,
    policy_cost_model=None,
) -> dict:
    """Simulate the executor run's requests and write a `sim run` directory (step mode) at
    `out`. `cost_model`, when given, replaces the one the spec names (the executor fit);
    `policy_cost_model`, when given, is what the policies see instead (cost-aware preemption's
    questions), so a replayed cost model answers only the engine's iterations and copies."""
    spec = sim_spec(run, profile=profile, cost_model_name=cost_model_name, updates=updates)
    requests = sim_requests(run)
    with staged_dir(Path(out), command="validate") as tmp:
        sim = Simulation(spec, requests, step_mode=True, series_path=tmp / "series.parquet", source=str(run.path))
        if cost_model is not None:
            # the same object everywhere the engine and the policies ask for times
            sim.cost_model = cost_model
            for rep in sim.replicas:
                rep.cost = cost_model
                if policy_cost_model is not None:
                    rep._state = _policy_view(rep._state, policy_cost_model)
        result = sim.run()
        resolved = dict(result.resolved)
        resolved["cost_model"] = (
            cost_model.to_json() if hasattr(cost_model, "to_json") else {"name": cost_model_name, "profile": profile}
        )
        summary = write_result_files(tmp, result, resolved=resolved)
    return summary


def simulate_and_replay(
    run: ExecRun, out: Path, cost_model, replay_cost_model, *, updates: dict, profile: str = "cpu-reference"
):
    """The executor run simulated at out/sim on `cost_model`, and at out/replay the same simulation
    driven by `replay_cost_model` (the run's own measured times) while the policies still ask
    `cost_model`: the scheduling alone. Returns both run directories, loaded."""
    simulate_run(run, out / "sim", cost_model=cost_model, profile=profile, cost_model_name="roofline", updates=updates)
    simulate_run(
        run,
        out / "replay",
        cost_model=replay_cost_model,
        profile=profile,
        cost_model_name="roofline",
        updates=updates,
        policy_cost_model=cost_model,
    )
    return load_run(out / "sim"), load_run(out / "replay")


def _policy_view(state_fn, cost_model):
    """The replica's scheduler state with another cost model for the policies to ask."""

    def state():
        st = state_fn()
        if dataclasses.is_dataclass(st) and not isinstance(st, type):
            return dataclasses.replace(st, cost_model=cost_model)
        st.cost_model = cost_model
        return st

    return state
