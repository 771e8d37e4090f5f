"""Validate an offload case (offload-full, offload-h2o, offload-infinigen): the offload
executor (executor/offload/serve.py) serves it with the KV cache in a host pool; what it
recorded (the host pool, the tokens the policy loaded per layer: InfiniGen's as a sparsity
file) feeds the simulator's copy of the workload; the simulator's `OffloadCostModel` — its
own per-layer composition of compute, loads and stores — runs on a calibrated compute and
host link fitted on held-out offload runs (offload_calibrate.py, bracketing the run).

Compared as every case (compare.py: the cost model on the executed batches, the simulation
per iteration and per request, the replay), plus the `offload` check: the KV bytes loaded,
predicted by the cost model's policy on each executed batch against the bytes the executor
copied (per iteration and in total), and the copy time. Writes exec/, sim/, replay/,
calibration/, validation.json and report.md/.html under `out`."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from infersim.simulator.costmodel.replay import OffloadReplayCostModel
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.models.catalog import load_model
from infersim.simulator.models.dtypes import kv_dtype_for
from infersim.simulator.offload import build_offload
from infersim.simulator.workload.builder import build_requests

from .calibrate import require_held_out_seed
from .compare import aggregate_errors, brief, compare_runs
from .execute import CaseOptions, case_header, execute_case, finish_case, repeat_dirs
from .measured import load_exec_run, load_run
from .modes import MODES
from .offload_calibrate import OffloadFit, calibrate_offload_around, load_offload_run
from .report import case_report
from .simulate import sim_spec, simulate_and_replay

BYTES_TARGET = 0.05  # the offload analogue of the swap-cost target: KV bytes loaded, total
BYTES_ITERATION_TARGET = 0.10  # and per iteration, as the per-iteration latency target


class _FinalsInOrder:
    """The offload cost model for compare.py's cost-model level: the k-th `iteration_time_s`
    gets the k-th executed iteration's final sequence lengths bound (H2O's budget, the cap
    basis), as the serving replica binds them."""

    def __init__(self, cm, finals: list[np.ndarray], meta: dict):
        self.cm, self.finals, self.meta, self._k = cm, finals, meta, 0

    def iteration_time_s(self, shape) -> float:
        f = self.finals[self._k] if self._k < len(self.finals) else None
        self._k += 1
        return self.cm.time_s(shape, final=f)

    def transfer_time_s(self, nbytes, direction) -> float:
        return self.cm.transfer_time_s(nbytes, direction)


def _finals(run) -> list[np.ndarray]:
    """Per executed iteration, the final lengths (prompt + output) of its sequences, in batch order."""
    r = run.requests
    final = {
        int(i): int(p) + int(o)
        for i, p, o in zip(np.arange(len(r["prompt_tokens"])), r["prompt_tokens"], r["output_tokens"])
    }
    if "request_id" in r:
        final = {int(i): int(p) + int(o) for i, p, o in zip(r["request_id"], r["prompt_tokens"], r["output_tokens"])}
    b = run.batches
    out, its = [], np.asarray(run.iterations["iteration"], dtype=np.int64)
    order = np.argsort(b["iteration"], kind="stable")
    it_b, rid_b = b["iteration"][order], b["rid"][order]
    lo = np.searchsorted(it_b, its, side="left")
    hi = np.searchsorted(it_b, its, side="right")
    for a, z in zip(lo, hi):
        out.append(np.array([final[int(x)] for x in rid_b[a:z]], dtype=np.int64))
    return out


def offload_cost_model(exec_run, fit: OffloadFit, updates: dict, profile: str = "cpu-reference"):
    """The simulator's OffloadCostModel for the executor run's workload (with the recorded
    updates), on the calibrated compute and link."""
    spec = sim_spec(exec_run, profile=profile, updates=updates)
    model = load_model(str(spec.model))
    setup = build_offload(
        model,
        load_hardware(profile),
        spec.offload,
        dtype=spec.serving.dtype,
        kv_dtype=kv_dtype_for(spec.serving.dtype, spec.serving.kv_dtype),
    )
    return setup.cost_model(compute=fit.compute, link=fit.link)


def bytes_level(exec_run, data, cm, finals) -> dict:
    """KV bytes loaded and copy time per executed iteration: predicted (the cost model's policy
    counting on the exact batch) against measured (what the executor copied)."""
    pred_b, pred_load_s = [], []
    for s, f in zip(exec_run.shapes, finals):
        st = cm.stages(s.query_tokens[None, :], s.context_tokens[None, :], s.logit_tokens[None, :], f[None, :])
        pred_b.append(float(st.load_bytes.sum() - cm.offloaded_weight_bytes * st.load_bytes.size))
        pred_load_s.append(float(st.load.sum()))
    pb, mb = np.array(pred_b), np.asarray(data.loaded_bytes, dtype=np.float64)
    ps, ms = np.array(pred_load_s), np.asarray(data.load_s, dtype=np.float64)
    m = mb > 0
    return {
        "iterations_loading": int(m.sum()),
        "measured_bytes": float(mb.sum()),
        "predicted_bytes": float(pb.sum()),
        "bytes_error": float(pb.sum() / mb.sum() - 1.0) if mb.sum() > 0 else None,
        "bytes_mape": float(np.mean(np.abs(pb[m] - mb[m]) / mb[m])) if m.any() else None,
        "measured_load_s": float(ms.sum()),
        "predicted_load_s": float(ps.sum()),
        "load_time_error": float(ps.sum() / ms.sum() - 1.0) if ms.sum() > 0 else None,
        "measured_stored_bytes": float(np.sum(data.stored_bytes)),
    }


def validate_offload_case(case, model: str, out: Path, opts: CaseOptions) -> dict:
    seed, requests = opts.seed, opts.requests
    spec, calibration, report, log = opts.spec, opts.calibration, opts.report, opts.log

    out = Path(out)
    mode = MODES.get("offload")
    spec = spec if spec is not None else case.spec(model, seed=seed, requests=requests)
    if spec.offload is None:
        raise InfersimError(f"case {case.name}: an offload case needs an `offload:` section")
    require_held_out_seed(spec.seed)
    t0 = time.perf_counter()
    reqs = build_requests(spec)

    repeated: dict = {}

    def execute() -> None:
        repeated.update(
            execute_case(case, mode, spec, reqs, model, out, opts, f", KV offloaded ({spec.offload.policy})")
        )

    if calibration is not None:
        fit = OffloadFit.load(calibration)
        execute()
        src = f"offload fit loaded from `{calibration}`"
    else:
        fit = calibrate_offload_around(execute, spec, model, out / "calibration", opts, validated_dir=out / "exec")
        src = (
            "offload fit calibrated on the runs in the case folder's `calibration/` (held-out offload executor "
            f"runs, seeds "
            f"{', '.join(str(s) for s in fit.meta['seeds'])}, the case's serving and offload sections, once before "
            f"and once after the validated run; the machine's speed moved {fit.meta['speed_shift']:+.1%})"
        )
    exec_run = load_exec_run(out / "exec")
    predicts = spec.offload.policy == "infinigen"
    data = load_offload_run(out / "exec", predicts)
    stats = mode.recorded(out / "exec")
    updates = mode.sim_updates(stats)
    cm = offload_cost_model(exec_run, fit, updates)
    finals = _finals(exec_run)
    if log:
        log(f"{case.name}: simulating")
    sim_run, replay_run = simulate_and_replay(exec_run, out, cm, OffloadReplayCostModel(exec_run, cm), updates=updates)
    in_order = _FinalsInOrder(cm, finals, fit.meta)
    cmp = compare_runs(case.name, exec_run, sim_run, in_order, case.compare, replay_run=replay_run)
    ob = bytes_level(exec_run, data, cm, finals)
    sim_off = sim_run.summary.get("offload") or {}
    ob["simulated_loaded_bytes"] = float(sim_off.get("kv_loaded_gb", float("nan"))) * 1e9
    ob["simulated_bytes_error"] = (
        ob["simulated_loaded_bytes"] / ob["measured_bytes"] - 1.0 if ob["measured_bytes"] > 0 else None
    )
    if predicts and (out / "calibration" / "before").is_dir():
        # a stricter reading: the sparsity recorded on a held-out calibration run (other requests)
        # instead of the validated run's own
        held = mode.sim_updates(mode.recorded(out / "calibration" / "before"))
        ob["heldout_sparsity_bytes_error"] = bytes_level(
            exec_run, data, offload_cost_model(exec_run, fit, held), finals
        )["bytes_error"]
    cmp.info["offload"] = ob
    # every offload case (the matrix's, whose compare names "offload", and a user's workload)
    for metric, err, target in (
        ("KV bytes loaded (total)", ob["bytes_error"], BYTES_TARGET),
        ("KV bytes loaded per iteration (MAPE)", ob["bytes_mape"], BYTES_ITERATION_TARGET),
    ):
        ok = err is not None and np.isfinite(err) and abs(err) <= target
        comp = (
            ""
            if ok
            else (
                f"cost model (the policy's token counts on the executed batches: bytes "
                f"{_pct(ob['bytes_error'])} in total, per-iteration MAPE {_pct(ob['bytes_mape'])})"
            )
        )
        cmp.checks.append(
            {
                "metric": metric,
                "value": err,
                "target": target,
                "ok": bool(ok),
                "component": comp,
                "kind": "cost model" if comp else "",
            }
        )
    result = {
        **case_header(case, model, opts),
        "status": "ran",
        "passed": all(c["ok"] for c in cmp.checks),
        "checks": cmp.checks,
        "cost_model": {
            "name": "offload-fitted",
            "description": "the simulator's OffloadCostModel (per layer: "
            f"compute + loads of the policy's tokens + stores, overlap '{spec.offload.overlap}') on a "
            f"calibrated compute and host link: {src}; in-sample iteration MAPE "
            f"{fit.meta['iteration_fit']['mape_in_sample']:.1%}",
            "fit": fit.to_json(),
        },
        "drift": {},
        "statistics": stats,
        "updates": updates,
        "offload": ob,
        "seed": spec.seed,
        "requests": len(reqs),
        "wall_s": time.perf_counter() - t0,
        "repeats": repeated,
        "comparison": brief(cmp.to_json()),
        "repeat_errors": [aggregate_errors(load_run(d), sim_run) for d in repeat_dirs(out / "exec")],
    }

    return finish_case(result, out, (lambda: case_report(result, exec_run, sim_run, cmp, out)) if report else None)


def _pct(x) -> str:
    return f"{x:.1%}" if x is not None and np.isfinite(x) else "n/a"


__all__ = ["validate_offload_case", "offload_cost_model", "bytes_level"]
