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
from .execute import CaseOptions, case_header, execute_case, finish_case, repeat_dirs, scaled_clause
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
    return build_cost_model(name, model, load_hardware(profile), dtype=dtype)


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
        src = "executor fit calibrated now on the runs in the case folder's `calibration/`" + (
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
    out = Path(out)
    mode = MODES.get(case.mode)
    ok, why = mode.availability()
    base = case_header(case, model, opts)
    if not ok:
        return {**base, "status": "not available", "reason": why}
    if case.mode in SPECULATIVE_MODES or case.mode == "offload":
        return _validate_elsewhere(case, model, out, opts, cost)
    run = _CaseRun(case, mode, _validated_workload(case, model, opts), model, out, opts, cost)
    t0 = time.perf_counter()
    executed = _fit_and_execute(run)
    exec_run = load_exec_run(out / "exec")
    fit = executed.fit
    if fit is not None and fit.meta.get("model") not in (None, exec_run.model):
        raise InfersimError(
            f"the executor fit was calibrated on {fit.meta.get('model')}, not {exec_run.model}: "
            f"calibrate again (leave out --calibration)"
        )
    stats = mode.recorded(out / "exec")
    cm, desc = (fit, executed.description) if fit is not None else _profile_model(cost, exec_run)
    if opts.log:
        opts.log(f"{case.name}: simulating")
    updates = mode.sim_updates(stats)
    sim_run, replay_run = simulate_and_replay(
        exec_run, out, cm, ReplayCostModel(exec_run, cm), updates=updates, profile=cost.profile
    )
    cmp = compare_runs(case.name, exec_run, sim_run, cm, case.compare, replay_run=replay_run)
    result = _ran_result(run, base, executed, cmp, desc, stats, time.perf_counter() - t0)
    result["repeat_errors"] = [aggregate_errors(load_exec_run(d), sim_run, cm) for d in repeat_dirs(out / "exec")]
    report = (lambda: case_report(result, exec_run, sim_run, cmp, out)) if opts.report else None
    return finish_case(result, out, report)


def _validate_elsewhere(case: Case, model: str, out: Path, opts: CaseOptions, cost: SimCostOptions) -> dict:
    """Speculative cases by their rounds (spec_validate.py) and offload cases by the offload
    cost model (offload_validate.py), each with its own fitted cost model only."""
    if case.mode in SPECULATIVE_MODES:
        # rounds, not iterations: a cost model fitted on held-out speculative runs (spec_validate.py)
        if cost.cost_model != "fitted":
            raise InfersimError(
                f"case {case.name}: speculative cases are validated with the fitted round cost model "
                f"only (--cost-model fitted)"
            )
        return validate_spec_case(case, model, out, opts if cost.fit is None else replace(opts, calibration=None))
    # the simulator's offload cost model on a calibrated compute and host link (offload_validate.py)
    if cost.cost_model != "fitted":
        raise InfersimError(
            f"case {case.name}: offload cases are validated with the calibrated offload cost "
            f"model only (--cost-model fitted)"
        )
    return validate_offload_case(case, model, out, opts if cost.fit is None else replace(opts, calibration=None))


def _validated_workload(case: Case, model: str, opts: CaseOptions):
    """The workload the case validates (`opts.spec` or the case's own), refused when it cannot be replayed."""
    spec = opts.spec if opts.spec is not None else case.spec(model, seed=opts.seed, requests=opts.requests)
    require_held_out_seed(spec.seed)
    if spec.requests.arrival is not None and spec.requests.arrival.type == "closed_loop":
        raise InfersimError(
            f"workload {spec.name}: closed-loop arrivals are not replayed by `sim validate` yet "
            f"(their arrival times depend on completions): use poisson, gamma or burst arrivals"
        )
    return spec


@dataclass(frozen=True)
class _CaseRun:
    """One case validated by its iterations: what the steps of validate_case share."""

    case: Case
    mode: object  # the case's mode (modes.MODES): how it runs and what it records
    spec: object  # the validated workload (a WorkloadSpec)
    model: str
    out: Path  # the case's folder: exec/, calibration/, validation.json
    opts: CaseOptions
    cost: SimCostOptions


@dataclass(frozen=True)
class _Executed:
    """The validated run and the fit that prices its simulation."""

    fit: FittedCostModel | None  # None: a device profile's cost model, built after the run
    description: dict  # the cost model's entry in the result (name, description, fit)
    drift: dict  # the sentinels around the run and the factor the fit was scaled by; {} when not
    repeated: dict  # what run_repeated says about the repeats of the validated run
    requests: list  # the validated requests


def _fit_and_execute(run: _CaseRun) -> _Executed:
    """Fit the cost model (given, loaded, calibrated now or on both sides of the validated run)
    and execute the validated run, in the order the fit needs."""
    spec, cost, opts = run.spec, run.cost, run.opts
    fit, desc = cost.fit, None
    bracket = fit is None and cost.cost_model == "fitted" and opts.calibration is None
    if fit is not None:
        desc = {"name": "fitted", "description": "executor fit " + _fit_line(fit), "fit": fit.to_json()}
    elif not bracket:
        fit, desc = resolve_cost_model(cost.cost_model, run.model, run.out, opts, block_size=spec.serving.block_size)
    reqs = build_requests(spec)
    repeated: dict = {}

    def execute() -> None:
        repeated.update(execute_case(run.case, run.mode, spec, reqs, run.model, run.out, opts))

    drift: dict = {}
    if bracket:
        fit, desc = _calibrated_around(run, execute)
    elif fit is not None and cost.drift_correction and fit.meta.get("sentinel_s"):
        fit, desc, drift = _drift_corrected(run, execute, fit, desc)
    else:
        execute()
    return _Executed(fit, desc, drift, repeated, reqs)


def _calibrated_around(run: _CaseRun, execute) -> tuple[FittedCostModel, dict]:
    """A fit calibrated now on other requests, once before and once after the validated run
    (`execute`); its speed shift says whether the machine moved meanwhile."""
    spec, out, matched = run.spec, run.out, run.cost.matched
    serving = spec.serving.model_dump(mode="json", exclude_none=True) if matched else None
    # a trace would replay the validated requests themselves: no mix run then
    mix = spec.requests.model_dump(mode="json", exclude_none=True) if matched and spec.requests.trace is None else None
    workloads = CalibrationSet(block_size=spec.serving.block_size, serving=serving, requests=mix)
    fit = calibrate_around(execute, run.model, out / "calibration", run.opts, workloads, validated_dir=out / "exec")
    desc = {
        "name": "fitted",
        "fit": fit.to_json(),
        "description": "executor fit calibrated on the runs in the case folder's `calibration/` "
        + _fit_line(fit)
        + ", run once before and once after the validated run"
        + (" on its own serving configuration (KV pools, limits, preemption)" if matched else "")
        + f"; the machine's speed moved {fit.meta['speed_shift']:+.1%} from before to after",
    }
    return fit, desc


def _drift_corrected(run: _CaseRun, execute, fit: FittedCostModel, desc: dict) -> tuple[FittedCostModel, dict, dict]:
    """The validated run between two sentinels, and the fit scaled by the machine's speed around
    it against at calibration."""
    opts = run.opts
    before = sentinel_s(run.model, device=opts.device, dtype=opts.dtype, threads=opts.threads)
    execute()
    after = sentinel_s(run.model, device=opts.device, dtype=opts.dtype, threads=opts.threads)
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
    return fit, desc, drift


def _profile_model(cost: SimCostOptions, exec_run) -> tuple[object, dict]:
    """A device profile's cost model and its entry in the result, without a fit."""
    cm = _profile_cost_model(cost.cost_model, cost.profile, exec_run)
    return cm, {"name": cost.cost_model, "description": f"`{cost.cost_model}` on the device profile `{cost.profile}`"}


def _ran_result(run: _CaseRun, base: dict, executed: _Executed, cmp, desc: dict, stats: dict, wall_s: float) -> dict:
    return {
        **base,
        "status": "ran",
        "passed": cmp.passed,
        "checks": cmp.checks,
        "cost_model": desc,
        "drift": executed.drift,
        "statistics": stats,
        "seed": run.spec.seed,
        "requests": len(executed.requests),
        "wall_s": wall_s,
        "repeats": executed.repeated,
        "comparison": brief(cmp.to_json()),
    }


def _fit_line(fit) -> str:
    m = fit.meta
    seeds = ", ".join(str(s) for s in m.get("seeds", [m.get("seed")]))
    scaled = scaled_clause(m)
    return (
        f"({', '.join(m.get('workloads', []))}, seeds {seeds}, {m.get('model')} on {m.get('device')}; "
        f"in-sample MAPE {m.get('iteration_fit', {}).get('mape_in_sample', float('nan')):.1%}{scaled})"
    )
