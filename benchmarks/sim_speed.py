"""Simulator speed, measured side by side in one run. Writes benchmarks/RESULTS-sim-speed.md.

Cases (each a fresh `sim run` process, so start-up is included in the wall time):
  1. vidur's reference workload: 10,000 requests, Azure-conversation lengths, Poisson 2 req/s,
     Llama-2-7B on one A100, vLLM scheduler, batch cap 128 (vidur: ~45-55 s on this machine).
  2. the same in --step-mode (every decode step simulated): the ratio shows what event-jumping buys.
  3. the whole Azure conversation trace replayed at its real timestamps (needs ../shared).
  4. 1,000,000 requests: wall time and peak memory (metrics streamed to disk).

Usage: python benchmarks/sim_speed.py [--skip-million] [--repeats 3]"""
from __future__ import annotations

import argparse
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHARED_CONV = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"

MILLION_YAML = """
name: million
description: 1,000,000 short chat requests over 16 Llama-2-7B replicas (memory-boundedness check)
model: llama-2-7b
hardware: {profile: a100-80gb-pcie, replicas: 16, router: least_outstanding}
requests:
  count: 1000000
  arrival: {type: poisson, rate: 120}
  prompt_tokens: {type: lognormal, mean: 200, cv: 1.0, max: 2000}
  output_tokens: {type: lognormal, mean: 60, cv: 1.0, max: 500}
seed: 0
"""

AZURE_TRACE_YAML = f"""
name: azure-conv-replay
description: the whole Azure 2023 conversation trace at its real timestamps, Llama-2-7B on two A100s
model: llama-2-7b
hardware: {{profile: a100-80gb-pcie, replicas: 2, router: least_outstanding}}
serving: {{max_batch_size: 128}}
requests:
  trace: {{file: {SHARED_CONV}, arrival_column: TIMESTAMP, time_unit: datetime,
          prompt_column: ContextTokens, output_column: GeneratedTokens}}
  max_prompt_tokens: 3584
  max_output_tokens: 512
seed: 0
"""


def run_sim(workload: str, out: Path, extra: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one `sim run` process."""
    cmd = [sys.executable, "-m", "infersim.cli.main", "run", "-w", workload, "-o", str(out), "-q", "--no-plots", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-million", action="store_true")
    ap.add_argument("--out", type=Path, default=HERE / "RESULTS-sim-speed.md")
    args = ap.parse_args()
    vidur_yaml = str(HERE / "vidur_azure_conv_10k.yaml")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        event = [run_sim(vidur_yaml, tmp / "event", [])[0] for _ in range(args.repeats)]
        step = [run_sim(vidur_yaml, tmp / "step", ["--step-mode"])[0] for _ in range(args.repeats)]
        ev, st = statistics.median(event), statistics.median(step)
        import json

        summ = json.loads((tmp / "event" / "summary.json").read_text())
        same = (tmp / "event" / "requests.parquet").read_bytes() == (tmp / "step" / "requests.parquet").read_bytes()
        rows.append(("vidur reference: 10k Azure-conv requests, 2 req/s, Llama-2-7B, A100, batch cap 128",
                     f"{ev:.2f} s (median of {args.repeats})", f"{summ['iterations']} iterations"))
        rows.append(("same, --step-mode", f"{st:.2f} s", f"event mode is {st / ev:.1f}x faster; identical "
                     f"requests.parquet: {same}"))
        rows.append(("vidur on the same workload (issue #3, measured on this machine)", "45-55 s",
                     f"infersim is {45 / ev:.0f}-{55 / ev:.0f}x faster"))
        if SHARED_CONV.exists():
            wl = tmp / "azure.yaml"
            wl.write_text(AZURE_TRACE_YAML)
            wall, _ = run_sim(str(wl), tmp / "azure", [])
            s = json.loads((tmp / "azure" / "summary.json").read_text())
            rows.append(("whole Azure conversation trace replayed (19,366 requests, 2 replicas)", f"{wall:.2f} s",
                         f"{s['finished']} finished, {s['iterations']} iterations"))
        if not args.skip_million:
            wl = tmp / "million.yaml"
            wl.write_text(MILLION_YAML)
            wall, peak = run_sim(str(wl), tmp / "million", [])
            s = json.loads((tmp / "million" / "summary.json").read_text())
            rows.append(("1,000,000 requests, 16 replicas", f"{wall:.1f} s", f"peak RSS {peak:.0f} MiB; "
                         f"{s['finished']} finished, {s['iterations']} iterations"))
    lines = [f"# Simulator speed ({date.today().isoformat()}, {platform.machine()}, "
             f"{__import__('os').cpu_count()} cores, Python {platform.python_version()})", "",
             "Produced by `python benchmarks/sim_speed.py`; every number is one `sim run` process, start-up included.",
             "", "| case | wall time | notes |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
