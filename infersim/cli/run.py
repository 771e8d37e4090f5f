"""`sim run`: simulate a workload and write a run directory."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.filesize import decimal
from rich.table import Table

from infersim.analysis.sweep_backends import BackendOptions
from infersim.simulator.disaggregation.link import describe_kv_link
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.metrics.plots import plot_run
from infersim.simulator.metrics.rundir import check_out_dir, pause_point, staged_dir
from infersim.simulator.metrics.summary import summarize, write_result_files
from infersim.simulator.models.dtypes import kv_dtype_for, normalize_dtype
from infersim.simulator.parallel.placement import cluster_gpus_per_node, tp_across_nodes_note
from infersim.simulator.parallel.report import plot_stages, write_stage_timeline
from infersim.simulator.preflight import check_workload, revalidate
from infersim.simulator.progress import ProgressBar
from infersim.simulator.simulation import Simulation
from infersim.simulator.speculative.report import write_series
from infersim.simulator.validation import MEMORY_FLAG, arrivals_notice, check_seed, finite_positive, positive_int
from infersim.simulator.workload.builder import build_requests, load_workload

from .commands import COMMANDS

# exit status of a run that completed but in which no request finished (every one aborted)
EXIT_NOTHING_FINISHED = 3
ABORT_REASONS = {
    "exceeds_context": "longer than the context (serving.max_model_len)",
    "exceeds_kv_pool": "need more KV blocks than the whole GPU pool",
}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "run",
        help=COMMANDS["run"].help,
        description="Simulate an LLM serving deployment on a workload and write a run directory "
        "(config.yaml, requests.parquet, series.parquet, summary.json, plots/).",
        epilog=f"Exit status: 0 done; 2 bad input or an --out that may not be replaced (nothing written); "
        f"{EXIT_NOTHING_FINISHED} the run completed but no request finished (every one aborted; the run "
        f"directory is written and the reasons are in summary.json aborted_by_reason); 130 interrupted "
        f"(Ctrl-C, SIGINT); 143 terminated (SIGTERM). An interrupted run leaves the previous --out as "
        f"it was and no temporary folder.",
    )
    p.add_argument(
        "--workload", "-w", required=True, help="built-in workload name (see `sim workloads`) or a workload YAML file"
    )
    p.add_argument(
        "--out",
        "-o",
        type=Path,
        default=None,
        help="run directory (default: runs/<workload name>); an existing one is replaced only when "
        "infersim wrote it (it holds a .infersim-run marker) or with --force",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace --out even when it is a folder infersim did not write (its files are lost)",
    )
    add_override_flags(p, model_and_hardware=True)
    p.add_argument(
        "--step-mode",
        action="store_true",
        help="simulate every decode step one by one (slower; same results as the default event mode)",
    )
    p.add_argument(
        "--prefix-caching",
        choices=("on", "off"),
        default=None,
        help="override serving.prefix_caching (automatic prefix caching, docs/prefix-caching.md)",
    )
    p.add_argument(
        "--compare-prefix-caching",
        action="store_true",
        help="also simulate the same requests with prefix caching off and put its TTFT, end-to-end "
        "latency and throughput in summary.json (without_prefix_caching) beside the cached run's",
    )
    p.add_argument("--no-plots", action="store_true", help="skip the plots")
    p.add_argument("--csv", action="store_true", help="also write requests.csv")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or table")
    add_memory_flag(p)
    p.set_defaults(func=run)


def add_out_flags(p, where: str, *, replaces: bool) -> None:
    """--out/-o, a folder (`where`: what it holds, its default), and --force. A folder a command
    `replaces` (a run, a validation) or writes into (a sweep, a study) is touched only when infersim
    wrote it, or is new, unless --force."""
    if replaces:
        rule, force = "replaced only when infersim wrote it", "replace --out even when infersim did not write it"
    else:
        rule, force = (
            "used only when infersim wrote it or it is new",
            "write into --out even when infersim did not write it",
        )
    p.add_argument("--out", "-o", type=Path, default=None, help=f"{where}; {rule}")
    p.add_argument("--force", action="store_true", help=force)


def add_memory_flag(p) -> None:
    """The override of the up-front memory refusal, the same on every command."""
    p.add_argument(
        MEMORY_FLAG,
        action="store_true",
        dest="no_memory_check",
        help="run even when the estimated memory exceeds what this machine has available",
    )


def add_override_flags(p, *, model_and_hardware: bool) -> None:
    """The workload overrides apply_overrides reads (--prefix-caching aside: each command says what
    its caching shares). `sim exec` serves a model of its own, so it leaves out --model and --hardware."""
    p.add_argument("--seed", type=int, default=None, help="override the workload's seed")
    p.add_argument("--requests", "-n", type=int, default=None, help="override the request count")
    if model_and_hardware:
        p.add_argument("--model", default=None, help="override the model (name, YAML or config.json)")
        p.add_argument(
            "--hardware",
            default=None,
            help="override the hardware profile (NAME:datasheet: its pure datasheet roofline, without the "
            "calibrated kernel models)",
        )
        p.add_argument("--tp", type=int, default=None, help="override hardware.tensor_parallel (GPUs per replica)")
        p.add_argument("--replicas", type=int, default=None, help="override hardware.replicas")
        p.add_argument(
            "--dtype", default=None, help="override serving.dtype, the weight dtype (fp16, bf16, fp8, int8, int4)"
        )
        p.add_argument(
            "--kv-dtype",
            default=None,
            help="override serving.kv_dtype, the KV cache dtype (default: 16-bit under fp8, int8 and int4 weights, "
            "as vLLM's --kv-cache-dtype auto; fp8 halves the cache)",
        )
    p.add_argument("--scheduler", default=None, help="override serving.scheduler (fcfs, fairness)")
    p.add_argument("--preemption", default=None, help="override serving.preemption (recompute, swap, cost_aware)")
    p.add_argument(
        "--rate", type=float, default=None, help="override the arrival rate (req/s) of poisson/gamma arrivals"
    )


def apply_overrides(spec, args, source: str = "workload"):
    """The spec with the command-line overrides, validated again as a whole."""
    upd = {}
    if args.seed is not None:
        upd["seed"] = check_seed(args.seed, "--seed")
    if args.model:
        upd["model"] = args.model
    hw, sv, rq = {}, {}, {}
    if args.hardware:
        hw["profile"] = args.hardware
    if getattr(args, "tp", None) is not None:
        hw["tensor_parallel"] = positive_int(args.tp, "--tp")
    if getattr(args, "replicas", None) is not None:
        hw["replicas"] = positive_int(args.replicas, "--replicas")
    if getattr(args, "dtype", None):
        sv["dtype"] = args.dtype
    if getattr(args, "kv_dtype", None):
        sv["kv_dtype"] = args.kv_dtype
    if args.scheduler:
        sv["scheduler"] = args.scheduler
    if args.preemption:
        sv["preemption"] = args.preemption
    if getattr(args, "prefix_caching", None):
        sv["prefix_caching"] = args.prefix_caching == "on"
    if args.requests is not None:
        rq["count"] = positive_int(args.requests, "--requests")
    if args.rate is not None:
        arr = spec.requests.arrival
        finite_positive(args.rate, "--rate")
        if arr is None or not hasattr(arr, "rate"):
            raise InfersimError("--rate needs a workload with poisson or gamma arrivals")
        rq["arrival"] = arr.model_copy(update={"rate": args.rate})
    if hw:
        upd["hardware"] = spec.hardware.model_copy(update=hw)
    if sv:
        upd["serving"] = spec.serving.model_copy(update=sv)
    if rq:
        upd["requests"] = spec.requests.model_copy(update=rq)
    return revalidate(spec.model_copy(update=upd), source) if upd else spec


# the workload field each override flag sets (apply_overrides), for refusals to name the flag
OVERRIDE_FLAGS = {
    "model": "--model",
    "hardware.profile": "--hardware",
    "hardware.tensor_parallel": "--tp",
    "hardware.replicas": "--replicas",
    "serving.dtype": "--dtype",
    "serving.kv_dtype": "--kv-dtype",
    "serving.scheduler": "--scheduler",
    "serving.preemption": "--preemption",
    "requests.count": "--requests",
}


def override_flags(args) -> dict[str, str]:
    """{field: flag} of the overrides given on this command line."""
    return {
        f: flag for f, flag in OVERRIDE_FLAGS.items() if getattr(args, flag[2:].replace("-", "_"), None) is not None
    }


def prepare(args, source: str, serving: dict | None = None):
    """Load the workload named by --workload, apply the overrides (flags, then `serving` fields),
    check it against the shared rules (seed, tensor parallelism, memory) and build its requests;
    prints the notice of the count + duration_s rule when it applies. Returns (spec, requests)."""
    spec, base_dir = load_workload(args.workload)
    spec = apply_overrides(spec, args, source)
    if serving:
        spec = revalidate(spec.model_copy(update={"serving": spec.serving.model_copy(update=serving)}), source)
    check_workload(
        spec,
        source,
        allow_large=args.no_memory_check,
        flags=override_flags(args),
        base_dir=Path(base_dir).parent,
    )
    requests = build_requests(spec, base_dir)
    notice = arrivals_notice(spec, len(requests))
    if notice:
        print(notice, file=sys.stderr)
    return spec, requests


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    spec, requests = prepare(args, str(args.workload))
    if args.compare_prefix_caching and not spec.serving.prefix_caching:
        raise InfersimError(
            f"{args.workload}: --compare-prefix-caching needs serving.prefix_caching on (or --prefix-caching on)"
        )
    out = check_out_dir(args.out or Path("runs") / spec.name, force=args.force, command="run")
    summary = execute(spec, requests, out, RunOptions.from_args(args))
    if not args.quiet:
        print_summary(summary, spec, out, time.perf_counter() - t0)
    return finish_status(summary, args.quiet)


def abort_line(s: dict) -> str | None:
    """'12 of 200 requests aborted: 12 longer than the context (...)', or None when none was."""
    if not s["aborted"]:
        return None
    why = ", ".join(f"{n} {ABORT_REASONS.get(k, k)}" for k, n in s.get("aborted_by_reason", {}).items())
    return f"{s['aborted']} of {s['requests']} requests aborted: {why or 'reason not recorded'}"


def finish_status(s: dict, quiet: bool) -> int:
    """The exit status of a completed run; under --quiet, aborted requests still get one line
    on stderr (the table that would say so is not printed)."""
    line = abort_line(s)
    if line and quiet:
        sys.stderr.write(line + "\n")
    if s["requests"] and not s["finished"]:
        sys.stderr.write(f"no request finished: exit status {EXIT_NOTHING_FINISHED}\n")
        return EXIT_NOTHING_FINISHED
    return 0


@dataclass(frozen=True)
class RunOptions:
    """How `sim run` simulates a workload and what it writes besides the summary."""

    source: str = "workload"  # the workload's name or file, for messages
    step_mode: bool = False  # every decode step one by one (same results as the event mode)
    plots: bool = True
    csv: bool = False  # also requests.csv
    quiet: bool = True  # no progress bar
    force: bool = False  # replace an --out infersim did not write
    compare_prefix_caching: bool = False  # also simulate with prefix caching off (`without_prefix_caching`)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "RunOptions":
        return cls(
            source=str(args.workload),
            step_mode=args.step_mode,
            plots=not args.no_plots,
            csv=args.csv,
            quiet=args.quiet,
            force=args.force,
            compare_prefix_caching=args.compare_prefix_caching,
        )


def execute(spec, requests, out: Path, opts: RunOptions = RunOptions()) -> dict:
    """Simulate and write the run directory atomically; returns the summary. With
    `opts.compare_prefix_caching`, the same requests are simulated again with prefix caching
    off and the summary gets that run's latencies (`without_prefix_caching`)."""
    with staged_dir(Path(out), command="run", force=opts.force) as tmp:
        with ProgressBar(
            "simulating",
            quiet=opts.quiet,
            total=len(requests),
            fields="sim time {task.fields[sim_s]:.1f} s",
            transient=True,
            sim_s=0.0,
        ) as bar:

            def progress(done: int, total: int, now: float) -> None:
                pause_point("simulating")
                bar.update(completed=done, sim_s=now)

            sim = Simulation(
                spec,
                requests,
                step_mode=opts.step_mode,
                series_path=tmp / "series.parquet",
                progress=progress,
                source=opts.source,
            )
            result = sim.run()
            if opts.compare_prefix_caching:
                result.extra["without_prefix_caching"] = _without_prefix_caching(spec, requests, opts)
        if spec.speculation is not None:  # acceptance, s, SSM weights and pool depth over time
            write_series(sim, tmp)
        if spec.hardware.pipeline_parallel > 1:  # each stage's busy intervals
            write_stage_timeline(sim, tmp)
        summary = write_result_files(tmp, result, csv=opts.csv)
        pause_point("writing")
        if opts.plots:
            plot_run(tmp)
            plot_stages(tmp)
    return summary


def _without_prefix_caching(spec, requests, opts: RunOptions) -> dict:
    """Latencies and throughput of the same requests served with prefix caching off."""
    off = spec.model_copy(update={"serving": spec.serving.model_copy(update={"prefix_caching": False})})
    s = summarize(Simulation(off, requests, step_mode=opts.step_mode, source=opts.source).run())
    keep = ("ttft_s", "tpot_s", "e2e_s", "queueing_s", "makespan_s", "throughput_req_per_s", "finished")
    return {k: s[k] for k in keep}


def gpus_line(replicas: int, profile: str, tp: int, pp: int = 1, role: str = "") -> str:
    """'8 x h100-sxm (2 replicas, tp=4)': the GPUs first, as a planner counts them, then how
    they are grouped (a replica of tp x pp GPUs)."""
    plural = "s" if replicas != 1 else ""
    pp_part = f", pp={pp}" if pp > 1 else ""
    return f"{replicas * tp * pp} x {profile}{role} ({replicas} replica{plural}, tp={tp}{pp_part})"


def deployment_line(spec) -> str:
    """The GPUs of a deployment, pool by pool when it is disaggregated; each card by its
    profile's name (a profile file's name, not its path)."""
    hw, d = spec.hardware, spec.hardware.disaggregated
    if d is None:
        return gpus_line(hw.replicas, load_hardware(hw.profile).name, hw.tensor_parallel, hw.pipeline_parallel)
    return " + ".join(
        gpus_line(pool.replicas, load_hardware(pool.profile or hw.profile).name, pool.tensor_parallel, role=f" {name}")
        for name, pool in (("prefill", d.prefill), ("decode", d.decode))
    )


def dtypes_line(serving) -> str:
    """'fp8 weights, fp16 KV cache': the weights' dtype and the KV cache's (dtypes.kv_dtype_for)."""
    return f"{normalize_dtype(serving.dtype)} weights, {kv_dtype_for(serving.dtype, serving.kv_dtype)} KV cache"


def placement_notes(spec) -> list[str]:
    """A line for each tensor-parallel group of the deployment that spans nodes."""
    hw, d = spec.hardware, spec.hardware.disaggregated
    g = cluster_gpus_per_node(hw)
    if d is None:
        return [n for n in (tp_across_nodes_note(hw.tensor_parallel, g),) if n]
    notes = (
        tp_across_nodes_note(pool.tensor_parallel, g, f"the {name} pool's group")
        for name, pool in (("prefill", d.prefill), ("decode", d.decode))
    )
    return [n for n in notes if n]


def no_exponent(x: float, digits: int = 3, thousands: str = ",") -> str:
    """`digits` significant digits below 1,000 and whole numbers above (145,421 ms, not
    1.45e+05): no exponent for a reader to decode or to widen a column."""
    if abs(x) >= 1e3:
        return f"{x:,.0f}".replace(",", thousands)
    return f"{x:.{digits}g}"


def batch_and_kv_line(s: dict) -> str:
    """Batch size and KV use while busy; per pool when disaggregated (the pools' KV pools differ
    in size, so one percentage over both would mean neither)."""
    pools = (s.get("disaggregation") or {}).get("pools")
    if pools:
        return (
            "; ".join(
                f"{name} pool: batch size mean {p['batch_size_mean_busy']:.1f}, KV use mean "
                f"{100 * p['kv_utilization_mean_busy']:.1f}% of {p['gpu_blocks']:,} GPU blocks per replica"
                for name, p in pools.items()
            )
            + f"; {s['iterations']} iterations"
        )
    # an offload executor's pool lives in host memory (executor/offload/serve.py)
    pool = "host-memory KV blocks" if (s.get("offload") or {}).get("host_memory") else "GPU blocks"
    if (s.get("executor") or {}).get("device") == "cpu" and pool == "GPU blocks":
        pool = "device KV blocks (in CPU memory)"
    return (
        f"batch size mean {s['batch_size']['mean_busy']:.1f} (max {s['batch_size']['max']:.0f}); KV use mean "
        f"{100 * s['kv_utilization']['mean_busy']:.1f}% (max {100 * s['kv_utilization']['max']:.1f}%) of "
        f"{s['gpu_blocks']} {pool}; {s['iterations']} iterations"
    )


def print_summary(s: dict, spec, out: Path, wall_s: float) -> None:
    """The run's table and lines; a real run (`sim exec`: an `executor` section) is named by the
    device it ran on and its time by the engine clock, not the workload's card and a simulation."""
    c = Console()
    ex = s.get("executor")
    where = f"{ex['device']} ({ex['dtype']})" if ex else f"{deployment_line(spec)}, {dtypes_line(spec.serving)}"
    t = Table(title=f"{spec.name}: {spec.model} on {where}, {spec.serving.scheduler}/{spec.serving.preemption}")
    for col in ("metric", "mean", "p50", "p90", "p99"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for key, label, scale, unit in (
        ("ttft_s", "TTFT", 1e3, "ms"),
        ("tpot_s", "TPOT", 1e3, "ms"),
        ("itl_s", "inter-token latency", 1e3, "ms"),
        ("e2e_s", "end-to-end", 1.0, "s"),
        ("normalized_latency_s", "normalized latency", 1e3, "ms/token"),
        ("queueing_s", "queueing delay", 1.0, "s"),
        ("weighted_turnaround", "weighted turnaround", 1.0, ""),
    ):
        st = s[key]
        fmt = lambda v: "-" if v is None or v != v else no_exponent(v * scale)
        t.add_row(f"{label} ({unit})" if unit else label, *(fmt(st[k]) for k in ("mean", "p50", "p90", "p99")))
    c.print(t)
    if not ex:
        for note in placement_notes(spec):
            c.print(f"[yellow]note: {note}[/]")
    p = s["preemptions"]
    c.print(
        f"requests {s['finished']}/{s['requests']} finished ({s['aborted']} aborted) in {s['makespan_s']:.2f} s "
        f"{'on the engine clock' if ex else 'simulated'}; "
        f"throughput {s['throughput_req_per_s']:.2f} req/s, {s['throughput_output_tokens_per_s']:.1f} output tok/s"
    )
    if abort_line(s):
        c.print(f"[yellow]{abort_line(s)}[/]")
    c.print(
        f"preemptions: {p['recompute']} recompute ({p['recompute_forced_by_full_cpu']} forced by full CPU), {p['swap']} swap; "
        f"swapped {decimal(s['swap_out_bytes'])} out, {decimal(s['swap_in_bytes'])} in"
    )
    c.print(batch_and_kv_line(s))
    pc = s.get("prefix_cache")
    if pc:
        line = (
            f"prefix cache: hit rate {100 * pc['hit_rate_tokens']:.1f}% of prompt tokens "
            f"({100 * pc['hit_rate_blocks']:.1f}% of blocks), {pc['prefill_tokens_saved']} prefill tokens saved, "
            f"{pc['evictions']} evictions"
        )
        off = s.get("without_prefix_caching")
        if off:
            before, after = (no_exponent(x["ttft_s"]["mean"] * 1e3) for x in (s, off))
            line += f"; mean TTFT {before} ms vs {after} ms without"
        c.print(line)
    dis = s.get("disaggregation")
    if dis:
        ph = dis["phases_s"]
        c.print(
            f"disaggregated: {dis['kv_transfers']} KV transfers ({dis['kv_transfers_streamed']} streamed), "
            f"{dis['kv_transfer_bytes'] / 1e9:.2f} GB; p50 transfer wait {1e3 * ph['transfer_wait_s']['p50']:.3g} ms, "
            f"transfer {1e3 * ph['transfer_s']['p50']:.3g} ms, decode queueing {1e3 * ph['decode_queueing_s']['p50']:.3g} ms"
        )
        c.print(f"KV link: {describe_kv_link(dis['kv_link'])}")
    sx = s.get("speculation")
    if sx and sx.get("acceleration_rate") is not None:  # the same line for `sim run` and `sim exec`
        c.print(
            f"speculation ({sx['method']}, {sx['mode']}): {sx['acceleration_rate']:.2f} tokens per target step, "
            f"acceptance {sx['acceptance_rate']:.2f}"
            + (f", final s {sx['s']['final']}" if (sx.get("s") or {}).get("final") is not None else "")
        )
    c.print(f"results in {out}/ ({wall_s:.2f} s wall)")


def backend_options(args: argparse.Namespace):
    """The --backend/--workers/--address/--quiet/--no-memory-check flags `sim plan` and `sim sweep` share."""
    return BackendOptions(
        backend=args.backend,
        workers=args.workers,
        address=args.address,
        quiet=args.quiet,
        allow_large=args.no_memory_check,
    )
