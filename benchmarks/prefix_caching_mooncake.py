"""Mooncake's conversation trace replayed with prefix caching at several KV pool sizes: hit rate
and TTFT against the cache size. Writes the results table into docs/prefix-caching.md (between
its `results` markers) and the plot docs/prefix-caching-mooncake.png.

Every run is the built-in `replay-mooncake` workload (12,031 requests at their real timestamps,
Mistral-7B on 4x H100-SXM, hash ids as block identity) with serving.gpu_blocks set to the size
under test: the same pool holds the running requests' KV and the cached prefixes, as in vLLM.
One run has caching off (at the deployment's own pool), one has a pool larger than the trace's
distinct blocks (nothing is ever evicted).

Usage: python benchmarks/prefix_caching_mooncake.py [--requests N]"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "prefix-caching.md"
PNG = ROOT / "docs" / "prefix-caching-mooncake.png"
# GPU blocks under test; None: the pool the deployment's memory gives (4x H100-SXM)
SIZES = (16_384, 32_768, 65_536, None, 262_144, 1_048_576, 10_000_000)
UNBOUNDED = 10_000_000


def _run(requests: int | None, gpu_blocks: int | None, caching: bool) -> dict:
    from infersim.simulator.metrics.summary import summarize
    from infersim.simulator.simulation import simulate
    from infersim.simulator.workload.builder import build_requests, load_workload

    spec, path = load_workload("replay-mooncake")
    upd = {"prefix_caching": caching}
    if gpu_blocks is not None:
        upd["gpu_blocks"] = gpu_blocks
    spec = spec.model_copy(update={"serving": spec.serving.model_copy(update=upd)})
    if requests:
        spec = spec.model_copy(update={"requests": spec.requests.model_copy(update={"count": requests})})
    res = simulate(spec, build_requests(spec, path))
    s = summarize(res)
    s["gpu_blocks"] = res.memory.gpu_blocks
    return s


def _row(label: str, s: dict) -> str:
    pc = s.get("prefix_cache") or {"hit_rate_tokens": 0.0, "hit_rate_blocks": 0.0, "evictions": 0}
    t = s["ttft_s"]
    return (
        f"| {label} | {s['gpu_blocks']:,} | {100 * pc['hit_rate_blocks']:.1f}% | {100 * pc['hit_rate_tokens']:.1f}% | "
        f"{pc['evictions']:,} | {1e3 * t['mean']:.0f} | {1e3 * t['p50']:.0f} | {1e3 * t['p99']:.0f} | "
        f"{s['finished']:,} |"
    )


def _plot(points: list[tuple[int, dict]], off: dict) -> None:
    from infersim.simulator.metrics.plots import pyplot

    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
    x = [n for n, _ in points]
    a1.plot(x, [100 * s["prefix_cache"]["hit_rate_blocks"] for _, s in points], marker="o", label="blocks")
    a1.plot(x, [100 * s["prefix_cache"]["hit_rate_tokens"] for _, s in points], marker=".", ls=":", label="tokens")
    a1.set_xscale("log")
    a1.set_xlabel("KV pool (GPU blocks of 16 tokens)")
    a1.set_ylabel("prefix-cache hit rate (%)")
    a1.legend(fontsize=8)
    for key, ls in (("mean", "-"), ("p50", ":"), ("p99", "--")):
        a2.plot(x, [1e3 * s["ttft_s"][key] for _, s in points], marker="o", ls=ls, label=f"{key}, caching on")
        a2.axhline(1e3 * off["ttft_s"][key], color="grey", ls=ls, lw=1)
    a2.set_xscale("log")
    a2.set_xlabel("KV pool (GPU blocks of 16 tokens)")
    a2.set_ylabel("TTFT (ms); grey: caching off")
    a2.legend(fontsize=8)
    fig.suptitle("Mooncake conversation trace, Mistral-7B on 4x H100-SXM")
    fig.tight_layout()
    fig.savefig(PNG, metadata={"Software": None}, bbox_inches="tight")
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=None, help="replay only the first N requests")
    args = ap.parse_args()
    off = _run(args.requests, None, caching=False)
    print("caching off done", file=sys.stderr)
    points = []
    for size in SIZES:
        points.append((size, _run(args.requests, size, caching=True)))
        print(f"{points[-1][1]['gpu_blocks']} blocks done", file=sys.stderr)
    points = [(s["gpu_blocks"], s) for _, s in points]
    deployed = next(s["gpu_blocks"] for n, s in zip(SIZES, (p[1] for p in points)) if n is None)
    rows = [_row("caching off", off)]
    for n, s in points:
        label = "unbounded" if n >= UNBOUNDED else ("as deployed" if n == deployed else "")
        rows.append(_row(f"caching on{', ' + label if label else ''}", s))
    table = (
        "| run | GPU blocks | hit rate (blocks) | hit rate (tokens) | evictions | TTFT mean (ms) | p50 | p99 | finished |\n"
        "|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows)
    )
    _plot(points, off)
    text = DOC.read_text()
    new = re.sub(
        r"(<!-- results:begin -->\n).*?(\n<!-- results:end -->)", lambda m: m[1] + table + m[2], text, flags=re.S
    )
    DOC.write_text(new)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
