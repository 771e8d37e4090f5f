"""Validate a speculative case (one draft, or Minions: voting, adaptive s, pipeline): the
speculative executor serves it, the statistics it recorded (acceptance by position of the
verified draft, per-SSM agreement, the s trajectory) feed the simulator's speculative engine,
whose round cost model is fitted on *held-out* speculative executor runs of the same
deployment (the same serving and `speculation:` sections, other requests and seeds), run once
before and once after the validated run (as calibrate.calibrate_around). Writes exec/,
sim/, calibration/, validation.json and report.md/.html under `out`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from infersim.simulator.costmodel.speculative_fit import SpecFit
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import WorkloadSpec

from .calibrate import CALIBRATION_SEED, require_held_out_seed, validated_tick_s
from .compare import aggregate_errors, brief
from .execute import (
    CaseOptions,
    case_header,
    execute_case,
    finish_case,
    repeat_dirs,
    scaled_clause,
    speed_from_ticks,
    speed_tick_s,
)
from .measured import load_run
from .modes import MODES
from .spec_compare import ExecutedSpec, compare_spec, round_stalls
from .spec_costmodel import fit_rounds, predict_drafting, predict_rounds_as_run
from .spec_report import spec_case_report
from .spec_rounds import drafting_rounds, rebuild_rounds
from .spec_simulate import kv_binds, simulate_spec_run

# Held-out requests for the speculative fit: other seeds and shapes than any case (9011-9012 and
# 9015 are the calibration's alone; calibrate.py's matched runs use 9009-9011).
SPEC_CALIBRATION = (
    (
        "calib-spec-load",
        {
            "count": 40,
            "arrival": {"type": "poisson", "rate": 150.0},
            "prompt_tokens": {"type": "uniform", "low": 8, "high": 200},
            "output_tokens": {"type": "uniform", "low": 16, "high": 120},
        },
    ),
    (
        "calib-spec-burst",
        {
            "count": 24,
            "arrival": {"type": "burst"},
            "prompt_tokens": {"type": "uniform", "low": 16, "high": 180},
            "output_tokens": {"type": "uniform", "low": 24, "high": 110},
        },
    ),
)
SPEC_CALIBRATION_SEED = CALIBRATION_SEED + 10
# and the validated workload's own request mix drawn with a held-out seed (calib-spec-mix), as the
# plain cases' calib-matched-mix: on the fit over load and burst alone, Poisson-loaded runs' decode
# rounds ran 4-5% slower than priced and the burst's 3-4% faster (five validations of spec-draft,
# batches of 6+: 1.044 and 0.965 measured/priced), and the validated workloads are Poisson-loaded
SPEC_MIX_SEED = CALIBRATION_SEED + 14


def calibration_specs(spec) -> list:
    base = spec.model_dump(mode="json", exclude_none=True)
    mixes = [(name, req, SPEC_CALIBRATION_SEED + k) for k, (name, req) in enumerate(SPEC_CALIBRATION)]
    if not base["requests"].get("trace"):  # a trace would replay the validated requests themselves
        mixes.append(("calib-spec-mix", base["requests"], SPEC_MIX_SEED))
    out = []
    for name, req, seed in mixes:
        d = json.loads(json.dumps(base))
        d.update(name=name, seed=seed, requests=json.loads(json.dumps(req)))
        d.pop("description", None)
        out.append(WorkloadSpec.model_validate(d))
    return out


def _fit_bracketed(mode, spec, run, model: str, out: Path, opts: CaseOptions, validated_dir: Path | None = None):
    """Calibration runs before and after `run()`, then the fit over both (fit_calibration)."""
    specs = calibration_specs(spec)

    def calib(side: str) -> None:
        for cs in specs:
            if opts.log:
                opts.log(f"{spec.name}: calibration run {cs.name} ({side} the validated run)")
            mode.run(cs, build_requests(cs), model, out / side / cs.name, opts)

    calib("before")
    run()
    calib("after")
    return fit_calibration(specs, model, out, opts.device, validated_dir)


def fit_calibration(specs, model: str, out: Path, device: str, validated_dir: Path | None = None) -> SpecFit:
    """The fit over the calibration runs saved under out/{before,after}/<calibration workload>
    (as _fit_bracketed runs them; a saved validation's calibration/ re-prices the same way),
    written to out/speculative-fit.json. speed_shift as calibrate_around (median measured/fitted
    round period after over before). With speed ticks in every run, scaled to the validated run's
    own speed as calibrate_around does: its median tick times the calibration runs' median
    measured/fitted ratio per tick; a pipelined run's draft terms by its drafting process's ticks
    (taken beside the verifying thread's)."""
    out = Path(out)
    halves: dict[str, list] = {"before": [], "after": []}
    drafting: list = []
    drafting_by_side: dict[str, list] = {"before": [], "after": []}
    for side in halves:
        for cs in specs:
            d = out / side / cs.name
            halves[side].append(rebuild_rounds(d))
            dr = drafting_rounds(d)
            if dr is not None:
                drafting.append(dr)  # one per run, in the order of the runs (fit_rounds pairs them)
            drafting_by_side[side].append(dr)
    tables = halves["before"] + halves["after"]

    stalled = np.concatenate([round_stalls(t["fit_y_s"], t)[np.isfinite(t["fit_y_s"])] for t in tables])
    fit = fit_rounds(
        tables,
        {
            "workloads": [s.name for s in specs],
            "seeds": [s.seed for s in specs],
            "model": model,
            "device": device,
            "bracketed": True,
            "matched": True,
            "calibration_stalls": float(stalled.mean()) if stalled.size else float("nan"),
        },
        drafting=drafting,
    )
    # against the rounds as the simulator prices them (a pipelined run's contention included:
    # against the solo fit the ratio measured how many passes overlapped, not the machine's speed)
    ratio, per_run, per_run_drafting = {}, [], []
    for side, ts in halves.items():
        r = []
        for t, dr in zip(ts, drafting_by_side[side]):
            ok = np.isfinite(t["fit_y_s"])
            r.append(np.asarray(t["fit_y_s"])[ok] / predict_rounds_as_run(fit, t, dr)[ok])
            per_run.append(float(np.median(r[-1])) if r[-1].size else float("nan"))
            if dr is not None:
                ok = np.isfinite(dr["busy_s"])
                per_run_drafting.append(
                    float(np.median(dr["busy_s"][ok] / predict_drafting(fit, dr)[ok])) if ok.any() else float("nan")
                )
        ratio[side] = float(np.median(np.concatenate(r))) if r else float("nan")
    fit.meta["speed_ratio_before"], fit.meta["speed_ratio_after"] = ratio["before"], ratio["after"]
    fit.meta["speed_shift"] = ratio["after"] / ratio["before"] - 1.0

    runs = [out / side / cs.name for side in halves for cs in specs]
    cpu_run = validated_dir is not None and device == "cpu"
    ticks = [speed_tick_s(d) for d in runs]
    # on a GPU as on a CPU (calibrate.validated_tick_s; on an H100's spec-draft, minions-voting
    # and minions-adaptive runs the ticks missed the validated run's speed by 2.0 / 10.6 / 0.8%,
    # no scaling by 0.5 / 18.8 / 7.2%); a GPU run's drafting process is not measured yet
    tick_val = validated_tick_s(validated_dir)
    speed = speed_from_ticks(per_run, ticks, tick_val)
    # a pipelined run's drafting process ticks on its own core beside the verifying thread's ticks
    dticks = [speed_tick_s(d, "drafting_tick_s") for d in runs]
    dtick_val = speed_tick_s(validated_dir, "drafting_tick_s") if cpu_run else float("nan")
    dspeed = speed_from_ticks(per_run_drafting, dticks, dtick_val) if per_run_drafting else None
    if np.isfinite(speed.speed):
        drafts = dspeed is not None and np.isfinite(dspeed.speed)
        why = speed.note + (f"; the drafts' terms by the drafting process's: {dspeed.note}" if drafts else "")
        fit = fit.scaled(speed.speed, why, draft_factor=dspeed.speed if drafts else None)
        fit.meta["speed_ticks_s"] = {"calibration": ticks, "validated": tick_val, "tick_weight": speed.tick_weight}
        if drafts:
            fit.meta["drafting_speed_ticks_s"] = {
                "calibration": dticks,
                "validated": dtick_val,
                "tick_weight": dspeed.tick_weight,
            }
    fit.save(out / "speculative-fit.json")
    return fit


def validate_spec_case(case, model: str, out: Path, opts: CaseOptions) -> dict:
    seed, requests = opts.seed, opts.requests
    spec, calibration, report, log = opts.spec, opts.calibration, opts.report, opts.log

    out = Path(out)
    mode = MODES.get(case.mode)
    base = case_header(case, model, opts)
    ok, why = mode.availability()
    if not ok:
        return {**base, "status": "not available", "reason": why}
    spec = spec if spec is not None else case.spec(model, seed=seed, requests=requests)
    require_held_out_seed(spec.seed)
    t0 = time.perf_counter()
    reqs = build_requests(spec)

    repeated: dict = {}

    def execute() -> None:
        repeated.update(execute_case(case, mode, spec, reqs, model, out, opts))

    if calibration is not None:
        fit = SpecFit.load(calibration)
        src = f"speculative fit loaded from `{calibration}`"
        execute()
    else:
        if opts.reuse_runs:
            fit = fit_calibration(calibration_specs(spec), model, out / "calibration", opts.device, out / "exec")
        else:
            fit = _fit_bracketed(mode, spec, execute, model, out / "calibration", opts, validated_dir=out / "exec")
        src = (
            "speculative round fit calibrated on the runs in the case folder's `calibration/` "
            f"({', '.join(fit.meta['workloads'])}, "
            f"seeds {', '.join(str(s) for s in fit.meta['seeds'])}: the case's serving and speculation sections on "
            f"other requests), run once before and once after the validated run; in-sample round MAPE "
            f"{fit.meta['round_fit']['mape_in_sample']:.1%} over {fit.meta['round_fit']['points']} rounds"
            f"{scaled_clause(fit.meta)}; the "
            f"machine's speed moved {fit.meta['speed_shift']:+.1%} from before to after"
        )
    exec_run = load_run(out / "exec")
    stats = mode.recorded(out / "exec")
    updates = mode.sim_updates(stats)
    if log:
        log(f"{case.name}: simulating")
    simulate_spec_run(exec_run, out / "sim", fit, updates=updates, seed=spec.seed)
    sim_run = load_run(out / "sim")
    s_replay = None
    if spec.speculation.selector_on and stats.get("s_trajectory"):
        # the same simulation with the executed s trajectory instead of the selector's own decisions
        simulate_spec_run(
            exec_run, out / "sim-s-replay", fit, updates=updates, seed=spec.seed, s_trajectory=stats["s_trajectory"]
        )
        s_replay = load_run(out / "sim-s-replay")
    executed = ExecutedSpec(
        exec_run, rebuild_rounds(out / "exec"), drafting_rounds(out / "exec"), bool(stats.get("pipelined"))
    )
    cmp = compare_spec(case.name, executed, sim_run, fit, case.compare, s_replay_run=s_replay)
    sim_spec = sim_run.summary.get("speculation") or {}
    result = {
        **base,
        "status": "ran",
        "passed": cmp.passed,
        "checks": cmp.checks,
        "cost_model": {"name": "speculative-fit", "description": src, "fit": fit.to_json()},
        "statistics": stats,
        "seed": spec.seed,
        "requests": len(reqs),
        "wall_s": time.perf_counter() - t0,
        "repeats": repeated,
        "kv_reservation_binds": kv_binds(exec_run),
        "simulated_speculation": {
            k: sim_spec.get(k) for k in ("acceleration_rate", "acceptance_rate", "rounds", "sequence_rounds", "s")
        },
        "comparison": brief(cmp.to_json()),
        "repeat_errors": _repeat_errors(
            mode, out, sim_run if s_replay is None else s_replay, fit, spec.seed, s_replayed=s_replay is not None
        ),
    }

    return finish_case(result, out, (lambda: spec_case_report(result, exec_run, sim_run, cmp, out)) if report else None)


def _repeat_errors(mode, out: Path, sim_run, fit, seed: int, s_replayed: bool) -> list[dict]:
    """Each repeat's aggregate errors against the simulation the targets are judged on
    (compare.aggregate_errors): with an adaptive s, the one that follows that repeat's own
    executed s trajectory (simulated for it in sim-s-replay.repeat-K/)."""
    errors = []
    for d in repeat_dirs(out / "exec"):
        run = load_run(d)
        sim = sim_run
        if s_replayed and d != out / "exec":
            stats = mode.recorded(d)
            sim_dir = out / ("sim-s-replay" + d.name[len("exec") :])
            simulate_spec_run(
                run, sim_dir, fit, updates=mode.sim_updates(stats), seed=seed, s_trajectory=stats["s_trajectory"]
            )
            sim = load_run(sim_dir)
        errors.append(aggregate_errors(run, sim))
    return errors
