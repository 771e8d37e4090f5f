"""Simulator speed with pipeline parallelism, measured in one run. Writes
benchmarks/RESULTS-speed-pipeline.md.

The same request stream (vidur's Azure-conversation requests, benchmarks/vidur_azure_conv_10k.yaml:
10,000 requests at 2 req/s, Llama-2-7B, batch cap 128) simulated with pipeline_parallel 1, 2 and 4
on an A100-80GB SXM (measured NVSwitch send/recv for the stage hand-offs), each a fresh `sim run`
process (start-up included), the cases interleaved and repeated; the median wall time and the
CPU time of each are compared with PP 1's. Target: PP 2 and PP 4 within 2x of PP 1.

Usage: python benchmarks/speed_pipeline.py [--repeats 3] [--requests 10000]"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
VIDUR_YAML = HERE / "vidur_azure_conv_10k.yaml"
OUT = HERE / "RESULTS-speed-pipeline.md"
PROFILE = "a100-80gb-sxm"
STAGES = (1, 2, 4)


def workload(tmp: Path, pp: int) -> Path:
    """The vidur workload with the pipeline degree set (its trace path made absolute)."""
    wl = yaml.safe_load(VIDUR_YAML.read_text())
    wl["requests"]["trace"]["file"] = str(HERE / wl["requests"]["trace"]["file"])
    wl["hardware"] = {**wl["hardware"], "profile": PROFILE, "pipeline_parallel": pp}
    wl["name"] = f"{wl['name']}-pp{pp}"
    path = tmp / f"pp{pp}.yaml"
    path.write_text(yaml.safe_dump(wl, sort_keys=False))
    return path


def one_run(path: Path, out: Path, n: int) -> dict:
    """Wall and CPU seconds of one `sim run` process, and its summary."""
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    argv = [sys.executable, "-m", "infersim.cli.main", "run", "-w", str(path), "-o", str(out), "-q", "--no-plots"]
    subprocess.run([*argv, "-n", str(n)], check=True)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "summary": json.loads((out / "summary.json").read_text())}


def loads(avg) -> str:
    return " / ".join(f"{x:.2f}" for x in avg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=10_000)
    args = ap.parse_args()
    load0 = os.getloadavg()
    runs: dict[int, list[dict]] = {pp: [] for pp in STAGES}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        paths = {pp: workload(tmp, pp) for pp in STAGES}
        for r in range(args.repeats):
            for pp in STAGES:  # interleaved: a busy spell on the machine slows every case alike
                runs[pp].append(one_run(paths[pp], tmp / f"run-pp{pp}-{r}", args.requests))
                print(f"pp {pp} repeat {r}: {runs[pp][-1]['wall_s']:.2f} s wall", file=sys.stderr)
    load1 = os.getloadavg()
    wall = {pp: statistics.median(x["wall_s"] for x in runs[pp]) for pp in STAGES}
    cpu = {pp: statistics.median(x["cpu_s"] for x in runs[pp]) for pp in STAGES}
    rows = []
    for pp in STAGES:
        s = runs[pp][0]["summary"]
        pipe = s.get("pipeline", {}).get("replicas", [{}])[0]
        bubble = f"{100 * pipe['bubble_fraction']:.1f}%" if pipe else "-"
        each = ", ".join(f"{x['wall_s']:.2f}" for x in runs[pp])
        rows.append(
            f"| {pp} | {wall[pp]:.2f} s ({each}) | {cpu[pp]:.2f} s "
            f"| {wall[pp] / wall[1]:.2f}x | {cpu[pp] / cpu[1]:.2f}x | {s['iterations']:,} | {s['makespan_s']:.1f} s "
            f"| {s['throughput_output_tokens_per_s']:.0f} | {bubble} |"
        )
    worst = max(wall[pp] / wall[1] for pp in STAGES)
    worst_cpu = max(cpu[pp] / cpu[1] for pp in STAGES)
    text = f"""# Simulator speed with pipeline parallelism

Produced by `python benchmarks/speed_pipeline.py` ({platform.machine()}, {os.cpu_count()} cores,
Python {platform.python_version()}). The same {args.requests:,} requests (vidur's Azure-conversation
stream, `benchmarks/vidur_azure_conv_10k.yaml`: Poisson 2 req/s, Llama-2-7B, batch cap 128) on one
{PROFILE} replica of 1, 2 and 4 pipeline stages; each run a fresh `sim run` process (start-up
included), the cases interleaved, {args.repeats} repeats, median shown. Load average (1/5/15 min)
at the start: {loads(load0)}, at the end: {loads(load1)}
(other processes on the machine slow every row alike; CPU time is the steadier measure).

| pipeline stages | wall time (runs) | CPU time | wall vs PP 1 | CPU vs PP 1 | iterations | simulated makespan | output tok/s | bubble |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Slowest pipelined case: {worst:.2f}x PP 1's wall time, {worst_cpu:.2f}x its CPU time (target: within 2x).
A pipelined replica runs one scheduler per stage (vLLM's virtual engines), so it simulates PP
times as many iterations of 1/PP the batch; its decode steps are issued on the stage timeline one
by one (the engines' steps interleave on the stages), without a simulation event each, where
PP 1 costs a whole run of decode steps in one vectorised call.
"""
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
