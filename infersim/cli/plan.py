"""`sim plan`: capacity planning (goodput per replica, replicas, GPUs and cost for a target load)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from infersim.analysis.goodput import compare_goodput, write_goodput
from infersim.analysis.goodput_config import GoodputSection
from infersim.analysis.plan import (
    PlanFlags,
    load_plan_file,
    money,
    num,
    parse_prices,
    parse_slo,
    plan,
    rank,
    verdict,
    write_plan,
)
from infersim.simulator.disaggregation.link import describe_kv_link
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import check_out_dir
from infersim.simulator.policies import PREEMPTION_POLICIES, SCHEDULERS
from infersim.simulator.validation import check_seed, finite_positive, in_field, positive_int
from infersim.simulator.workload.builder import load_workload
from infersim.simulator.yamlio import validate

from .commands import COMMANDS
from .run import add_memory_flag, add_out_flags, backend_options


def _csv(text: str | None) -> list[str]:
    return [x.strip() for x in (text or "").split(",") if x.strip()]


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plan",
        help=COMMANDS["plan"].help,
        description="For each hardware option (x TP degree x option), find by search the highest request rate one "
        "replica sustains within the SLOs, the replicas and GPUs a target load needs (verified by "
        "simulation) and the cost per million output tokens; write an HTML and Markdown report. "
        "Prices and the target load come from --plan FILE or the flags (flags win).",
    )
    p.add_argument("--workload", "-w", required=True, help="built-in workload name or a workload YAML file")
    p.add_argument(
        "--plan",
        type=Path,
        default=None,
        help="plan YAML: slo, hardware, tensor_parallel, pipeline_parallel, data_parallel_attention, options, "
        "prices, target_rate, search "
        "(see examples/plan/)",
    )
    p.add_argument(
        "--slo",
        default=None,
        help="SLOs, e.g. ttft_p99=2s,tpot_p99=100ms (metrics: ttft, tpot, itl, e2e, "
        "queueing, normalized_latency; stats: p50, p90, p99, mean)",
    )
    p.add_argument(
        "--hardware",
        default=None,
        help="hardware options, comma-separated (default: the workload's); NAME:datasheet for a "
        "profile's pure datasheet roofline",
    )
    p.add_argument(
        "--tp",
        default=None,
        help="tensor-parallel degrees to compare, comma-separated, e.g. 1,2 (with --disaggregation: one degree, "
        "every deployment's; default the workload's)",
    )
    p.add_argument(
        "--pp", default=None, help="pipeline-parallel degrees to compare (crossed with --tp), comma-separated, e.g. 1,2"
    )
    p.add_argument(
        "--dp-attention",
        default=None,
        metavar="N1,N2",
        help="data-parallel-attention group sizes to compare beside the TP x PP layouts, e.g. 8,16 (a mixture "
        "of experts: each rank one GPU, N ranks sharing the experts; replicas scale by groups of N GPUs)",
    )
    p.add_argument("--scheduler", default=None, help="schedulers to compare, e.g. fcfs,fairness")
    p.add_argument("--preemption", default=None, help="preemption modes to compare, e.g. recompute,cost_aware")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="PATH=V1,V2",
        help="any dotted workload path to compare, e.g. serving.max_batch_size=128,256 (repeatable)",
    )
    p.add_argument("--price", default=None, help="USD per GPU-hour, e.g. a100-80gb-pcie=1.8,h100-sxm=4.0")
    p.add_argument(
        "--target-rate",
        type=float,
        default=None,
        help="target load in req/s (default: the plan file's, else the workload's arrival rate)",
    )
    p.add_argument(
        "--disaggregation",
        type=int,
        default=None,
        metavar="GPUS",
        help="compare colocated and prefill/decode-disaggregated deployments of GPUS GPUs by goodput "
        "(requests/s per GPU with --attainment of the requests meeting every SLO) instead of the capacity plan",
    )
    p.add_argument(
        "--attainment", type=float, default=None, help="with --disaggregation: fraction meeting the SLOs (default 0.9)"
    )
    p.add_argument("--requests", "-n", type=int, default=None, help="simulated requests per probe (default 3000)")
    p.add_argument("--tolerance", type=float, default=None, help="relative precision of the goodput (default 0.05)")
    p.add_argument("--seed", type=int, default=None, help="seed of every probe (default: the workload's)")
    add_out_flags(p, "report folder (default: plans/<workload name>)", replaces=True)
    p.add_argument("--workers", type=int, default=None, help="parallel simulations (default: one per core)")
    p.add_argument(
        "--backend", choices=("local", "ray"), default="local", help="local processes or a Ray cluster (default local)"
    )
    p.add_argument("--address", default=None, help="Ray cluster address (default: start a local Ray instance)")
    p.add_argument("--no-plots", action="store_true", help="skip the plots")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress or table")
    add_memory_flag(p)
    p.set_defaults(func=run)


def _options(args) -> dict[str, list]:
    out: dict[str, list] = {}
    for flag, path, registry, text in (
        ("--scheduler", "serving.scheduler", SCHEDULERS, args.scheduler),
        ("--preemption", "serving.preemption", PREEMPTION_POLICIES, args.preemption),
    ):
        if text:
            out[path] = _csv(text)
            for name in out[path]:  # a typo is named by its flag, before any search
                in_field("", flag, registry.get, name)
    for item in args.option:
        if "=" not in item:
            raise InfersimError(f"bad --option '{item}': write PATH=V1,V2, e.g. serving.max_batch_size=128,256")
        path, values = item.split("=", 1)
        out[path.strip()] = [yaml.safe_load(v) for v in _csv(values)]
        if not out[path.strip()]:
            raise InfersimError(f"bad --option '{item}': give at least one value")
    return out


def _degrees(text, flag: str) -> list[int]:
    """'1,2' -> [1, 2]; a bad list is one line naming the flag."""
    out = []
    for t in _csv(text):
        try:
            out.append(int(t))
        except ValueError:
            raise InfersimError(f"bad {flag} '{text}': give integers, e.g. 1,2") from None
        if out[-1] < 1:
            raise InfersimError(f"bad {flag} '{text}': degrees must be at least 1")
    return out


def run(args: argparse.Namespace) -> int:
    if args.requests is not None:
        positive_int(args.requests, "--requests")
    if args.target_rate is not None:
        finite_positive(args.target_rate, "--target-rate")
    if args.seed is not None:
        check_seed(args.seed, "--seed")
    if args.tolerance is not None:
        finite_positive(args.tolerance, "--tolerance")
    if args.workers is not None:
        positive_int(args.workers, "--workers")
    tps, pps = _degrees(args.tp, "--tp"), _degrees(args.pp, "--pp")
    dps = _degrees(args.dp_attention, "--dp-attention")

    # refused before the search, not after it
    out = check_out_dir(
        args.out or Path("plans") / load_workload(args.workload)[0].name, force=args.force, command="plan"
    )
    pf = load_plan_file(args.plan)
    if args.disaggregation is not None or pf.disaggregation is not None:
        return _goodput(args, pf, out)
    if args.attainment is not None:
        raise InfersimError("--attainment goes with --disaggregation GPUS (or a plan file's disaggregation: section)")
    flags = PlanFlags(
        hardware=_csv(args.hardware),
        tensor_parallel=tps,
        pipeline_parallel=pps,
        data_parallel_attention=dps,
        options=_options(args),
        prices=in_field("", "--price", parse_prices, args.price),
        target_rate=args.target_rate,
        requests=args.requests,
        tolerance=args.tolerance,
        seed=args.seed,
    )
    res = plan(
        args.workload,
        slos=in_field("", "--slo", parse_slo, args.slo) if args.slo else [],
        plan_file=pf if args.plan else None,  # without a file, errors name the workload alone
        flags=flags,
        run=backend_options(args),
        plan_source=str(args.plan) if args.plan else "plan file",
    )
    paths = write_plan(res, out, plots=not args.no_plots, force=args.force)
    if not args.quiet:
        c = Console()
        t = Table(title=f"capacity plan: {res.workload} ({', '.join(s.describe() for s in res.slos)})")
        for col in ("configuration", "goodput/replica", "replicas", "GPUs", "$/M out tok", "status"):
            t.add_column(col, justify="left" if col in ("configuration", "status") else "right")
        ranked = rank(res.candidates)
        for cand in ranked + [x for x in res.candidates if x not in ranked]:
            t.add_row(
                cand.label,
                f"{num(cand.goodput_rps)} req/s",
                str(cand.replicas or "-"),
                str(cand.gpus or "-"),
                money(cand.cost_per_m_output_tokens),
                cand.status,
            )
        c.print(t)
        for line in verdict(res):
            c.print(line.replace("**", ""))
        c.print(f"report: {paths['html']} (and report.md, configurations.csv, probes.csv) in {res.wall_s:.1f} s")
    if not rank(res.candidates):
        # no configuration meets the SLOs (or none ran): the report says why; the status says so too
        if args.quiet:
            print(verdict(res)[0].replace("**", ""), file=sys.stderr)
        return 3
    return 0


def _goodput(args: argparse.Namespace, pf, out: Path) -> int:
    """`sim plan --disaggregation GPUS` (or a plan file's disaggregation: section)."""
    source = str(args.plan) if args.plan else "--disaggregation"  # without a file, the section is the flags'
    section = pf.disaggregation.model_dump() if pf.disaggregation is not None else {}
    if args.disaggregation is not None:
        positive_int(args.disaggregation, "--disaggregation")
        section["gpus"] = args.disaggregation
    if args.attainment is not None:
        finite_positive(args.attainment, "--attainment")
        section["attainment"] = args.attainment
    if args.dp_attention or pf.data_parallel_attention:
        raise InfersimError(
            "--dp-attention (or a plan file's data_parallel_attention) is a capacity-plan layout; "
            "--disaggregation compares colocated and disaggregated tensor-parallel deployments"
        )
    tps = _degrees(args.tp, "--tp")
    if tps:
        if len(tps) > 1:
            raise InfersimError("--tp: --disaggregation compares deployments at one tensor-parallel degree; give one")
        section["tensor_parallel"] = tps[0]
    if "gpus" not in section:
        raise InfersimError(
            f"{source}: field 'disaggregation.gpus': give the GPUs to compare (or --disaggregation GPUS)"
        )
    section = validate(
        GoodputSection, section, source if pf.disaggregation is not None else "--disaggregation/--attainment"
    )
    slos = (
        in_field("", "--slo", parse_slo, args.slo) if args.slo else in_field(source, "slo", parse_slo, pf.slo or None)
    )
    if not slos:
        raise InfersimError("give at least one SLO: --slo ttft_p90=2s,tpot_p90=100ms (or slo: in the plan file)")
    search = pf.search.model_copy(
        update={k: v for k, v in (("requests", args.requests), ("tolerance", args.tolerance)) if v is not None}
    )
    res = compare_goodput(
        args.workload,
        slos=slos,
        section=section,
        search=search,
        seed=args.seed,
        run=backend_options(args),
        source=source,
    )
    paths = write_goodput(res, out, plots=not args.no_plots, force=args.force)
    if not args.quiet:
        t = Table(title=f"goodput on {section.gpus} GPUs: {res.workload} (≥{section.attainment:.0%} meeting every SLO)")
        for col in ("deployment", "goodput", "per GPU", "status"):
            t.add_column(col, justify="left" if col in ("deployment", "status") else "right")
        for d in res.deployments:
            t.add_row(d.label, f"{d.goodput_rps:.3g} req/s", f"{d.goodput_per_gpu:.3g} req/s", d.status)
        c = Console()
        c.print(t)
        c.print(f"KV link of the disaggregated deployments: {describe_kv_link(res.kv_link)}")
        c.print(f"higher goodput per GPU: {res.winner()}; report: {paths['md']} in {res.wall_s:.1f} s")
    return 0
