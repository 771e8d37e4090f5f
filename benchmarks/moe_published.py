"""Mixtral-8x7B served by vLLM, as vLLM's nightly performance benchmark published it, against
the simulator's prediction of the same run. Writes benchmarks/RESULTS-moe-published.md (the
table docs/moe-and-fp8.md quotes).

    python benchmarks/moe_published.py [--out benchmarks/RESULTS-moe-published.md]

The measurement: vLLM's latency test (benchmarks/benchmark_latency.py in the vLLM repository),
one batch of 8 prompts of 32 tokens, each generating 128 tokens, bf16 weights (the checkpoint's
dtype), tensor parallel 2; the reported number is the mean end-to-end latency of the batch.
Published on vLLM's Buildkite performance dashboard (pages cited per row below). The
prediction: the same batch as a burst of 8 requests, run by `sim` on the card's calibrated
profile and on its datasheet roofline (`NAME:datasheet`)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from infersim.simulator.simulation import simulate
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import WorkloadSpec

ROOT = Path(__file__).resolve().parents[1]

BUILDS = "https://buildkite.com/vllm/performance-benchmark/builds/"
# (test, card profile, published mean latency in ms, source page); the dense tests ran in the
# same jobs and show how much of the error is the card's, not the experts'
PUBLISHED = [
    ("mixtral8x7B_tp2", "h200", 1917.44, BUILDS + "9515"),
    ("mixtral8x7B_tp2", "h200", 1921.1, BUILDS + "9513"),
    ("mixtral8x7B_tp2", "a100-80gb-sxm", 3643.84, BUILDS + "9523"),
    ("llama8B_tp1", "h200", 833.421, BUILDS + "9515"),
    ("llama8B_tp1", "a100-80gb-sxm", 1579.27, BUILDS + "9523"),
    ("llama70B_tp4", "h200", 2077.53, BUILDS + "9515"),
    ("llama70B_tp4", "a100-80gb-sxm", 3990.59, BUILDS + "9523"),
]
BATCH, PROMPT, OUTPUT = 8, 32, 128

# The dense models of the same runs (Llama-3.1-8B, Llama-3-70B), not in the catalog: their
# config.json fields (meta-llama/Llama-3.1-8B and Meta-Llama-3-70B on Hugging Face)
_LLAMA3 = {"model_type": "llama", "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "bfloat16"}
DENSE = {
    "llama8B_tp1": dict(
        _LLAMA3,
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        intermediate_size=14336,
        max_position_embeddings=131072,
    ),
    "llama70B_tp4": dict(
        _LLAMA3,
        hidden_size=8192,
        num_hidden_layers=80,
        num_attention_heads=64,
        intermediate_size=28672,
        max_position_embeddings=8192,
    ),
}


def model_for(test: str, folder: Path) -> str:
    if test not in DENSE:
        return "mixtral-8x7b"
    path = folder / test / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(DENSE[test]))
    return str(path)


def latency_test(model: str, profile: str, tp: int) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {
            "name": "vllm-latency-test",
            "model": model,
            "hardware": {"profile": profile, "tensor_parallel": tp},
            "serving": {"dtype": "bf16", "max_batch_size": BATCH},
            "requests": {
                "count": BATCH,
                "arrival": {"type": "burst"},
                "prompt_tokens": {"type": "fixed", "value": PROMPT},
                "output_tokens": {"type": "fixed", "value": OUTPUT},
            },
            "seed": 0,
        }
    )


def predicted_latency_ms(model: str, profile: str, tp: int) -> float:
    spec = latency_test(model, profile, tp)
    result = simulate(spec, build_requests(spec, "."))
    return float(np.max(result.requests["finish_s"])) * 1e3


def table() -> str:
    lines = [
        "| test | card (vLLM run) | published (ms) | predicted, calibrated (ms) | error "
        "| predicted, datasheet (ms) | error |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory() as folder:
        for test, profile, measured, url in PUBLISHED:
            model, tp = model_for(test, Path(folder)), int(test.rsplit("_tp", 1)[1])
            cal = predicted_latency_ms(model, profile, tp)
            sheet = predicted_latency_ms(model, f"{profile}:datasheet", tp)
            lines.append(
                f"| {test} | {profile} ([run]({url})) | {measured:,.0f} | {cal:,.0f} | {100 * (cal / measured - 1):+.1f}% "
                f"| {sheet:,.0f} | {100 * (sheet / measured - 1):+.1f}% |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS-moe-published.md")
    args = parser.parse_args()
    body = table()
    text = (
        "# Mixtral-8x7B: vLLM's published latency test against the simulator\n\n"
        "Produced by `python benchmarks/moe_published.py`. vLLM latency test: 8 prompts of 32 tokens, "
        "128 output tokens each, bf16, mean end-to-end latency of the batch; the dense tests of the "
        "same runs beside it.\n\n"
        f"{body}\n"
    )
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
