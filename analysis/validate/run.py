"""Validate one case: run the executor, simulate the same requests with the same policies,
compare, report. Used by `sim validate` and by the matrix."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from infersim.simulator.costmodel import build_cost_model
from infersim.simulator.costmodel.fitted import FittedCostModel
from infersim.simulator.costmodel.replay import ReplayCostModel
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.models.catalog import load_model
from infersim.simulator.workload.builder import build_requests

from .calibrate import CalibrationSet, calibrate, calibrate_around, require_held_out_seed
from .cases import Case
from .compare import aggregate_errors, brief, compare_runs
from .execute import CaseOptions, case_header, execute_case, finish_case, repeat_dirs
from .measured import load_exec_run
from .modes import MODES
from .offload_validate import validate_offload_case
from .report import case_report
from .sentinel import sentinel_s
from .simulate import simulate_and_replay
from .spec_validate import validate_spec_case

COST_MODEL_CHOICES = ("fitted", "regression", "roofline")
SPECULATIVE_MODES = ("speculative", "minions", "medusa")  # validated per round by spec_validate.py


def _profile_cost_model(name: str, profile: str, exec_run):
    """A device profile's cost model for the executor's model (what `sim run` would use)."""
    model_path = Path(str(exec_run.config["workload"]["model"]))
    model = load_model(str(model_path / "config.json" if model_path.is_dir() else model_path))
    dtype = exec_run.config.get("executor", {}).get("dtype", "fp32")
    return build_cost_model(name, model, load_hardware(profile), dtype=dtype, kv_dtype=dtype)


def resolve_cost_model(
    cost_model: str, model: str, out: Path, opts: CaseOptions, *, block_size: int, serving: dict | None = None
):
    """(cost model or None for a profile model built after the run, description dict): the fit
    saved at `opts.calibration`, or one calibrated now under `out`."""
    calibration = opts.calibration
    if cost_model not in COST_MODEL_CHOICES:
        raise InfersimError(f"unknown --cost-model '{cost_model}'; known: {', '.join(COST_MODEL_CHOICES)}")
    if cost_model != "fitted":
        return None, {}
    if calibration is not None:
        fit = FittedCostModel.load(calibration)
        src = f"executor fit loaded from `{calibration}`"
    else:
        fit = calibrate(model, Path(out) / "calibration", opts, block_size=block_size, serving=serving)
        src = f"executor fit calibrated now on `{Path(out) / 'calibration'}`" + (
            " with the validated deployment's serving configuration" if serving is not None else ""
        )
    if fit.block_size != block_size:
        raise InfersimError(f"calibration block size {fit.block_size} differs from the workload's {block_size}")
    cal = fit.meta
    desc = (
        f"{src}: held-out executor runs {', '.join(cal.get('workloads', []))} (seeds {', '.join(str(x) for x in cal.get('seeds', [cal.get('seed')]))}, other "
        f"requests than the validated run) of {cal.get('model')} on {cal.get('device')}; iteration fit in-sample "
        f"MAPE {cal.get('iteration_fit', {}).get('mape_in_sample', float('nan')):.1%} over "
        f"{cal.get('iteration_fit', {}).get('points', 0)} iterations"
    )
    return fit, {"name": "fitted", "description": desc, "fit": fit.to_json()}


@dataclass(frozen=True)
class SimCostOptions:
    """How the simulator side of a case prices its iterations."""

    cost_model: str = field(default="fitted", metadata={"help": "fitted, regression or roofline (COST_MODEL_CHOICES)"})
    profile: str = field(default="cpu-reference", metadata={"help": "device profile of the regression and roofline"})
    fit: FittedCostModel | None = field(default=None, metadata={"help": "a fit to use; None: calibrate now"})
    drift_correction: bool = field(
        default=False, metadata={"help": "scale a saved fit by the machine's speed now against at calibration"}
    )
    matched: bool = field(
        default=True,
        metadata={"help": "calibrate on the validated workload's own serving configuration, else the generic set"},
    )


def validate_case(
    case: Case,
    model: str,
    out: Path,
    opts: CaseOptions = CaseOptions(),
    cost: SimCostOptions = SimCostOptions(),
) -> dict:
    """Run one case end to end; returns the result dict (also written to out/validation.json).
    `cost.fit` (a FittedCostModel) skips calibration; otherwise the fit is calibrated now on other
    requests: with `cost.matched`, on the validated workload's own serving configuration (KV
    pools, limits, preemption: calibrate.MATCHED_REQUESTS), else on the generic set;
    `cost.drift_correction` scales a fit by the machine's speed now against at calibration
    (sentinel.py); `opts` says how the case runs (executor settings, workload, repeats of the
    validated run: execute.CaseOptions; `opts.spec` replaces the case's workload)."""
    device, dtype, threads, seed, requests = opts.device, opts.dtype, opts.threads, opts.seed, opts.requests
    spec, calibration, report, log = opts.spec, opts.calibration, opts.report, opts.log
    cost_model, profile, fit = cost.cost_model, cost.profile, cost.fit
    drift_correction, matched = cost.drift_correction, cost.matched

    out = Path(out)
    mode = MODES.get(case.mode)
    ok, why = mode.availability()
    base = case_header(case, model, opts)
    if not ok:
        return {**base, "status": "not available", "reason": why}
    if case.mode in SPECULATIVE_MODES:
        # rounds, not iterations: a cost model fitted on held-out speculative runs (spec_validate.py)
        if cost_model != "fitted":
            raise InfersimError(
                f"case {case.name}: speculative cases are validated with the fitted round cost model "
                f"only (--cost-model fitted)"
            )

        return validate_spec_case(case, model, out, opts if fit is None else replace(opts, calibration=None))
    if case.mode == "offload":
        # the simulator's offload cost model on a calibrated compute and host link (offload_validate.py)
        if cost_model != "fitted":
            raise InfersimError(
                f"case {case.name}: offload cases are validated with the calibrated offload cost "
                f"model only (--cost-model fitted)"
            )

        return validate_offload_case(case, model, out, opts if fit is None else replace(opts, calibration=None))
    spec = spec if spec is not None else case.spec(model, seed=seed, requests=requests)
    require_held_out_seed(spec.seed)
    if spec.requests.arrival is not None and spec.requests.arrival.type == "closed_loop":
        raise InfersimError(
            f"workload {spec.name}: closed-loop arrivals are not replayed by `sim validate` yet "
            f"(their arrival times depend on completions): use poisson, gamma or burst arrivals"
        )
    t0 = time.perf_counter()
    bracket = fit is None and cost_model == "fitted" and calibration is None
    if fit is not None:
        desc = {"name": "fitted", "description": "executor fit " + _fit_line(fit), "fit": fit.to_json()}
    elif not bracket:
        fit, desc = resolve_cost_model(cost_model, model, out, opts, block_size=spec.serving.block_size)
    reqs = build_requests(spec)

    repeated: dict = {}

    def execute() -> None:
        repeated.update(execute_case(case, mode, spec, reqs, model, out, opts))

    if bracket:
        # calibrated now on other requests, on both sides of the validated run
        serving = spec.serving.model_dump(mode="json", exclude_none=True) if matched else None
        # a trace would replay the validated requests themselves: no mix run then
        mix = (
            spec.requests.model_dump(mode="json", exclude_none=True)
            if matched and spec.requests.trace is None
            else None
        )
        workloads = CalibrationSet(block_size=spec.serving.block_size, serving=serving, requests=mix)
        fit = calibrate_around(execute, model, out / "calibration", opts, workloads, validated_dir=out / "exec")
        desc = {
            "name": "fitted",
            "fit": fit.to_json(),
            "description": f"executor fit calibrated on `{out / 'calibration'}` "
            + _fit_line(fit)
            + ", run once before and once after the validated run"
            + (" on its own serving configuration (KV pools, limits, preemption)" if matched else "")
            + f"; the machine's speed moved {fit.meta['speed_shift']:+.1%} from before to after",
        }
        drift_correction = False
    drift = {}
    if fit is not None and drift_correction and fit.meta.get("sentinel_s"):
        before = sentinel_s(model, device=device, dtype=dtype, threads=threads)
    if not bracket:
        execute()
    if fit is not None and drift_correction and fit.meta.get("sentinel_s"):
        after = sentinel_s(model, device=device, dtype=dtype, threads=threads)
        factor = 0.5 * (before + after) / fit.meta["sentinel_s"]
        drift = {
            "sentinel_calibration_s": fit.meta["sentinel_s"],
            "sentinel_before_s": before,
            "sentinel_after_s": after,
            "factor": factor,
        }
        fit = fit.scaled(factor, "machine speed at the validated run (sentinel) against at calibration")
        desc = {
            **desc,
            "description": desc["description"] + f"; scaled by {factor:.3f} for the machine's speed "
            f"(sentinel {0.5 * (before + after) * 1e3:.2f} ms around the run vs {fit.meta['sentinel_s'] * 1e3:.2f} ms "
            f"at calibration)",
            "fit": fit.to_json(),
        }
    exec_run = load_exec_run(out / "exec")
    if fit is not None and fit.meta.get("model") not in (None, exec_run.model):
        raise InfersimError(
            f"the executor fit was calibrated on {fit.meta.get('model')}, not {exec_run.model}: "
            f"calibrate again (leave out --calibration)"
        )
    stats = mode.recorded(out / "exec")
    cm = fit
    if cm is None:
        cm = _profile_cost_model(cost_model, profile, exec_run)
        desc = {"name": cost_model, "description": f"`{cost_model}` on the device profile `{profile}`"}
    if log:
        log(f"{case.name}: simulating")

    updates = mode.sim_updates(stats)
    sim_run, replay_run = simulate_and_replay(
        exec_run, out, cm, ReplayCostModel(exec_run, cm), updates=updates, profile=profile
    )
    cmp = compare_runs(case.name, exec_run, sim_run, cm, case.compare, replay_run=replay_run)
    result = {
        **base,
        "status": "ran",
        "passed": cmp.passed,
        "checks": cmp.checks,
        "cost_model": desc,
        "drift": drift,
        "statistics": stats,
        "seed": spec.seed,
        "requests": len(reqs),
        "wall_s": time.perf_counter() - t0,
        "repeats": repeated,
        "comparison": brief(cmp.to_json()),
        "repeat_errors": [aggregate_errors(load_exec_run(d), sim_run, cm) for d in repeat_dirs(out / "exec")],
    }

    return finish_case(result, out, (lambda: case_report(result, exec_run, sim_run, cmp, out)) if report else None)


def _fit_line(fit) -> str:
    m = fit.meta
    seeds = ", ".join(str(s) for s in m.get("seeds", [m.get("seed")]))
    scaled = (
        f"; scaled by {m['scaled_by']:.3f}, {m['scaled_because']}" if "scaled_by" in m and "scaled_because" in m else ""
    )
    return (
        f"({', '.join(m.get('workloads', []))}, seeds {seeds}, {m.get('model')} on {m.get('device')}; "
        f"in-sample MAPE {m.get('iteration_fit', {}).get('mape_in_sample', float('nan')):.1%}{scaled})"
    )
