"""Simulator speed on a mixture-of-experts model against a dense model of about the same
active size, on the same request stream, in one run. Writes benchmarks/RESULTS-speed-moe.md.

    python benchmarks/speed_moe.py [--requests 4000] [--repeats 3]

Cases: Llama-2-13B (13.0B parameters, dense) and Mixtral-8x7B (12.9B active of 46.7B), both
on two H100 SXM with tensor parallelism, the latter also with expert parallelism 2; the same
Poisson stream of chat-sized requests (same seed). Each case runs in this process (model and
profile loading included) and is timed in wall and CPU seconds; the median of the repeats is
reported. The target: MoE within 2x of the dense model's time."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from infersim.simulator.machine import cpu_model
from infersim.simulator.simulation import simulate
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]
CASES = [
    ("llama-2-13b (dense)", "llama-2-13b", 1),
    ("mixtral-8x7b", "mixtral-8x7b", 1),
    ("mixtral-8x7b, expert parallel 2", "mixtral-8x7b", 2),
]


def workload(model: str, ep: int, requests: int) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {
            "name": "speed-moe",
            "model": model,
            "hardware": {"profile": "h100-sxm", "tensor_parallel": 2, "expert_parallel": ep},
            "serving": {"dtype": "bf16", "max_batch_size": 128},
            "requests": {
                "count": requests,
                "arrival": {"type": "poisson", "rate": 8.0},
                "prompt_tokens": {"type": "lognormal", "mean": 600, "cv": 1.0, "max": 4000},
                "output_tokens": {"type": "lognormal", "mean": 200, "cv": 1.0, "max": 1000},
            },
            "seed": 0,
        }
    )


def timed(model: str, ep: int, requests: int) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    spec = workload(model, ep, requests)
    result = simulate(spec, build_requests(spec, "."))
    return time.perf_counter() - wall, time.process_time() - cpu, int(result.metrics.counters["iterations"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS-speed-moe.md")
    args = parser.parse_args()
    load_start = os.getloadavg()
    rows, base_cpu = [], None
    for label, model, ep in CASES:
        runs = [timed(model, ep, args.requests) for _ in range(args.repeats)]
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        iterations = runs[0][2]
        base_cpu = base_cpu or cpu
        rows.append(
            f"| {label} | {wall:.2f} s | {cpu:.2f} s | {cpu / base_cpu:.2f}x | {iterations:,} "
            f"| {1e6 * cpu / iterations:.1f} us |"
        )
    load_end = os.getloadavg()
    text = "\n".join(
        [
            "# Simulator speed: mixture of experts against dense",
            "",
            f"Produced by `python benchmarks/speed_moe.py --requests {args.requests} --repeats {args.repeats}` "
            f"on {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}. "
            f"{args.requests:,} requests (Poisson 8 req/s, lognormal prompts mean 600, outputs mean 200), "
            "two H100 SXM, tensor parallel 2, bf16, the same seed in every case; medians of the repeats. "
            f"Load average (1/5/15 min) at the start: {' / '.join(f'{x:.2f}' for x in load_start)}, "
            f"at the end: {' / '.join(f'{x:.2f}' for x in load_end)}.",
            "",
            "| case | wall time | CPU time | CPU vs dense | iterations | CPU per iteration |",
            "|---|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "Target: the MoE cases within 2x of the dense model's CPU time.",
            "",
        ]
    )
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
