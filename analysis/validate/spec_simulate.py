"""The simulator's speculative engine on exactly the speculative executor's requests.

Configured as the executor runs (executor/speculative/decoder.py):
- the same requests by id (arrival as replayed, prompt, output after any cut), the same
  `speculation:` section (method, s, selector, voting, pipeline switches) with the acceptance
  the run measured (the mode's `simulator_updates`);
- the same target KV pool (`gpu_blocks` as the executor planned it), no host pool, so no swap;
- no prefill token budget (`max_batched_tokens` = every prompt at once): the executor admits
  by batch size and KV reservation only, never by tokens;
- the cost model: the speculative fit (spec_costmodel.py) for the target pass and one draft
  cost object per draft; pipelined, the shared-device model (`placement: shared`) with the
  engines' shares fitted from held-out pipelined runs (spec_costmodel.fit_rounds).

Voting as the section reads: under `voting.enabled: false` both the executor and the
simulator draft with the first SSM alone (the adaptive and pipeline cases switch voting off).

Known difference kept as is: the executor reserves each request's whole KV (prompt + output +
s_max) at admission; the simulator admits on the prompt's blocks and grows (with lookahead for
the round's candidates). With the matrix's pools (512 blocks, at most 16 sequences of at most
~17 blocks) neither ever binds, so both admit by batch size alone; `kv_binds` in the result
says whether the executor's reservation could have bound."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import staged_dir
from infersim.simulator.metrics.summary import write_result_files
from infersim.simulator.simulation import Simulation
from infersim.simulator.workload.schema import WorkloadSpec

from .measured import RunDir
from .simulate import sim_requests


def spec_sim_spec(
    run: RunDir,
    *,
    profile: str = "cpu-reference",
    updates: dict | None = None,
    shares: dict | None = None,
    contention: str = "sharing",
    handoff_s: float = 0.0,
):
    w = dict(run.config["workload"])
    model_path = Path(str(w["model"]))
    if model_path.is_dir():
        model_path = model_path / "config.json"
    sv = dict(w["serving"])
    prompts = np.asarray(run.requests["prompt_tokens"], dtype=np.int64)
    sv.update(
        gpu_blocks=int(run.config["memory"]["gpu_blocks"]),
        cpu_blocks=0,
        cost_model="roofline",
        preemption="recompute",
        chunked_prefill=True,
        max_batched_tokens=int(max(int(prompts.sum()), 2048)),
        dtype=run.config.get("executor", {}).get("dtype", sv.get("dtype", "fp32")),
    )
    sv["kv_dtype"] = None
    hw = dict(w["hardware"])
    hw.update(profile=profile, replicas=1, tensor_parallel=1)
    sp = dict(w["speculation"])
    for key, values in ((updates or {}).get("speculation") or {}).items():
        sp[key] = {**(sp.get(key) or {}), **values} if isinstance(values, dict) else values
    # voting as the section says: the executor, as the simulator, runs only the first SSM when
    # voting is off (executor/speculative/engine.py). (It used to draft with every SSM and vote
    # under method minions whatever voting.enabled said, and this module switched voting on to
    # match; after the executor changed, that priced three drafts for a run that drafted with one.)
    if sp.get("method") == "medusa":
        # the heads' time is part of the measured target pass the fit prices
        sp["medusa"] = {**(sp.get("medusa") or {}), "head_cost": False}
    # the pipeline: the executor's drafting and verifying threads slow each other down while both
    # run (shared GIL and cores): the shared-device model with the shares fitted on held-out runs
    if sp.get("pipeline", {}).get("enabled") is not False and sp.get("method") == "minions":
        shares = shares or {"llm": 1.0, "ssm": 1.0}
        sp["pipeline"] = {
            **(sp.get("pipeline") or {}),
            "placement": "shared",
            "llm_share": float(shares["llm"]),
            "ssm_share": float(shares["ssm"]),
            "contention": contention,
            "handoff_s": float(handoff_s),
        }
        if "llm_prefill" in shares:
            sp["pipeline"]["llm_prefill_share"] = float(shares["llm_prefill"])
    w.update(model=str(model_path), serving=sv, hardware=hw, speculation=sp)
    try:
        return WorkloadSpec.model_validate(w)
    except Exception as exc:
        from infersim.simulator.errors import pydantic_error_line

        raise InfersimError(pydantic_error_line(f"{run.path}/config.yaml (as simulated)", exc)) from None


def kv_binds(run: RunDir) -> bool:
    """Could the executor's whole-request KV reservation have held back an admission?"""
    sv = run.config["workload"]["serving"]
    sp = run.config["workload"]["speculation"]
    s_max = max(int(sp.get("speculation_length", 4)), int((sp.get("selector") or {}).get("s_max", 0) or 0))
    if sp.get("method") == "medusa":
        s_max = int(np.max(np.asarray(run.config.get("memory", {}).get("tree_nodes", 64))))  # candidates per sequence
    bs = int(sv["block_size"])
    need = (
        np.asarray(run.requests["prompt_tokens"]) + np.asarray(run.requests["output_tokens"]) + s_max + 1 + bs - 1
    ) // bs
    top = np.sort(need)[::-1][: int(sv["max_batch_size"])]
    return bool(top.sum() > int(run.config["memory"]["gpu_blocks"]))


class ReplayedSelector:
    """Stands in for the simulator's AdaptiveLengthSelector: s follows the executed run's
    trajectory ([[observations, s], ...]: s from the round after that many observed
    verifications on, validate_hooks' `s_trajectory`) by the number of verifications observed, whatever the
    simulated round times say. Separates where the selector's own decisions diverge from the
    rest of the simulation (the s-replay in the report)."""

    def __init__(self, trajectory: list):
        self.trajectory = sorted((int(r), int(v)) for r, v in trajectory)
        self.s = self.trajectory[0][1]
        self.observed = 0

    def observe(self, t: float, vl: float) -> bool:
        self.observed += 1
        new = self.s
        for r, v in self.trajectory:
            if r <= self.observed:
                new = v
        changed, self.s = new != self.s, new
        return changed


def simulate_spec_run(
    run: RunDir,
    out: Path,
    fit,
    *,
    profile: str = "cpu-reference",
    updates: dict | None = None,
    seed: int | None = None,
    s_trajectory: list | None = None,
) -> dict:
    """`s_trajectory` (the executed run's [[observations, s], ...]): the selector replays it instead of
    deciding (only where the workload has the selector on)."""
    meta = fit.meta or {}
    spec = spec_sim_spec(
        run,
        profile=profile,
        updates=updates,
        shares=meta.get("pipeline_shares"),
        contention=meta.get("pipeline_contention", "sharing"),
        handoff_s=meta.get("pipeline_handoff_s", 0.0),
    )
    if seed is not None:
        spec = spec.model_copy(update={"seed": int(seed)})
    requests = sim_requests(run)
    target = fit.target
    with staged_dir(Path(out), command="validate") as tmp:
        sim = Simulation(spec, requests, step_mode=True, series_path=tmp / "series.parquet", source=str(run.path))
        sim.cost_model = target
        for rep in sim.replicas:
            rep.cost = target
            p = rep.proposer
            drafts = getattr(p, "drafts", [])  # Medusa has none: its heads are in the target pass
            for d, c in zip(drafts, fit.drafts(len(drafts))):
                d.cost = c
            p.step_overhead_s = 0.0  # in the fit's per-step term
            if s_trajectory and p.selector is not None:
                p.selector = ReplayedSelector(s_trajectory)
        result = sim.run()
        resolved = dict(result.resolved)
        resolved["cost_model"] = fit.to_json()
        summary = write_result_files(tmp, result, resolved=resolved)
    return summary
