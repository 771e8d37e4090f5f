"""`sim validate`: run a workload on the real executor and in the simulator on exactly the
same requests and policies, and report predicted against measured (analysis/validate/)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from infersim.analysis.validate.cases import CASES, case_from_spec, get_case
from infersim.analysis.validate.execute import CaseOptions
from infersim.analysis.validate.modes import MODES
from infersim.analysis.validate.run import SimCostOptions, validate_case
from infersim.simulator.costmodel.calibration_file import read_fit_json
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.metrics.rundir import staged_dir
from infersim.simulator.preflight import check_workload, revalidate
from infersim.simulator.progress import log_line
from infersim.simulator.validation import check_seed, check_threads, in_field, positive_int
from infersim.simulator.workload.builder import load_workload

from .commands import COMMANDS
from .run import add_memory_flag, add_out_flags


def add_parser(sub) -> None:
    p = sub.add_parser(
        "validate",
        help=COMMANDS["validate"].help,
        description="Serve a workload on a real model (the executor), simulate exactly the same requests with the "
        "same policy configuration and KV pools, and write a report (report.md, report.html, plots) of "
        "predicted against measured: per-iteration latency, TTFT, TPOT, end-to-end p50/p99, throughput, "
        "preemptions, bytes swapped; errors as MAPE and signed bias against the targets, and for each "
        'miss the component it comes from. Needs `pip install ".[executor]"`.',
    )
    p.add_argument("--workload", "-w", default=None, help="built-in workload name or a workload YAML file")
    p.add_argument("--case", default=None, help="a case of the validation matrix instead of a workload (see --list)")
    p.add_argument("--list", action="store_true", help="list the validation matrix's cases and exit")
    p.add_argument(
        "--model",
        "-m",
        default="zoo-target",
        help="zoo name or local Hugging Face checkpoint folder (default zoo-target)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default cpu)")
    p.add_argument("--dtype", default=None, help="fp32, fp16 or bf16 (default fp32 on cpu, fp16 on cuda)")
    p.add_argument(
        "--cost-model",
        default="fitted",
        choices=("fitted", "regression", "roofline"),
        help="fitted (default): a fit to held-out executor runs of the same model on other requests, "
        "measured now or loaded with --calibration; regression / roofline: the --profile's models",
    )
    p.add_argument(
        "--profile",
        default="cpu-reference",
        help="hardware profile (name or YAML, e.g. from `sim profile`) for --cost-model regression/roofline "
        "(default cpu-reference)",
    )
    p.add_argument(
        "--calibration",
        type=Path,
        default=None,
        help="an executor fit (executor-fit.json from an earlier validation) instead of calibrating now",
    )
    p.add_argument(
        "--generic-calibration",
        action="store_true",
        help="calibrate the fit on the generic calibration workloads instead of on the validated "
        "workload's own serving configuration (KV pools, limits, preemption) with other requests",
    )
    p.add_argument(
        "--drift-correction",
        action="store_true",
        help="scale the fit by the machine's speed around the run against at calibration (a fixed "
        "sentinel iteration timed at both; helps when the load changed between them and stayed)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steadier timings)")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the validated requests this many times: the aggregate targets are judged on the median "
        "of the repeats (the matrix uses 3; default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=None, help="override the workload's seed")
    p.add_argument("--requests", "-n", type=int, default=None, help="override the request count")
    add_out_flags(p, "output folder (default runs/validate-<name>)", replaces=True)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines or table")
    add_memory_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(f"{'case':20s} {'mode':12s} {'small':6s}what")
        for c in CASES.values():
            ok, why = MODES.get(c.mode).availability()
            print(
                f"{c.name:20s} {c.mode:12s} {'yes' if c.small else '':6s}{c.title}"
                + ("" if ok else f"  [not available: {why}]")
            )
        print("small: one of the cheapest cases, which the test suite runs")
        return 0
    if (args.workload is None) == (args.case is None):
        raise InfersimError("give exactly one of --workload FILE and --case NAME (see --list)")
    check_threads(args.threads)
    if args.repeats < 1:
        raise InfersimError(f"--repeats must be at least 1, got {args.repeats}")
    if args.requests is not None:
        positive_int(args.requests, "--requests")
    if args.seed is not None:
        check_seed(args.seed, "--seed")
    if args.cost_model != "fitted" and args.device.startswith("cuda") and args.profile == "cpu-reference":
        raise InfersimError(
            f"--cost-model {args.cost_model} on cuda needs the GPU's profile: --profile PATH.yaml "
            f"(from `sim profile --device cuda --out PATH.yaml`)"
        )
    if args.calibration is not None and args.cost_model != "fitted":
        raise InfersimError("--calibration is an executor fit: it goes with --cost-model fitted")
    # flags the run would otherwise ignore: the drift of a saved fit, the runs of a fit made now
    if args.drift_correction and args.calibration is None:
        raise InfersimError("--drift-correction scales a saved fit: it goes with --calibration FIT.json")
    if args.generic_calibration and (args.calibration is not None or args.cost_model != "fitted"):
        raise InfersimError(
            "--generic-calibration chooses the runs a fit is calibrated on now: it goes with --cost-model "
            "fitted and no --calibration"
        )
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise InfersimError(
            f"validation runs the executor, which needs PyTorch and transformers ({exc}): " f'pip install ".[executor]"'
        )
    spec = None
    if args.case is not None:
        case = get_case(args.case)
    else:
        spec, _ = load_workload(args.workload)
        spec_model = spec.model  # the shared rules check the catalog model the workload names
        upd = {"model": args.model}
        if args.seed is not None:
            upd["seed"] = args.seed
        if args.requests is not None:
            upd["requests"] = spec.requests.model_copy(update={"count": args.requests})
        spec = revalidate(spec.model_copy(update=upd), str(args.workload))
        check_workload(
            spec.model_copy(update={"model": spec_model}),
            str(args.workload),
            allow_large=args.no_memory_check,
            flags={"requests.count": "--requests"} if args.requests is not None else None,
        )
        if spec.requests.trace is not None:
            raise InfersimError(
                f"{args.workload}: trace workloads are not supported by `sim validate` yet: give "
                f"length distributions"
            )
        case = case_from_spec(spec)

    ok, why = MODES.get(case.mode).availability()
    if not ok:
        raise InfersimError(f"case {case.name} needs the executor mode '{case.mode}', which is not available: {why}")

    _check_names(args)
    out_dir = args.out or Path("runs") / f"validate-{case.name}"
    log = None if args.quiet else log_line

    opts = CaseOptions(
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        seed=args.seed,
        requests=args.requests,
        spec=spec,
        calibration=args.calibration,
        repeats=args.repeats,
        log=log,
    )
    cost = SimCostOptions(
        cost_model=args.cost_model,
        profile=args.profile,
        drift_correction=args.drift_correction,
        matched=not args.generic_calibration,
    )
    # built in a hidden sibling and swapped in whole: an interrupted validation leaves the
    # previous case folder as it was (never new runs beside an old report), or nothing
    with staged_dir(out_dir, command="validate", force=args.force) as staged:
        result = validate_case(case, args.model, staged, opts, cost)
    out = Path(out_dir)
    if not args.quiet:
        print_checks(result)
        print(f"report: {out / 'report.html'} (and report.md); runs: {out / 'exec'}, {out / 'sim'}")
    return 0


def _check_names(args: argparse.Namespace) -> None:
    """What the validation would refuse only after its calibration runs: the model, the device,
    the hardware profile and a saved fit, each checked before the output folder is made."""
    from infersim.executor.models import check_dtype_name, resolve_model_path, select_device

    in_field("", "--model", resolve_model_path, args.model)
    select_device(args.device)
    if args.dtype is not None:
        check_dtype_name(args.dtype)
    in_field("", "--profile", load_hardware, args.profile)
    if args.calibration is not None:
        read_fit_json(args.calibration)


def print_checks(result: dict) -> None:
    """The targets as a table with each miss's source in a word, then the verdict and each
    source's explanation once (report.md gives each row's in full)."""
    checks = (result.get("judged") or {}).get("checks", result["checks"])  # the pass rule's (analysis/validate/rule.py)
    t = Table(title=f"{result['case']}: simulated vs measured, judged by the pass rule")
    # a metric wraps between its words, never inside one ('per-iteration' stays whole at 80 columns)
    longest_word = max((len(word) for c in checks for word in c["metric"].split()), default=0)
    t.add_column("metric", min_width=longest_word)
    for col in ("error", "judged on", "raw", "target", "", "source of the miss"):
        t.add_column(col)
    for c in checks:
        t.add_row(
            c["metric"],
            _pct(c["value"]),
            c.get("judged_on", ""),
            _pct(c.get("raw")),
            f"≤ {c['target']:.0%}",
            "[green]pass[/]" if c["ok"] else "[red]MISS[/]",
            "" if c["ok"] else (c.get("kind") or c["component"]),
        )
    console = Console()
    console.print(t)
    missed = [c for c in checks if not c["ok"]]
    verdict = f"{len(missed)} of {len(checks)} targets missed" if missed else f"all {len(checks)} targets met"
    console.print(f"verdict: {verdict}")
    for component in dict.fromkeys(c["component"] for c in missed if c["component"]):
        console.print(f"  {component}", highlight=False)


def _pct(v) -> str:
    return "-" if v is None else f"{v:+.1%}"
