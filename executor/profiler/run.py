"""`sim profile`: measure the torch device, fit, and write a hardware profile + sidecar.

Stages: GEMM sweep (catalog projection and MLP shapes x token counts) and dtype probes ->
memory streams -> attention (prefill and decode) -> norms and activations -> host<->device
copies -> whole-iteration step times of small transformers -> fits (roofs, efficiencies,
overheads, host link) -> the eight regressors x five degrees per step kind -> held-out swap
and recompute checks -> `<out>.yaml` (a HardwareProfile) and `<out>.calib.json` (the curves,
the regressors, the checks), the YAML recording the sidecar's SHA-256."""

from __future__ import annotations

import datetime as _dt
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from infersim.simulator.calibration.calibrate import shapes_path
from infersim.simulator.costmodel.calibration_file import (
    CALIB_FORMAT,
    CALIB_VERSION,
    HASH_KEY,
    PATH_KEY,
    SOURCE_KEY,
    calibration_for,
    sha256_file,
)
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.hardware.profile import HardwareProfile
from infersim.simulator.metrics.rundir import StagedFiles, staged_files
from infersim.simulator.models.catalog import load_model
from infersim.simulator.paths import hwprofiles_dir
from infersim.simulator.progress import ProgressBar
from infersim.simulator.yamlio import validate

from . import accuracy, regress
from . import fit as F
from .accuracy import SWAP_MODELS_FULL, SWAP_MODELS_QUICK, SWAP_TOKENS_FULL, SWAP_TOKENS_QUICK
from .device import Repeats, device_info, load_average, make_timer, select_device
from .kernels import (
    Bench,
    attention_plan,
    attention_sweep,
    copy_plan,
    copy_reference_plan,
    copy_sweep,
    elementwise_plan,
    elementwise_sweep,
    gemm_plan,
    gemm_sweep,
    model_gemm_shapes,
    stream_sweep,
)
from .permodel import ModelSettings, profile_models, progress_total
from .regress import error_table
from .steps import Arch, step_plan, step_sweep

# --quick: each stage's wall-clock budget (s) and the points it measures whatever the clock
# says; an idle 2-core machine never reaches them, a busy one drops the tail of each sweep
QUICK_BUDGETS = {
    "gemm": (12.0, 12),
    "dtype_probes": (4.0, 2),
    "stream": (4.0, 2),
    "attention": (6.0, 6),
    "elementwise": (5.0, 8),
    "copy": (6.0, 6),
    "swap_check": (6.0, 1),
    "recompute_check": (8.0, 2),
}
QUICK_GEMM_MODELS = ("opt-125m", "opt-1.3b", "llama-7b")
FULL_GEMM_MODELS = ("opt-125m", "llama-160m", "opt-1.3b", "llama-7b", "llama-13b", "llama-2-70b")


@dataclass
class ProfileOptions:
    out: Path
    device: str = "cpu"
    quick: bool = False
    name: str | None = None
    threads: int | None = 2
    seed: int = 0
    dtype: str | None = None  # None: fp32 on cpu, fp16 on cuda
    validate: bool = True
    quiet: bool = False
    models: tuple[str, ...] = ()  # --model: served models whose own predictors are measured (permodel.py)


def sidecar_path(profile_path: Path) -> Path:
    """`x.yaml` -> `x.calib.json` beside it."""
    p = Path(profile_path)
    stem = p.name[: -len(p.suffix)] if p.suffix in (".yaml", ".yml") else p.name
    return p.with_name(stem + ".calib.json")


class _Progress(ProgressBar):
    """Counts profiling steps; the total grows when a stage takes more than planned."""

    def __init__(self, quiet: bool, total: int):
        super().__init__("profiling", quiet=quiet, total=total, fields="{task.fields[label]}", transient=True, label="")
        self.done = 0

    def __call__(self, label: str) -> None:
        self.done += 1
        if self.done > self.total:
            self.total = self.done
            self.update(total=self.total)
        self.update(completed=self.done, label=label)


def _plans(device_type: str, quick: bool, dtype: str) -> dict:
    cuda = device_type == "cuda"
    models = [load_model(m) for m in (QUICK_GEMM_MODELS if quick else FULL_GEMM_MODELS)]
    tokens = (1, 8, 32, 128, 512) if quick else (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    if cuda:
        tokens = (1, 16, 128, 1024, 4096) if quick else tokens + (4096, 8192)
    max_flops = (3e9 if quick else 6e10) * (1000 if cuda else 1)
    if cuda:
        probes = {"fp32": [(4096, 4096, 4096, "probe")], "bf16": [(4096, 4096, 4096, "probe")]}
    else:
        probes = {
            "bf16": [(128, 2048, 2048, "probe"), (512, 2048, 2048, "probe")],
            "fp16": [(16, 256, 256, "probe"), (64, 256, 256, "probe")],
        }
    probes.pop(dtype, None)
    stream = (
        [256 << 20, 1 << 30]
        if cuda
        else ([64 << 20, 256 << 20] if quick else [64 << 20, 128 << 20, 256 << 20, 512 << 20])
    )
    attn_caps = (2e10 if quick else 2e11) * (1000 if cuda else 1), (1 << 30)
    steps = step_plan(quick)
    if cuda:
        steps = _cuda_steps(steps)
    return {
        "gemm": gemm_plan(model_gemm_shapes(models), list(tokens), max_flops),
        "probes": probes,
        "stream": stream,
        "attention": attention_plan(quick),
        "attn_caps": attn_caps,
        "elementwise": elementwise_plan(quick),
        "copy": copy_plan(device_type, quick),
        "steps": steps,
        "swap_points": sum(
            len(SWAP_TOKENS_QUICK if quick else SWAP_TOKENS_FULL)
            for _ in (SWAP_MODELS_QUICK if quick else SWAP_MODELS_FULL)
        ),
    }


def _cuda_steps(p):
    """On a GPU the small transformers are launch-bound; wider and longer sweeps cost little."""
    return replace(
        p,
        hidden=tuple(sorted(set(p.hidden) | {1024, 2048})),
        prefill_tokens=(8, 2048),
        prefill_batch=(1, 32),
        prefill_max_batched=16384,
        decode_batch=(1, 256),
        max_kv_bytes=8 << 30,
    )


def _repeats(device_type: str, quick: bool) -> Repeats:
    if quick:
        return Repeats(warmup=1, min_repeats=3, max_repeats=10, target_s=0.03)
    return Repeats(warmup=2, min_repeats=5, max_repeats=30, target_s=0.2)


def _slim(records: list[dict]) -> list[dict]:
    keep = (
        "kind",
        "op",
        "op_class",
        "phase",
        "m",
        "k",
        "n",
        "dtype",
        "batch",
        "q_tokens",
        "context",
        "heads",
        "head_dim",
        "tokens",
        "width",
        "direction",
        "variant",
        "pinned",
        "size_bytes",
        "layers",
        "hidden",
        "flops",
        "bytes",
        "median_s",
        "p10_s",
        "p90_s",
        "min_s",
        "max_s",
        "repeats",
        "spread",
        "achieved_flops",
        "achieved_bytes",
        "sentinel_s",
    )
    out = []
    for r in records:
        d = {k: r[k] for k in keep if k in r}
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = F.sig(v, 6)
        out.append(d)
    return out


def build_hardware_dict(meta: dict, fits: dict, iteration_s: float) -> dict:
    """The hardware profile's YAML dict. `meta`: name, info, mode, when, load, device_type (as
    analyze takes it); `fits`: roofs, dtype_peaks, efficiency, host_link (as the sidecar keeps
    them); `iteration_s`: the fitted per-iteration overhead."""
    info, device_type = meta["info"], meta["device_type"]
    roof, eff = fits["roofs"], fits["efficiency"]
    sig = F.sig
    machine = _machine_text(info, device_type)
    return {
        "name": meta["name"],
        "aliases": [],
        "source": _profile_source(meta, machine),
        "peak_tflops": _peak_tflops(fits["dtype_peaks"], roof["dtype"]),
        "memory_bandwidth_gbps": sig(roof["memory_bytes_per_s"] / 1e9),
        "memory_gb": sig(info["memory_gb"], 3),
        **({"memory_visible_gib": info["memory_visible_gib"]} if "memory_visible_gib" in info else {}),
        **({"compute_capability": info["compute_capability"]} if "compute_capability" in info else {}),
        "device": "cpu" if device_type == "cpu" else "gpu",
        "host_link": _host_link_entry(fits["host_link"], device_type),
        "efficiency": _efficiency_entries(eff, roof["dtype"]),
        "overheads": {
            "status": "measured",
            "kernel_launch_us": sig(eff["kernel_launch_s"] * 1e6, 3),
            "iteration_us": sig(iteration_s * 1e6, 3),
            "source": "kernel launch: fitted jointly with the efficiencies; iteration: fitted to the "
            "whole-iteration step times on top of the calibrated roofline",
        },
        "sources": {
            "peak_tflops": f"achieved: {roof['compute_source']} (and best GEMM per dtype probe)",
            "memory_bandwidth_gbps": f"achieved: {roof['memory_source']}",
            "memory_gb": "host memory (/proc/meminfo)" if device_type == "cpu" else "torch.cuda.get_device_properties",
            **(
                {"memory_visible_gib": "torch.cuda.get_device_properties (total_memory)"}
                if "memory_visible_gib" in info
                else {}
            ),
            **(
                {"compute_capability": "torch.cuda.get_device_properties (major.minor)"}
                if "compute_capability" in info
                else {}
            ),
            "measured_on": meta["when"],
            "machine": machine,
            "torch": info["torch"],
        },
    }


def _machine_text(info: dict, device_type: str) -> str:
    """The measuring machine in words: the CPU and host memory, or the card and its host."""
    if device_type == "cpu":
        return f"{info['name']} ({info['host_cores']} cores, {info['host_memory_gb']} GB)"
    return f"{info['name']} ({info['memory_gb']} GB) in a host with {info['host_cpu']}"


def _profile_source(meta: dict, machine: str) -> str:
    """The profile's `source`: the command, when and where it ran, and the load meanwhile."""
    info, load = meta["info"], meta["load"]
    load_txt = (
        f"1-minute load average {load['start']:.2f} at start, {load['end']:.2f} at end"
        if load.get("start") is not None
        else "load average unknown"
    )
    return (
        f"measured by `sim profile{' --quick' if meta['mode'] == 'quick' else ''} --device {info['device']}` on "
        f"{meta['when']} on {machine}, torch {info['torch']} with {info['threads']} "
        f"thread{'s' if info['threads'] != 1 else ''}; {load_txt}. Peaks are the achieved "
        f"roofs (best GEMM FLOP/s per dtype, best streaming bytes/s), not datasheet figures."
    )


def _peak_tflops(peaks: dict, dtype: str) -> dict:
    peak_tflops = {k: F.sig(v / 1e12) for k, v in sorted(peaks.items())}
    if "fp16" not in peak_tflops:  # the schema wants one; without a measurement, the primary dtype's
        peak_tflops["fp16"] = peak_tflops[dtype]
    return peak_tflops


def _efficiency_entries(eff: dict, dtype: str) -> dict:
    """Per operator class measured, its fitted efficiencies clamped to the schema's range;
    communication unmeasured on a single device."""
    effs = {}
    for c in ("linear", "attention", "elementwise"):
        e = eff["classes"].get(c)
        if e is None:
            continue
        effs[c] = {
            "compute": F.sig(min(max(e["compute"], F.EFF_MIN), F.EFF_MAX), 3),
            "memory": F.sig(min(max(e["memory"], F.EFF_MIN), F.EFF_MAX), 3),
            "source": f"fitted to {e['n']} {c} micro-benchmarks ({dtype}) in log time; roofline MAPE "
            f"{e['mape']:.1f}%, median predicted/measured {e['median_ratio']:.2f} (uncalibrated "
            f"{e['mape_uncalibrated']:.1f}%, {e['median_ratio_uncalibrated']:.2f})",
        }
    effs["communication"] = {"compute": 1.0, "memory": 1.0, "source": "not measured (single device)"}
    return effs


def _host_link_entry(link: dict, device_type: str) -> dict:
    """The fitted host link: bandwidth per direction, the two directions' mean latency."""
    sig = F.sig
    return {
        "name": (
            "host memcpy (CPU: no host link; plain buffer copies)"
            if device_type == "cpu"
            else f"host link (measured, {link['variant']} host memory)"
        ),
        "h2d_gbps": sig(link["h2d_gbps"]),
        "d2h_gbps": sig(link["d2h_gbps"]),
        "latency_us": sig(max(0.0, (link["h2d_latency_us"] + link["d2h_latency_us"]) / 2), 3),
        "source": f"latency + bytes/bandwidth fitted to {link['fits']['h2d']['n']} copies per direction "
        f"({link['variant']}), MAPE h2d {link['fits']['h2d']['mape']:.1f}%, "
        f"d2h {link['fits']['d2h']['mape']:.1f}%",
    }


def dump_profile_yaml(data: dict, header: str = "") -> str:
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
    return header + text


def run_profile(opts: ProfileOptions, console=None) -> dict:
    import torch

    out = Path(opts.out).expanduser()
    if out.suffix not in (".yaml", ".yml"):
        raise InfersimError(f"--out {out}: a profile is a .yaml file")
    device, dtype = _device_and_dtype(opts)
    t_start = time.perf_counter()
    la0 = load_average()
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    info = device_info(device)
    plans = _plans(device.type, opts.quick, dtype)
    total = _progress_total(plans, opts)
    torch.manual_seed(opts.seed)
    timings: dict[str, float] = {}
    with _Progress(opts.quiet, total) as progress, profile_files(out) as staged:
        b = Bench(
            device=device,
            timer=make_timer(device),
            dtype=dtype,
            rep=_repeats(device.type, opts.quick),
            progress=progress,
        )
        run = _ProfileRun(opts, device, dtype, plans, b, _Stages(b, QUICK_BUDGETS if opts.quick else {}, timings))
        sent, validation, steps = _sweeps(run)
        meta = _profile_meta(run, staged, info, when, la0)
        hw_dict, hw, calib, comps = analyze(b.records, steps, meta, seed=opts.seed, progress=progress, timings=timings)
        calib["sentinels"] = sent
        _held_out_checks(run, hw, calib, validation)
        _served_models(run, hw, calib, progress)

        la1 = load_average()
        calib["load_average"]["end"] = la1[0] if la1 else None
        calib["timings_s"] = {**timings, "total": round(time.perf_counter() - t_start, 2)}
        # the final load average goes into the YAML's source as well
        hw_dict["source"] = build_hardware_dict({**meta, "load": calib["load_average"]}, calib, 0.0)["source"]
        return _written(staged, hw_dict, calib, comps, calib["timings_s"])


def profile_files(out: Path):
    """The files of one profile staged together (staged_files): the measured GEMM table and
    the sidecar, then the YAML that names both. Fits and cost models built before the commit
    read the staged table; an interrupted run leaves the previous profile's three files as
    they were, or none."""
    out = Path(out)
    return staged_files(shapes_path(out), sidecar_path(out), out)


def _device_and_dtype(opts: ProfileOptions):
    """The torch device (torch's threads set as asked) and the profile's dtype: fp32 on the CPU,
    fp16 on CUDA unless --dtype says otherwise."""
    import torch

    device = select_device(opts.device)
    if opts.threads:
        torch.set_num_threads(int(opts.threads))
    dtype = opts.dtype or ("fp32" if device.type == "cpu" else "fp16")
    if dtype not in ("fp32", "fp16", "bf16"):
        raise InfersimError(f"--dtype {dtype}: use fp32, fp16 or bf16")
    return device, dtype


def _progress_total(plans: dict, opts: ProfileOptions) -> int:
    """The progress bar's planned steps: every sweep's points, the regressors and the checks."""
    sp = plans["steps"]
    n_attn = len(plans["attention"]["heads"]) * (len(plans["attention"]["prefill"]) + len(plans["attention"]["decode"]))
    total = (
        len(plans["gemm"])
        + sum(len(v) for v in plans["probes"].values())
        + 2 * len(plans["stream"])
        + n_attn
        + len(plans["elementwise"])
        + len(plans["copy"])
        + 2 * sp.points_per_shape * len(sp.layers) * len(sp.hidden)
        + 2 * 8 * 5
        + ((plans["swap_points"] + (8 if opts.quick else 36)) * (1 if opts.quick else 5) if opts.validate else 0)
    )
    if opts.models:
        total += progress_total(opts.models, opts.quick)
    return total


class _Stages:
    """Runs a profile's stages, each under its --quick budget (QUICK_BUDGETS), and records
    each one's wall time and skipped points in `timings`."""

    def __init__(self, b: Bench, budgets: dict, timings: dict[str, float]):
        self.b, self.budgets, self.timings = b, budgets, timings

    def __call__(self, name: str, fn):
        b = self.b
        t0 = time.perf_counter()
        budget, min_points = self.budgets.get(name, (None, 0))
        b.deadline = None if budget is None else t0 + budget
        b.min_points, skipped = min_points, b.skipped
        r = fn()
        b.deadline = None
        self.timings[name] = round(time.perf_counter() - t0, 2)
        if b.skipped > skipped:
            self.timings[f"{name}_skipped_points"] = b.skipped - skipped
        return r


@dataclass(frozen=True)
class _ProfileRun:
    """What every stage of one `sim profile` run shares."""

    opts: ProfileOptions
    device: object  # torch.device measured
    dtype: str  # the profile's primary dtype
    plans: dict  # what each sweep measures (_plans)
    b: Bench  # the timer, repeats and records of every measurement
    stage: _Stages


def _sweeps(run: _ProfileRun) -> tuple[dict, dict, list[dict]]:
    """The measurements, in the order they are taken: (sentinels, held-out swap check, step times)."""
    b, stage, plans, opts = run.b, run.stage, run.plans, run.opts
    sent = {"start": stage("sentinels_start", lambda: accuracy.sentinels(b))}
    _micro_benchmarks(run)
    validation: dict = {}
    if opts.validate:  # right after the copy sweep, before the bandwidth has time to wander
        link_now = F.fit_host_link(b.records, run.device.type)
        validation["swap"] = stage(
            "swap_check",
            lambda: accuracy.swap_check(
                b, link_now, quick=opts.quick, copy_reference_s=_copy_reference(b.records, run.device.type)
            ),
        )
    step_sentinel = accuracy.step_sentinel(b)
    steps = stage("steps", lambda: step_sweep(b, plans["steps"], seed=opts.seed, sentinel=step_sentinel))
    sent["after_sweeps"] = stage("sentinels_after_sweeps", lambda: accuracy.sentinels(b))
    return sent, validation, steps


def _micro_benchmarks(run: _ProfileRun) -> None:
    """GEMMs, dtype probes, memory streams, attention, elementwise ops and host copies, into the records."""
    b, stage, plans = run.b, run.stage, run.plans
    stage("gemm", lambda: gemm_sweep(b, plans["gemm"]))
    stage(
        "dtype_probes",
        lambda: [
            gemm_sweep(b, [(m, k, n, f"{dt} {lab}") for m, k, n, lab in pl], dtype=dt)
            for dt, pl in plans["probes"].items()
        ],
    )
    stage("stream", lambda: stream_sweep(b, plans["stream"]))
    stage("attention", lambda: attention_sweep(b, plans["attention"], *plans["attn_caps"]))
    stage("elementwise", lambda: elementwise_sweep(b, plans["elementwise"]))
    stage("copy", lambda: copy_sweep(b, plans["copy"]))


def _profile_meta(run: _ProfileRun, staged: StagedFiles, info: dict, when: str, la0) -> dict:
    """What analyze takes besides the measurements (the GEMM table goes to its staged file);
    the load average's end is read now."""
    sp, out = run.plans["steps"], staged.main
    return {
        "name": run.opts.name or out.stem,
        "info": info,
        "mode": "quick" if run.opts.quick else "full",
        "when": when,
        "load": {"start": la0[0] if la0 else None, "end": (load_average() or [None])[0]},
        "device_type": run.device.type,
        "dtype": run.dtype,
        "domain": {**sp.domain(), "max_kv_bytes": sp.max_kv_bytes},
        "shapes_path": staged.path(shapes_path(out)).resolve(),
    }


def _held_out_checks(run: _ProfileRun, hw, calib: dict, validation: dict) -> None:
    """The held-out recompute check (AdaptiveLLM 4.5) beside the swap check, and the machine's
    drift since the sweeps."""
    if not run.opts.validate:
        return
    b, stage = run.b, run.stage
    # right after the step sweep and the fits
    validation["recompute"] = stage(
        "recompute_check", lambda: accuracy.recompute_check(b, hw, calib, quick=run.opts.quick)
    )
    validation["sentinels"] = stage("sentinels_validation", lambda: accuracy.sentinels(b))
    calib["validation"] = validation
    _note_drift(calib)


def _served_models(run: _ProfileRun, hw, calib: dict, progress) -> None:
    """The served models' own predictors (AdaptiveLLM 3.2-3.3), after the generic ones."""
    opts = run.opts
    if not opts.models:
        return
    settings = ModelSettings(run.device, run.dtype, quick=opts.quick, seed=opts.seed)
    calib["per_model"] = run.stage(
        "models",
        lambda: profile_models(
            opts.models, settings, hardware=hw, calibration=calib, progress=progress, timer=run.b.timer
        ),
    )


def _note_drift(calib: dict) -> None:
    ref = accuracy.reference_sentinels(calib)
    v = calib.get("validation")
    if ref and v and v.get("sentinels"):
        v["drift"] = accuracy.drift(ref, v["sentinels"])


def _copy_reference(records: list[dict], device_type: str) -> float | None:
    """The copy sweep's reference copies (kernels.copy_reference_plan), the swap check's drift
    reference."""
    plan = {(d, label, n) for d, label, _, n in copy_reference_plan(device_type)}
    ts = [
        r["median_s"]
        for r in records
        if r.get("kind") == "copy" and (r.get("direction"), r.get("variant"), r.get("size_bytes")) in plan
    ]
    return float(np.mean(ts)) if ts else None


def analyze(
    records: list[dict], steps: list[dict], meta: dict, *, seed: int = 0, progress=None, timings: dict | None = None
) -> tuple[dict, object, dict, dict]:
    """Fits and regressors from measurements: (profile dict, HardwareProfile, sidecar dict,
    regressor comparisons). `meta`: name, info, mode, when, load, device_type, dtype, domain and
    shapes_path (where the measured GEMM table goes)."""
    timings = {} if timings is None else timings
    t0 = time.perf_counter()
    fits = _roofline_fits(records, meta)
    hw_dict = _with_kernel_models(build_hardware_dict(meta, fits, 0.0), records, meta)
    hw, step_fit = _fit_step_overhead(hw_dict, steps, meta["dtype"])
    timings["fit"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    regression = _step_regressors(steps, seed, progress)
    timings["regress"] = round(time.perf_counter() - t0, 2)
    calib = _sidecar(meta, fits, records, steps, step_fit, regression)
    return hw_dict, hw, calib, regression.comparisons


def _roofline_fits(records: list[dict], meta: dict) -> dict:
    """The achieved roofs, per-dtype peaks, per-class efficiencies and host link, as the sidecar keeps them."""
    dtype = meta["dtype"]
    roof = F.roofs(records, dtype)
    peaks = F.dtype_peaks(records)
    eff = F.fit_efficiencies(records, roof["compute_flops"], roof["memory_bytes_per_s"], dtype)
    link = F.fit_host_link(records, meta["device_type"])
    return {"roofs": roof, "dtype_peaks": peaks, "efficiency": eff, "host_link": link}


def _with_kernel_models(hw_dict: dict, records: list[dict], meta: dict) -> dict:
    """The profile dict with its fitted kernel models (when the sweeps allow a fit); the
    measured GEMM table written now, since the cost models built on this profile read it."""
    dtype = meta["dtype"]
    source = f"`sim profile` micro-benchmarks on {meta['info']['name']} ({dtype})"
    shapes = meta.get("shapes_path")
    fitted = F.fit_kernel_models(
        records, validate(HardwareProfile, hw_dict, "measured profile"), dtype, source, shapes and str(shapes)
    )
    if fitted is None:
        return hw_dict
    calibration, table = fitted
    if table is not None:
        table.write(Path(shapes), source, dtype)
    return _with_calibration(hw_dict, calibration)


@dataclass(frozen=True)
class _StepFit:
    """The step sweep scored with the roofline, before and after the iteration overhead."""

    arch: dict  # the step sweep's tiny architecture (steps.Arch)
    roofline_step_error: dict  # MAPE uncalibrated, calibrated without and with the overhead, n


def _fit_step_overhead(hw_dict: dict, steps: list[dict], dtype: str) -> tuple[object, _StepFit]:
    """Fit the per-iteration overhead to the step times (written into `hw_dict`) and the
    validated profile; the roofline's step error without calibration, without the overhead
    and with it."""
    hw0 = validate(HardwareProfile, hw_dict, "measured profile")
    arch = Arch().as_dict()
    err_no_iter, preds = F.step_roofline_error(steps, hw0, arch, dtype)
    iteration_s = F.fit_iteration_overhead(steps, preds)
    hw_dict["overheads"]["iteration_us"] = F.sig(iteration_s * 1e6, 3)
    hw = validate(HardwareProfile, hw_dict, "measured profile")
    err_after, _ = F.step_roofline_error(steps, hw, arch, dtype)
    uncal = {
        **{k: v for k, v in hw_dict.items() if k != "calibration"},
        "efficiency": {},
        "overheads": {"kernel_launch_us": 0, "iteration_us": 0},
    }
    err_uncal, _ = F.step_roofline_error(steps, validate(HardwareProfile, uncal, "uncalibrated"), arch, dtype)
    errors = {
        "uncalibrated_mape": err_uncal,
        "calibrated_no_iteration_overhead_mape": err_no_iter,
        "calibrated_mape": err_after,
        "n": len(steps),
    }
    return hw, _StepFit(arch, errors)


@dataclass(frozen=True)
class _StepRegression:
    """The step-time regressors compared per phase on drift-scaled step times."""

    comparisons: dict  # phase -> regress.Comparison
    sentinel_geomean_s: float | None  # the sweep's mean sentinel (None: a step without one)
    sentinels_s: list  # the sentinel timed before each step's shape


def _step_regressors(steps: list[dict], seed: int, progress) -> _StepRegression:
    """Prefill and decode regressors compared on the step sweep. The machine's speed drifts
    over a long sweep (a shared VM: +-10% over minutes); with a sentinel timed before each
    shape, every step is scaled to the sweep's mean speed."""
    sents = [r.get("sentinel_s") for r in steps]
    g = float(np.exp(np.mean(np.log(sents)))) if sents and all(sents) else None
    comps = {}
    for kind in ("prefill", "decode"):
        rows = [r for r in steps if r["phase"] == kind]
        X = np.array([[r["layers"], r["hidden"], r["tokens"], r["batch"]] for r in rows], dtype=np.float64)
        y = np.array([r["median_s"] * (g / r["sentinel_s"] if g else 1.0) for r in rows])
        comps[kind] = regress.compare(X, y, target=kind, candidates=regress.Candidates(seed=seed), progress=progress)
    return _StepRegression(comps, g, sents)


def _sidecar(
    meta: dict, fits: dict, records: list[dict], steps: list[dict], step_fit: _StepFit, regression: _StepRegression
) -> dict:
    """The calibration sidecar: the fits, the step model and its errors, the slimmed measurements."""
    g, sents = regression.sentinel_geomean_s, regression.sentinels_s
    return {
        "format": CALIB_FORMAT,
        "version": CALIB_VERSION,
        "profile": meta["name"],
        "created": meta["when"],
        "mode": meta["mode"],
        "machine": meta["info"],
        "load_average": dict(meta["load"]),
        "dtype": meta["dtype"],
        "roofs": fits["roofs"],
        "dtype_peaks": fits["dtype_peaks"],
        "efficiency": fits["efficiency"],
        "host_link": fits["host_link"],
        "step_model": {
            "arch": step_fit.arch,
            "dtype": meta["dtype"],
            "domain": meta["domain"],
            "sentinel_geomean_s": g,
            "sentinel_spread": (float(np.max(sents) / np.min(sents)) if g else None),
            "shapes": sorted({(int(r["layers"]), int(r["hidden"])) for r in steps}),
            "predictors": {k: c.portable for k, c in regression.comparisons.items()},
            "comparison": {k: c.as_dict() for k, c in regression.comparisons.items()},
        },
        "roofline_step_error": step_fit.roofline_step_error,
        "curves": _slim([r for r in records if r["kind"] != "step"]),
        "steps": _slim(steps),
    }


def _with_calibration(hw_dict: dict, calibration: dict) -> dict:
    """The profile dict with `calibration` right after `overheads` (the shipped profiles' order)."""
    out = {}
    for key, value in hw_dict.items():
        if key != "calibration":
            out[key] = value
        if key == "overheads":
            out["calibration"] = calibration
    return out


def write_profile(staged: StagedFiles, hw_dict: dict, calib: dict) -> None:
    """The sidecar and the YAML naming its hash, into their staged files (profile_files; the
    caller commits them with the measured GEMM table the fit staged), the table named by its
    final name beside the profile."""
    out = staged.main
    shapes = ((hw_dict.get("calibration") or {}).get("gemm") or {}).get("measured_shapes")
    if shapes:
        shapes["file"] = shapes_path(out).name
    side = sidecar_path(out)
    staged.path(side).write_text(json.dumps(calib, indent=1, sort_keys=False) + "\n")
    digest = sha256_file(staged.path(side))
    hw_dict["sources"][SOURCE_KEY] = side.name
    hw_dict["sources"][HASH_KEY] = digest
    try:
        inside_catalog = out.resolve().parent == hwprofiles_dir().resolve()
    except OSError:
        inside_catalog = False
    if not inside_catalog:
        hw_dict["sources"][PATH_KEY] = str(side.resolve())
    else:
        hw_dict["sources"].pop(PATH_KEY, None)
    validate(HardwareProfile, hw_dict, str(out))
    header = (
        f"# Hardware profile measured by `sim profile` ({calib['mode']}) on {calib['created']}.\n"
        f"# Machine: {hw_dict['sources']['machine']}; torch {calib['machine']['torch']}.\n"
        f"# Peaks are achieved roofs, efficiencies fitted per operator class; the sidecar\n"
        f"# {side.name} (sha256 in sources) holds the curves, step-time regressors and checks.\n"
    )
    staged.path(out).write_text(dump_profile_yaml(hw_dict, header))


def _written(staged: StagedFiles, hw_dict: dict, calib: dict, comps, timings: dict) -> dict:
    """Stage the profile and its calibration sidecar (committed when `staged` closes); what
    run_profile, refit_profile and add_models return."""
    write_profile(staged, hw_dict, calib)
    out = staged.main
    return {
        "profile": out,
        "sidecar": sidecar_path(out),
        "hardware": hw_dict,
        "calibration": calib,
        "comparisons": comps,
        "timings": timings,
    }


@dataclass(frozen=True)
class RefitOptions:
    """The settings of `sim profile --refit PROFILE`: the device, dtype and name are the
    profile's own."""

    out: Path | None = field(default=None, metadata={"help": "where the refitted profile goes; None: over PROFILE"})
    seed: int = field(default=0, metadata={"help": "seed of the regressors' splits"})
    validate: bool = field(default=True, metadata={"help": "run the held-out checks again on this machine"})
    quick: bool | None = field(default=None, metadata={"help": "quick checks; None: the profile's own mode"})
    threads: int | None = field(default=2, metadata={"help": "torch threads; None: torch's default"})
    quiet: bool = field(default=True, metadata={"help": "no progress bar"})
    models: tuple[str, ...] = field(
        default=(), metadata={"help": "served models whose own predictors are measured too (permodel.py)"}
    )
    models_only: bool = field(default=False, metadata={"help": "only measure `models`; keep the rest as it is"})


def refit_profile(path: Path, opts: RefitOptions = RefitOptions()) -> dict:
    """Fit a measured profile again from the measurements its sidecar holds (new fits and
    regressors without measuring the sweeps again); the held-out checks, which compare
    predictions with new measurements, are run again on this machine. `opts.models`: measure
    those served models' own predictors too (replacing earlier entries of the same model);
    `opts.models_only`: only that, the rest of the profile kept as it is."""
    if opts.models_only:
        if not opts.models:
            raise InfersimError("--models-only needs at least one --model NAME")
        return add_models(Path(path), opts)
    path = Path(path)
    out = Path(opts.out) if opts.out else path
    with profile_files(out) as staged:
        return _refit(path, staged, opts)


def _refit(path: Path, staged: StagedFiles, opts: RefitOptions) -> dict:
    """refit_profile into the staged files of its --out."""
    old = calibration_for(load_hardware(str(path)))
    quick = (old["mode"] == "quick") if opts.quick is None else opts.quick
    device = _profiled_device(old["machine"], opts.threads)
    records = [dict(r) for r in old["curves"]]
    steps = [dict(r) for r in old["steps"]]
    timings: dict = {}
    meta = _refit_meta(old, device, staged)
    hw_dict, hw, calib, comps = analyze(records, steps, meta, seed=opts.seed, timings=timings)
    calib["refit"] = {"at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "from": str(path)}
    if opts.validate:
        timings["validate"] = _recheck(calib, old, _RecheckOn(device, quick, hw, _copy_reference(records, device.type)))
    elif "validation" in old:
        calib["validation"] = old["validation"]
        calib["sentinels"] = old.get("sentinels", {})
    if old.get("per_model"):
        calib["per_model"] = old["per_model"]
    if opts.models:
        settings = ModelSettings(device, old["dtype"], quick=quick, seed=opts.seed)
        _merge_models(calib, _measure_models(opts.models, settings, hw, calib, opts.quiet))
    calib["timings_s"] = {**old.get("timings_s", {}), "refit": timings}
    hw_dict["source"] = load_hardware(str(path)).source
    return _written(staged, hw_dict, calib, comps, timings)


def _profiled_device(machine: dict, threads: int | None):
    """The device a profile was measured on (its kind; cuda's index left to select_device),
    with torch's threads set to `threads` (None: torch's default)."""
    import torch

    device = select_device(machine["device"].split(":")[0] if machine["device"].startswith("cuda") else "cpu")
    if threads:
        torch.set_num_threads(int(threads))
    return device


def _refit_meta(old: dict, device, staged: StagedFiles) -> dict:
    """analyze's `meta` from the sidecar: the profile's name, machine, mode and time as
    measured; the GEMM table goes to its staged file."""
    return {
        "name": old["profile"],
        "info": old["machine"],
        "mode": old["mode"],
        "when": old["created"],
        "load": old["load_average"],
        "device_type": device.type,
        "dtype": old["dtype"],
        "domain": old["step_model"]["domain"],
        "shapes_path": staged.path(shapes_path(staged.main)).resolve(),
    }


@dataclass(frozen=True)
class _RecheckOn:
    """Where and against what the held-out checks run again."""

    device: object  # torch.device of this machine
    quick: bool  # the quick checks
    hardware: object  # the refitted HardwareProfile (the recompute check's cost models)
    copy_reference_s: float | None  # the copy sweep's reference copies (the swap check's drift)


def _recheck(calib: dict, old: dict, on: _RecheckOn) -> float:
    """The sentinels, swap and recompute checks measured again into `calib` (the profile's own
    sentinels kept as the drift reference); returns the seconds they took."""
    import torch

    la = load_average()
    b = Bench(device=on.device, timer=make_timer(on.device), dtype=old["dtype"], rep=_repeats(on.device.type, on.quick))
    t0 = time.perf_counter()
    calib["sentinels"] = old.get("sentinels", {})
    now = accuracy.sentinels(b)
    calib["validation"] = {
        "sentinels": now,
        "swap": accuracy.swap_check(b, calib["host_link"], quick=on.quick, copy_reference_s=on.copy_reference_s),
        "recompute": accuracy.recompute_check(b, on.hardware, calib, quick=on.quick),
        "measured_at": calib["refit"]["at"],
        "threads": torch.get_num_threads(),
        "load_average": {"start": la[0] if la else None, "end": (load_average() or [None])[0]},
    }
    _note_drift(calib)
    return round(time.perf_counter() - t0, 2)


def _measure_models(models, settings: ModelSettings, hw, calib, quiet: bool) -> dict:
    with _Progress(quiet, progress_total(models, settings.quick)) as progress:
        return profile_models(models, settings, hardware=hw, calibration=calib, progress=progress)


def _merge_models(calib: dict, sect: dict) -> None:
    """New model entries into the sidecar's per_model section; an entry of the same model
    (same config hash and dtype) is replaced."""
    old = calib.get("per_model") or {}
    kept = {
        k: e
        for k, e in (old.get("models") or {}).items()
        if not any(
            e.get("config_hash") == n.get("config_hash") and e.get("dtype") == n.get("dtype")
            for n in sect["models"].values()
        )
    }
    calib["per_model"] = {**sect, "models": {**kept, **sect["models"]}}


def add_models(path: Path, opts: RefitOptions) -> dict:
    """Measure only the per-model predictors of `opts.models` into an existing profile (its
    sweeps, fits and checks kept): `sim profile --refit PROFILE --models-only --model NAME`."""
    path = Path(path)
    out = Path(opts.out) if opts.out else path
    if not path.is_file():
        raise InfersimError(f"{path}: --models-only needs the profile's YAML file")
    text = path.read_text()
    hw = load_hardware(str(path))
    calib = calibration_for(hw)
    device = _profiled_device(calib["machine"], opts.threads)
    with profile_files(out) as staged:
        t0 = time.perf_counter()
        settings = ModelSettings(device, calib["dtype"], quick=bool(opts.quick), seed=opts.seed)
        _merge_models(calib, _measure_models(tuple(opts.models), settings, hw, calib, opts.quiet))
        calib.setdefault("timings_s", {})["models"] = round(time.perf_counter() - t0, 2)
        hw_dict = yaml.safe_load(text)
        for k in (SOURCE_KEY, HASH_KEY, PATH_KEY):
            hw_dict.get("sources", {}).pop(k, None)
        _carry_shapes(hw, staged)
        return _written(staged, hw_dict, calib, {}, calib["timings_s"])


def _carry_shapes(hw: HardwareProfile, staged: StagedFiles) -> None:
    """A profile written elsewhere than the one it extends takes a copy of that profile's
    measured GEMM table (it names the table beside itself)."""
    cal = hw.calibration
    shapes = cal.gemm.measured_shapes if cal is not None and cal.gemm is not None else None
    target = shapes_path(staged.main)
    if shapes is not None and Path(shapes.file).resolve() != target.resolve():
        staged.path(target).write_bytes(Path(shapes.file).read_bytes())


def print_report(result: dict, console=None) -> None:
    console = console or Console()
    hw, calib = result["hardware"], result["calibration"]
    for comp in result["comparisons"].values():
        console.print(error_table(comp))
    t = Table(title=f"profile {hw['name']} ({calib['mode']}, {calib['dtype']})")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    _add_fit_rows(t, hw, calib["roofline_step_error"])
    if calib.get("validation"):
        _add_validation_rows(t, calib["validation"])
    for key, e in ((calib.get("per_model") or {}).get("models") or {}).items():
        _add_model_rows(t, key, e)
    if "total" in result["timings"]:
        t.add_row("time", f"{result['timings']['total']:.0f} s")
    console.print(t)
    console.print(f"wrote {', '.join(map(str, written_files(result)))}")


def written_files(result: dict) -> list[Path]:
    """The profile and the files it names, which travel with it: the sidecar and, when the GEMM
    fit wrote one, the measured GEMM table (a profile copied without it does not load)."""
    profile = Path(result["profile"])
    gemm = ((result["hardware"].get("calibration") or {}).get("gemm")) or {}
    shapes = (gemm.get("measured_shapes") or {}).get("file")
    return [profile, Path(result["sidecar"])] + ([profile.with_name(Path(shapes).name)] if shapes else [])


def _add_fit_rows(t: Table, hw: dict, rse: dict) -> None:
    """The profile's achieved roofs, efficiencies and overheads, and the step-time error they leave."""
    for dt, v in hw["peak_tflops"].items():
        t.add_row(f"achieved GEMM {dt}", f"{v * 1e3:.4g} GFLOP/s")
    t.add_row("achieved memory bandwidth", f"{hw['memory_bandwidth_gbps']:.4g} GB/s")
    t.add_row("copy h2d / d2h", f"{hw['host_link']['h2d_gbps']:.4g} / {hw['host_link']['d2h_gbps']:.4g} GB/s")
    for c, e in hw["efficiency"].items():
        t.add_row(f"efficiency {c} (compute / memory)", f"{e['compute']:.3g} / {e['memory']:.3g}")
    t.add_row(
        "kernel launch / iteration overhead",
        f"{hw['overheads']['kernel_launch_us']:.3g} / {hw['overheads']['iteration_us']:.3g} us",
    )
    t.add_row(
        "roofline step-time MAPE (uncalibrated -> calibrated)",
        f"{rse['uncalibrated_mape']:.1f}% -> {rse['calibrated_mape']:.1f}%",
    )


def _add_validation_rows(t: Table, v: dict) -> None:
    """The held-out swap and recompute checks, and the machine's drift between profile and checks."""
    t.add_row(
        "held-out swap MAPE (out / in / total)",
        f"{v['swap']['mape_out']:.2f}% / {v['swap']['mape_in']:.2f}% / {v['swap']['mape_swap']:.2f}%",
    )
    sw_d, rc_d = v["swap"].get("drift"), v["recompute"].get("drift")
    if sw_d or rc_d:
        t.add_row(
            "machine drift at the checks (copy / prefill sentinel, now / then)",
            f"{sw_d or float('nan'):.3f} / {rc_d or float('nan'):.3f}",
        )
        t.add_row(
            "  drift-corrected swap / recompute MAPE",
            f"{v['swap'].get('mape_swap_drift_corrected') or float('nan'):.2f}% / "
            f"{v['recompute'].get('mape_recompute_drift_corrected') or float('nan'):.2f}%",
        )
    rc = v["recompute"]
    t.add_row(
        "held-out recompute MAPE, batch 1 (regression / roofline)",
        f"{rc['mape_recompute']:.2f}% / {rc['mape_recompute_roofline']:.2f}%",
    )
    if rc.get("mape_batched_prefill") is not None:
        t.add_row("held-out batched prefill MAPE (regression)", f"{rc['mape_batched_prefill']:.2f}%")


def _add_model_rows(t: Table, key: str, e: dict) -> None:
    """A served model's own recompute predictor and its held-out recompute and swap errors."""
    rc, sw = e["recompute"], e["swap"]
    ch = rc["comparison"]["chosen"]
    t.add_row(f"{key}: recompute predictor", f"{ch['estimator']} (degree {ch['degree']})")
    t.add_row(
        "  held-out recompute MAPE (per-model / generic / roofline)",
        f"{rc['mape_recompute']:.2f}% / {rc['mape_recompute_generic'] or float('nan'):.2f}% / "
        f"{rc['mape_recompute_roofline'] or float('nan'):.2f}%",
    )
    if rc.get("mape_held_out_batched") is not None:
        t.add_row("  held-out batched prefill MAPE (per-model)", f"{rc['mape_held_out_batched']:.2f}%")
    for f, lab in (
        ("model_fit", "fitted executor swap"),
        ("link", "profile link"),
        ("bandwidth_only", "bandwidth only"),
    ):
        if f in sw["held_out_mape"]:
            m = sw["held_out_mape"][f]
            t.add_row(
                f"  held-out swap MAPE, {lab} (out / in / total)",
                f"{m['out']:.2f}% / {m['in']:.2f}% / {m['swap']:.2f}%",
            )
