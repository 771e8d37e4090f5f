"""The full validation matrix: every case, on the zoo's target model, against the targets.

    python -m infersim.analysis.validate.matrix                       # writes docs/validation/RESULTS.md
    python -m infersim.analysis.validate.matrix --cases plain-load preempt-swap --out runs/vm

Each case is calibrated around its own validated run (calibrate.py) and writes its own report
under --out; cases whose executor mode is not available are listed as such, with the reason.
Every case is judged by the pass rule (rule.py). The results file (Markdown and HTML) opens with
a one-line summary, then the rule, the date, the host (CPU model, cores, torch's CPU capability)
and the table."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from pathlib import Path

from infersim.simulator.costmodel.fitted import FittedCostModel
from infersim.simulator.errors import InfersimError
from infersim.simulator.progress import ProgressBar

from .calibrate import calibrate
from .cases import CASES, get_case, small_matrix
from .execute import CaseOptions
from .modes import MODES
from .report import matrix_report
from .rule import RULE
from .run import SimCostOptions, validate_case

RESULTS_DIR = Path(__file__).resolve().parents[2] / "docs" / "validation"
# the validated run is measured this many times on the same requests: the aggregate targets are
# judged on the median of the repeats (rule.py)
REPEATS = 3


def machine_info(threads: int) -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    # one CPU model name covers hosts with and without AVX-512: torch's capability tells them apart
    return {
        "CPU": cpu,
        "CPU vector instructions (torch)": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "Python": platform.python_version(),
        "torch": torch.__version__,
        "torch threads": threads,
        "platform": platform.platform(),
    }


def _scale(fit_meta: dict) -> str:
    """A fit's speed scale and the weight its speed ticks had in it (execute.speed_from_ticks)."""
    w = (fit_meta.get("speed_ticks_s") or {}).get("tick_weight")
    return f"{fit_meta.get('scaled_by', 1.0):.3f}" + (f" (ticks {w:.2f})" if w is not None else "")


def _load() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def run_matrix(
    cases: list,
    model: str,
    out: Path,
    opts: CaseOptions = CaseOptions(repeats=REPEATS),
    *,
    calibration: Path | None = None,
    generic: bool = False,
    quiet: bool = False,
) -> tuple[list[dict], dict]:
    """Each case calibrated on its own serving configuration with other requests (matched, the
    default), or every case with one fit: `calibration` (a saved fit) or, with `generic`, one
    generic calibration at the start. Each case's validated run is measured `opts.repeats` times
    on the same requests (execute.run_repeated), on `opts.device` with `opts.threads` threads."""
    out = Path(out)
    t0 = time.perf_counter()
    load_start = _load()
    rows = []
    with ProgressBar(
        "validation",
        quiet=quiet,
        total=len(cases) + 1,
        fields="{task.fields[step]}",
        transient=True,
        step="calibrating",
    ) as bar:
        runnable = [c for c in cases if MODES.get(c.mode).availability()[0]]
        fit = None
        if runnable and (calibration or generic):
            fit = FittedCostModel.load(calibration) if calibration else calibrate(model, out / "calibration", opts)
        bar.update(advance=1)
        for case in cases:
            bar.update(step=f"validating {case.name}")

            try:
                rows.append(validate_case(case, model, out / case.name, opts, SimCostOptions(fit=fit)))
            except InfersimError as exc:
                # one case's failure (e.g. a feature executor whose run directory lacks a table) is
                # reported in its row; the rest of the matrix runs
                rows.append(
                    {"case": case.name, "title": case.title, "mode": case.mode, "status": "failed", "reason": str(exc)}
                )
            bar.update(advance=1)
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "model": model,
        "device": opts.device,
        "wall_s": time.perf_counter() - t0,
        "load_start": load_start,
        "load_end": _load(),
        "repeats": opts.repeats,
        "fit": fit.meta if fit is not None else None,
        "fits": {
            r["case"]: r["cost_model"]["fit"]["meta"]
            for r in rows
            if r.get("status") == "ran" and "fit" in r.get("cost_model", {})
        },
    }
    return rows, meta


def write_results(rows: list[dict], meta: dict, machine: dict, folder: Path) -> Path:
    """RESULTS.md / RESULTS.html in folder: the summary line, the verdict, the machine, the table
    (report.matrix_report) and how the cases were calibrated and measured; returns the Markdown file."""
    ran = [r for r in rows if r.get("status") == "ran"]
    passed = [r for r in ran if r["passed"]]
    info = {
        "title": summary_line(rows, meta, machine),
        "subtitle": f"{meta['date']} — `{meta['model']}` on {meta['device']}; {len(ran)} of {len(rows)} cases ran, "
        f"{len(passed)} met every target under the rule.",
        "verdict": _verdict(rows, ran),
        "machine": {
            **machine,
            "load average (1/5/15 min) at start": meta["load_start"],
            "load average at end": meta["load_end"],
            "matrix wall time": f"{meta['wall_s']:.0f} s",
        },
        "notes": [_calibration_note(meta) + _repeats_note(ran, meta), *_READING_NOTES],
    }
    _, md = matrix_report(rows, info, folder)
    return md


def _verdict(rows: list[dict], ran: list[dict]) -> list[str]:
    """How many runnable cases met every target, which missed; the rule and what the ticks did."""
    passed = [r for r in ran if r["passed"]]
    missed = ", ".join(r["case"] for r in ran if not r["passed"])
    return [
        f"**{len(passed)} of {len(ran)} runnable cases met every target under the rule**"
        + (f"; {len(rows) - len(ran)} cases did not run." if len(rows) > len(ran) else ".")
        + (f" Missed: {missed} (sources in the table)." if len(passed) < len(ran) else "")
        + _iteration_only_note(ran),
        f"The rule: {RULE}. The raw per-iteration MAPE (at the run's average speed) is reported beside "
        f"the one judged; ✗ marks a miss under the rule." + _local_speed_note(ran),
    ]


def _calibration_note(meta: dict) -> str:
    """How the cost model was calibrated: one generic fit for every case, or one fit around each case."""
    if meta.get("fit"):
        return _generic_fit_note(meta["fit"])
    fits = meta.get("fits", {})
    off_fits = {c: f for c, f in fits.items() if "link_fit" in f}
    spec_fits = {c: f for c, f in fits.items() if "round_fit" in f}
    if off_fits and len(off_fits) == len([f for f in fits.values() if "iteration_fit" in f]):
        note = "Cost model:"  # only offload cases ran: the plain cases' sentence has no case to name
    else:
        note = _plain_fits_note(fits)
    return note + (_offload_fits_note(off_fits) if off_fits else "") + (_spec_fits_note(spec_fits) if spec_fits else "")


def _generic_fit_note(fit: dict) -> str:
    it = fit.get("iteration_fit", {})
    seeds = ", ".join(str(x) for x in fit.get("seeds", [fit.get("seed")]))
    return (
        "Cost model: one executor fit (analysis/validate/calibrate.py) for every case, calibrated on held-out "
        f"executor runs ({', '.join(fit.get('workloads', []))}, seeds {seeds}: other requests and "
        f"shapes than any case) — in-sample MAPE {it.get('mape_in_sample', float('nan')):.1%} over "
        f"{it.get('points', 0)} iterations, {it.get('stalls', float('nan')):.1%} of them stalled."
    )


def _plain_fits_note(fits: dict) -> str:
    """The plain cases' executor fits, calibrated around each case: in-sample MAPE, stalls, speed scale."""
    return (
        "Cost model: for each case an executor fit (analysis/validate/calibrate.py) calibrated around it (once before, once after, "
        "in mirror order) on the case's own serving configuration (KV pools, limits, preemption) with other requests "
        "(calibration workloads calib-matched-load, calib-matched-burst and the case's own request mix calib-matched-mix, "
        "seeds 9009-9011), scaled to the machine's speed in the validated run (its speed ticks, a reference "
        "kernel timed inside every run, weighted against the calibration runs' median ratio by how well each "
        "predicted those runs; without ticks, the runs next to it) — in-sample MAPE / stalled / scale (the "
        "ticks' weight): "
        + ", ".join(
            f"{c} {f['iteration_fit']['mape_in_sample']:.1%} / {f['iteration_fit']['stalls']:.1%} / {_scale(f)}"
            for c, f in fits.items()
            if "iteration_fit" in f and "link_fit" not in f
        )
        + "."
    )


def _offload_fits_note(off_fits: dict) -> str:
    """The offload cases' OffloadCostModel fits: in-sample MAPE, speed shift around the run, speed scale."""
    return (
        " Offload cases: the simulator's OffloadCostModel (per layer: compute + loads of the policy's "
        "tokens + stores) on a compute and host link calibrated around each case on its own serving and "
        "offload sections with other requests (analysis/validate/offload_calibrate.py, seeds 9013-9014) — "
        "its compute scaled to the validated run's speed ticks — in-sample iteration MAPE / machine speed "
        "shift before→after / scale (the ticks' weight): " + _shifted_fits(off_fits, "iteration_fit") + "."
    )


def _spec_fits_note(spec_fits: dict) -> str:
    """The speculative cases' round fits: in-sample MAPE, speed shift around the run, speed scale."""
    return (
        " Speculative cases: a round fit (analysis/validate/spec_costmodel.py) calibrated around each "
        "case on its own serving and speculation sections with other requests (calib-spec-load, "
        "calib-spec-burst and the case's own request mix calib-spec-mix, seeds 9011, 9012 and 9015), scaled "
        "as the plain cases (a pipelined run's draft terms by its drafting process's ticks) — in-sample "
        "round MAPE / machine speed shift before→after / scale (the ticks' weight): "
        + _shifted_fits(spec_fits, "round_fit")
        + "."
    )


def _shifted_fits(fits: dict, fit_key: str) -> str:
    """'case MAPE / speed shift / scale' per fit, the MAPE read from fits[case][fit_key]."""
    return ", ".join(
        f"{c} {f[fit_key]['mape_in_sample']:.1%} / {f.get('speed_shift', float('nan')):+.1%} / {_scale(f)}"
        for c, f in fits.items()
    )


def _repeats_note(ran: list[dict], meta: dict) -> str:
    """How the repeated validated runs were judged, and how far their busy times spread ('' without repeats)."""
    rep = [r for r in ran if r.get("repeats")]
    if not rep:
        return ""
    return (
        f" Measurement: each validated run was served {meta.get('repeats', rep[0]['repeats']['repeats'])} "
        "times on the same requests; the aggregate targets are judged on the median of the repeats' errors "
        "against the same simulation, the per-iteration errors on the run of median busy time (the "
        "engine's iterations or rounds summed: execute.run_repeated) — busy-time spread over the repeats / "
        "run of median busy time: "
        + ", ".join(f"{r['case']} {r['repeats']['spread']:.1%} / {r['repeats']['kept']}" for r in rep)
        + "."
    )


# how to read the table, and how to write it again
_READING_NOTES = (
    "Per-iteration MAPE: the cost model on the executor's exact batches against the measured engine time "
    "(start to next start); for the speculative cases per round (the drafts' s steps + the verification; "
    "pipelined: the verifying thread's pass), on the executed rounds' rebuilt batches. Speculative cases "
    "also check acceptance and tokens per step (5%). The other errors are end to end: the simulated run against the executed one on "
    "the same requests. A miss names its source: timing noise (more than 2% of iterations stalled, or the "
    "machine's speed moved more than 5% between the calibrations around the run, or the repeats disagree), "
    "the acceptance model, "
    "a scheduling mismatch (even the simulation driven by the executor's own measured times is off), or the "
    "cost model (that replay is close: the predicted times differ).",
    "Reproduce: `python -m infersim.analysis.validate.matrix` (per-case reports under runs/validation-matrix/<case>/).",
)


def _iteration_only_note(rows: list[dict]) -> str:
    """The cases that met every target but the per-iteration MAPE: their end-to-end numbers held."""
    only = [
        r["case"]
        for r in rows
        if not r["passed"]
        and {c["metric"] for c in r["judged"]["checks"] if not c["ok"]} == {"per-iteration latency MAPE"}
    ]
    return (
        f" {len(only)} of them missed the per-iteration MAPE alone, every end-to-end target met: " f"{', '.join(only)}."
        if only
        else ""
    )


def _local_speed_note(rows: list[dict]) -> str:
    """How far the speed ticks helped: in how many cases pricing at the local speed lowered the
    per-iteration MAPE, and how far the ticks ranged where it did not."""
    judged = [
        c
        for r in rows
        for c in (r.get("judged") or {}).get("checks", [])
        if c["metric"] == "per-iteration latency MAPE" and c.get("judged_on") == "local speed"
    ]
    if not judged:
        return ""
    worse = [
        r
        for r in rows
        for c in (r.get("judged") or {}).get("checks", [])
        if c["metric"] == "per-iteration latency MAPE" and c.get("judged_on") == "local speed" and c["value"] > c["raw"]
    ]
    hi = [((r["comparison"]["cost_model"].get("within_run") or {}).get("tick_range") or [1, 1])[1] for r in worse]
    return (
        f" At the local speed the per-iteration MAPE was lower than the raw one in {len(judged) - len(worse)} of "
        f"{len(judged)} cases"
        + (
            f"; higher in {len(worse)}, whose speed ticks reached up to {max(hi):.1f}x their "
            f"median (p90): ticks the process lost its core in, which price the iterations "
            f"around them that slow too."
            if worse
            else "."
        )
    )


def summary_line(rows: list[dict], meta: dict, machine: dict) -> str:
    """The results file's first line, the one the README quotes."""
    passed = sum(1 for r in rows if r.get("status") == "ran" and r["passed"])
    return (
        f"{passed} of {len(rows)} validation cases met every target under the rule (per-iteration MAPE at local "
        f"speed, aggregates on the median of {meta.get('repeats', REPEATS)} repeats) — `{meta['model']}` on "
        f"{meta['device']}, {machine.get('CPU', '?')} ({machine.get('cores', '?')} cores, "
        f"{machine.get('CPU vector instructions (torch)', '?')}), {meta['date']}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m infersim.analysis.validate.matrix", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", default="zoo-target")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cases", nargs="*", default=None, help="case names (default: all)")
    p.add_argument("--small", action="store_true", help="only the small matrix (what the test suite runs)")
    p.add_argument("--calibration", type=Path, default=None, help="an executor fit to reuse instead of calibrating")
    p.add_argument(
        "--generic",
        action="store_true",
        help="one generic calibration for every case instead of one on each case's serving configuration",
    )
    p.add_argument("--out", type=Path, default=Path("runs") / "validation-matrix", help="per-case reports")
    p.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of RESULTS.md (default docs/validation)")
    p.add_argument(
        "--repeats",
        type=int,
        default=REPEATS,
        help="measure each validated run this many times on the same requests: the aggregate targets are "
        "judged on the median of the repeats (default %(default)s)",
    )
    p.add_argument("--quiet", "-q", action="store_true")
    args = p.parse_args(argv)
    try:
        if args.repeats < 1:
            raise InfersimError(f"--repeats must be at least 1, got {args.repeats}")
        cases = (
            small_matrix() if args.small else [get_case(n) for n in args.cases] if args.cases else list(CASES.values())
        )
        rows, meta = run_matrix(
            cases,
            args.model,
            args.out,
            CaseOptions(device=args.device, threads=args.threads, repeats=args.repeats),
            calibration=args.calibration,
            generic=args.generic,
            quiet=args.quiet,
        )
        machine = machine_info(args.threads)
        from infersim.simulator.metrics.rundir import write_json

        # every row, so the table can be written again without measuring again (write_results)
        write_json(args.out / "matrix.json", {"rows": rows, "meta": meta, "machine": machine})
        path = write_results(rows, meta, machine, args.results)
    except InfersimError as exc:
        sys.stderr.write(f"validation matrix: error: {exc}\n")
        return exc.exit_code
    if not args.quiet:
        for r in rows:
            if r.get("status") != "ran":
                print(f"{r['case']:20s} {r['status']}: {r.get('reason', '')}")
                continue
            miss = [c["metric"] for c in r["checks"] if not c["ok"]]
            print(f"{r['case']:20s} {'pass' if not miss else 'miss: ' + ', '.join(miss)}")
        print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
