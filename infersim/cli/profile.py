"""`sim profile`: measure this machine's torch device and write a hardware profile (peaks,
bandwidths, host link, fitted per-operator-class efficiencies) plus a sidecar with the
measured curves and the step-time regressors; see docs/profiling.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from infersim.executor.profiler.run import ProfileOptions, RefitOptions, print_report, refit_profile, run_profile
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import check_out_file
from infersim.simulator.validation import check_seed, check_threads, in_field

from .commands import COMMANDS


def add_parser(sub) -> None:
    p = sub.add_parser(
        "profile",
        help=COMMANDS["profile"].help,
        description="Micro-benchmarks (GEMMs over catalog shapes, attention, norms and activations, memory streams, "
        "host<->device copies) and whole-iteration step times of small transformers on the torch device; "
        "fits achieved roofs, per-operator-class efficiencies, overheads and the host link into a "
        "HardwareProfile YAML, compares eight regressors x polynomial degree 1..5 on held-out step times "
        "(AdaptiveLLM 3.2) and keeps the best in a sidecar <out>.calib.json whose sha256 the YAML records. "
        "Use the result anywhere a hardware profile is named: --hardware PATH, or hardware.profile in a "
        "workload (cost_model: roofline for the calibrated roofline, regression for the step-time model).",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N or auto (default cpu)")
    p.add_argument("--quick", action="store_true", help="a smaller sweep (under 2 minutes on a 2-core CPU)")
    p.add_argument(
        "--out", default=None, help="profile YAML to write, the sidecar beside it (required, except with --refit)"
    )
    p.add_argument(
        "--refit",
        metavar="PROFILE",
        default=None,
        help="fit a measured profile again from the measurements in its sidecar (fits, regressors; the "
        "held-out checks are measured again) and write it to --out (default: in place)",
    )
    p.add_argument("--name", default=None, help="profile name (default: the file name)")
    p.add_argument(
        "--dtype", default=None, help="dtype of the sweeps: fp32, fp16, bf16 (default fp32 on cpu, fp16 on cuda)"
    )
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2; 0 leaves torch's default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the step-sweep sampling and held-out split (default 0)")
    p.add_argument("--no-validate", action="store_true", help="skip the held-out swap and recompute checks")
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME",
        help="also fit this served model's own recompute predictor and check its swaps (repeatable; a "
        "zoo name such as zoo-target or a checkpoint folder, run through the executor)",
    )
    p.add_argument(
        "--models-only",
        action="store_true",
        help="with --refit: measure only the --model predictors into the profile, keep the rest",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or tables")
    p.add_argument("--force", action="store_true", help="replace --out (and its sidecar) if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_seed(args.seed, "--seed")
    check_threads(args.threads, zero_ok=True)
    try:
        import sklearn  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        raise InfersimError(f'the profiler needs PyTorch and scikit-learn ({exc}): pip install ".[executor]"')

    if args.models_only and not args.refit:
        raise InfersimError("--models-only goes with --refit PROFILE.yaml")
    if args.out:
        in_place = args.refit is not None and Path(args.out).resolve() == Path(args.refit).resolve()
        check_out_file(args.out, (".yaml", ".yml"), option="--out", force=args.force or in_place)
    from infersim.executor.models import resolve_model_path

    for name in args.model:  # before the sweep, not after it
        in_field("", "--model", resolve_model_path, name)

    if args.refit:
        # a refit keeps the profile's own device, dtype and name: a flag that asks for others would be ignored
        given = [
            flag for flag, value in (("--device", args.device), ("--dtype", args.dtype), ("--name", args.name)) if value
        ]
        if given:
            raise InfersimError(
                f"{given[0]} is for a new profile; --refit keeps {args.refit}'s own device, dtype and name "
                f"(measure a new one with --out PROFILE.yaml)"
            )
        refit = RefitOptions(
            out=Path(args.out) if args.out else None,
            seed=args.seed,
            validate=not args.no_validate,
            quick=args.quick or None,
            threads=args.threads or None,
            models=tuple(args.model),
            models_only=args.models_only,
            quiet=args.quiet,
        )
        result = refit_profile(Path(args.refit), refit)
        if not args.quiet:
            print_report(result)
        return 0
    if not args.out:
        raise InfersimError("--out PROFILE.yaml is required (or --refit PROFILE.yaml)")
    opts = ProfileOptions(
        out=Path(args.out),
        device=args.device or "cpu",
        quick=args.quick,
        name=args.name,
        threads=args.threads or None,
        seed=args.seed,
        dtype=args.dtype,
        validate=not args.no_validate,
        quiet=args.quiet,
        models=tuple(args.model),
    )
    result = run_profile(opts)
    if not args.quiet:
        print_report(result)
    return 0
