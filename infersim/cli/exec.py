"""`sim exec`: serve a workload on a real model (the executor) and write a run directory in
the format of `sim run`, plus per-iteration records (see executor/run.py)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from infersim.executor.options import ExecOptions
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import check_out_dir
from infersim.simulator.progress import log_line
from infersim.simulator.validation import check_threads, finite_positive, positive_int

from .commands import COMMANDS
from .run import add_memory_flag, add_out_flags, add_override_flags, finish_status, prepare, print_summary


def add_parser(sub) -> None:
    p = sub.add_parser(
        "exec",
        help=COMMANDS["exec"].help,
        description="Run a workload's requests through a real model with iteration-level batching, a paged KV "
        "cache and the same scheduler and preemption policies as `sim run`; write the same run "
        "directory plus iterations.parquet, iteration_batches.parquet and outputs.parquet. "
        'Needs `pip install ".[executor]"`.',
    )
    p.add_argument("--workload", "-w", required=True, help="built-in workload name or a workload YAML file")
    p.add_argument(
        "--model",
        "-m",
        required=True,
        help="zoo name (zoo-target, zoo-draft-a, ... built on first use; see `sim zoo list`) or a "
        "local Hugging Face checkpoint folder (config.json + *.safetensors): Llama, Mistral, OPT",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    p.add_argument("--dtype", default=None, help="fp32, fp16 or bf16 (default fp32 on cpu, fp16 on cuda)")
    add_out_flags(p, "run directory (default: runs/<workload name>-exec)", replaces=True)
    p.add_argument(
        "--fast",
        action="store_true",
        help="replay arrivals as fast as possible: skip idle waits instead of sleeping until the next "
        "arrival (default: real time)",
    )
    add_override_flags(p, model_and_hardware=False)
    p.add_argument(
        "--prefix-caching",
        choices=("on", "off"),
        default=None,
        help="override serving.prefix_caching (shared KV blocks keyed by the prompts' token ids, docs/executor.md)",
    )
    p.add_argument("--gpu-blocks", type=int, default=None, help="device KV blocks (overrides the workload)")
    p.add_argument("--cpu-blocks", type=int, default=None, help="host KV blocks for swapping (overrides the workload)")
    p.add_argument(
        "--device-memory-gb",
        type=float,
        default=None,
        help="on cpu, the memory the KV pool is planned from (default 4); refused where the pool is given in "
        "blocks (--gpu-blocks, serving.gpu_blocks)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--no-plots", action="store_true", help="skip the plots")
    p.add_argument("--csv", action="store_true", help="also write requests.csv")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or table")
    add_memory_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise InfersimError(f'the executor needs PyTorch and transformers ({exc}): pip install ".[executor]"')
    from infersim.executor.models import check_dtype_name
    from infersim.executor.run import execute

    t0 = time.perf_counter()
    if args.dtype is not None:  # before the workload: its card's dtype rules are not the executor's
        check_dtype_name(args.dtype)
    if args.threads is not None:
        torch.set_num_threads(check_threads(args.threads))
    args.model_override, args.hardware, model = None, None, args.model
    ns = argparse.Namespace(**{**vars(args), "model": None})
    sv = {}
    if args.gpu_blocks is not None:
        sv["gpu_blocks"] = positive_int(args.gpu_blocks, "--gpu-blocks")
    if args.cpu_blocks is not None:
        if args.cpu_blocks < 0:
            raise InfersimError(f"--cpu-blocks: expected a whole number >= 0, got {args.cpu_blocks}")
        sv["cpu_blocks"] = args.cpu_blocks
    if args.device_memory_gb is not None:
        finite_positive(args.device_memory_gb, "--device-memory-gb")
    spec, requests = prepare(ns, str(args.workload), serving=sv)
    _check_device_memory(args, spec)
    out = check_out_dir(args.out or Path("runs") / f"{spec.name}-exec", force=args.force, command="exec")
    log = None if args.quiet else log_line
    opts = ExecOptions(
        device=args.device,
        dtype=args.dtype,
        realtime=not args.fast,
        plots=not args.no_plots,
        csv=args.csv,
        quiet=args.quiet,
        device_memory_gb=args.device_memory_gb,
        log=log,
        force=args.force,
        source=str(args.workload),
    )
    summary = execute(spec, requests, model, out, opts)
    if not args.quiet:
        shown = spec.model_copy(update={"model": model})
        print_summary(summary, shown, out, time.perf_counter() - t0)
        ex = summary["executor"]
        print(
            f"executed {ex['model']} on {ex['device']} ({ex['dtype']}): forward {ex['forward_s']:.2f} s, "
            f"scheduling {ex['schedule_s']:.3f} s, swaps {ex['swap_s']:.3f} s"
        )
    return finish_status(summary, args.quiet)


def _check_device_memory(args: argparse.Namespace, spec) -> None:
    """--device-memory-gb sizes a CPU's KV pool from memory; refused where the run would ignore
    it: a pool given in blocks, or a CUDA device, whose own memory is used."""
    if args.device_memory_gb is None:
        return
    if args.device.startswith("cuda"):
        raise InfersimError("--device-memory-gb is for --device cpu; on cuda the GPU's own memory sizes the KV pool")
    if spec.serving.gpu_blocks is not None:
        given = "--gpu-blocks" if args.gpu_blocks is not None else f"{args.workload}'s serving.gpu_blocks"
        raise InfersimError(
            f"--device-memory-gb sizes the KV pool from memory, but {given} ({spec.serving.gpu_blocks:,}) "
            f"already gives it in blocks; leave one out"
        )
