"""Sweep throughput against workers. Writes benchmarks/RESULTS-sweep-scaling.md.

The same grid (examples/sweep/small-kv.yaml x a 16-configuration policy grid, 2000 requests
each) is swept from scratch with 1 worker (in process), then with 2, 4, ... local worker
processes up to the core count, and optionally on a local Ray instance (--ray). Every sweep
is a fresh `sim sweep` process into an empty folder, so start-up and pool start-up are
included. Throughput = configurations per second of wall time; the ratio is against 1 worker.

Usage: python benchmarks/sweep_scaling.py [--repeats 5] [--ray] [--workers 1,2] [--wait-for-cores 1.8]"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKLOAD = ROOT / "examples" / "sweep" / "small-kv.yaml"
SPACE = """\
name: scaling
method: grid
parameters:
  serving.scheduler: [fcfs, fairness]
  serving.preemption: [recompute, cost_aware]
  serving.max_batch_size: [8, 16, 32, 64]
fixed: {requests.count: 2000}
"""
CONFIGS = 16


def _burn(seconds: float) -> float:
    t0, c0 = time.perf_counter(), time.process_time()
    x = 0
    while time.perf_counter() - t0 < seconds:
        x += 1
    return time.process_time() - c0


def available_cores(seconds: float = 2.0) -> float:
    """CPU seconds per wall second that `cores` busy processes get right now: the number of
    cores this benchmark can actually use while other work shares the machine."""
    from concurrent.futures import ProcessPoolExecutor

    n = len(os.sched_getaffinity(0))
    with ProcessPoolExecutor(n) as ex:
        return sum(ex.map(_burn, [seconds] * n)) / seconds


def sweep_once(space: Path, workers: int, backend: str) -> tuple[float, float]:
    """Wall time of a sweep from scratch, and of the same command again (nothing left to
    simulate: the fixed cost of start-up, reading the results and writing the table)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "infersim.cli.main",
            "sweep",
            "-w",
            str(WORKLOAD),
            "-s",
            str(space),
            "-o",
            str(Path(tmp) / "s"),
            "--workers",
            str(workers),
            "--backend",
            backend,
            "-q",
            "--no-plots",
        ]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        n = len(list((Path(tmp) / "s" / "results").glob("*.json")))
        assert n == CONFIGS, n
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=ROOT)
        fixed = time.perf_counter() - t0
    return wall, fixed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workers", default=None, help="comma-separated worker counts (default 1,2,4.. up to cores)")
    ap.add_argument("--ray", action="store_true", help="also sweep on a local Ray instance with all cores")
    ap.add_argument("--out", type=Path, default=HERE / "RESULTS-sweep-scaling.md")
    ap.add_argument(
        "--wait-for-cores",
        type=float,
        default=None,
        help="wait (up to 30 min) until this many cores are free before measuring",
    )
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    if args.wait_for_cores:
        deadline = time.monotonic() + 1800
        while (got := available_cores()) < args.wait_for_cores and time.monotonic() < deadline:
            print(f"waiting: {got:.2f} cores free", flush=True)
            time.sleep(30)
    counts = (
        [int(x) for x in args.workers.split(",")]
        if args.workers
        else sorted({1, *[w for w in (2, 4, 8, 16, 32) if w <= cores], cores})
    )
    with tempfile.TemporaryDirectory() as tmp:
        space = Path(tmp) / "space.yaml"
        space.write_text(SPACE)
        cases = [("local", w) for w in counts] + ([("ray (local instance)", cores)] if args.ray else [])
        walls: dict = {c: [] for c in cases}
        fixed: dict = {c: [] for c in cases}
        load_before = os.getloadavg()[0]
        avail_before = available_cores()
        print(f"cores available: {avail_before:.2f} of {cores}", flush=True)
        # interleaved (1, 2, ..., 1, 2, ...) so that other load on the machine hits every case alike;
        # the best of the repeats is the least disturbed measurement
        for r in range(args.repeats):
            for backend, w in cases:
                wall, fix = sweep_once(space, w, "ray" if backend.startswith("ray") else "local")
                walls[(backend, w)].append(wall)
                fixed[(backend, w)].append(fix)
                print(f"{backend}, {w} workers: {wall:.2f} s (fixed part {fix:.2f} s)", flush=True)
        load_after = os.getloadavg()[0]
        avail_after = available_cores()
        rows = [(b, w, min(walls[(b, w)]), walls[(b, w)], min(fixed[(b, w)])) for b, w in cases]
    base = rows[0][2]
    base_sim = rows[0][2] - rows[0][4]
    lines = [
        f"# Sweep scaling ({date.today().isoformat()}, {platform.machine()}, {cores} cores, "
        f"Python {platform.python_version()})",
        "",
        f"Produced by `{' '.join(['python benchmarks/sweep_scaling.py', *sys.argv[1:]])}`: the same "
        f"{CONFIGS}-configuration grid (scheduler x preemption x batch limit on `examples/sweep/small-kv.yaml`, "
        "2000 requests per configuration) swept from scratch in a fresh `sim sweep` process, start-up "
        f"included; best of {args.repeats} interleaved runs (all runs listed). Load average of the machine "
        f"(1 min) {load_before:.1f} before and {load_after:.1f} after; {cores} busy processes got "
        f"{avail_before:.2f} cores before and {avail_after:.2f} after (other work shares this machine: "
        "no speed-up can exceed the cores actually available).",
        "",
        "| backend | workers | wall time (best) | configurations/s | speed-up vs 1 worker | fixed part | "
        "speed-up of the simulating part | all runs (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for backend, w, best, runs, fix in rows:
        lines.append(
            f"| {backend} | {w} | {best:.2f} s | {CONFIGS / best:.2f} | **{base / best:.2f}x** | {fix:.2f} s | "
            f"{base_sim / max(best - fix, 1e-9):.2f}x | {', '.join(f'{x:.2f}' for x in runs)} |"
        )
    lines += [
        "",
        "1 worker runs in the driver process (no pool); more workers are a ProcessPoolExecutor "
        "(fork). *Fixed part*: the same command run again when every result exists (start-up, imports, "
        "reading the results, writing the table), best of the repeats; the last column divides the "
        "wall times less that part. The ideal ratio for w workers is w; besides the fixed part, what "
        "is lost is the pool's start-up and the last configurations finishing unevenly. Ray adds its "
        "own start-up (a local instance is started and stopped by every run).",
        "",
    ]
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
