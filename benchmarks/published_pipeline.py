"""A published pipeline-parallel result, predicted side by side. Writes
benchmarks/RESULTS-published-pipeline.md (quoted in docs/pipeline-and-multinode.md).

Published (NVIDIA technical blog, "Boosting Llama 3.1 405B Throughput by Another 1.5x on NVIDIA
H200 Tensor Core GPUs and NVLink Switch", October 2024,
https://developer.nvidia.com/blog/boosting-llama-3-1-405b-throughput-by-another-1-5x-on-nvidia-h200-tensor-core-gpus-and-nvlink-switch/):
Llama 3.1 405B in FP8 with TensorRT-LLM on one HGX H200 (8 GPUs, NVLink Switch), tensor
parallelism across the 8 GPUs against pipeline parallelism across the 8 GPUs. At minimum latency
(one user) TP is 5.6x faster than PP; at maximum throughput PP delivers 1.5x TP's.

Predicted: the same two deployments (TP 8 x PP 1 and TP 1 x PP 8) on the `h200` profile.
Weights and KV cache are `fp8` (one byte each) and GEMMs compute at the H200's FP8 dense peak.
NVIDIA's FP8 recipe for this model (TensorRT Model Optimizer) quantises the KV cache to FP8 too
("Boosting Llama 3.1 405B Performance up to 1.44x with NVIDIA TensorRT Model Optimizer on NVIDIA
H200 GPUs", https://developer.nvidia.com/blog/boosting-llama-3-1-405b-performance-by-up-to-44-with-nvidia-tensorrt-model-optimizer-on-nvidia-h200-gpus/),
so the cache is set explicitly (`kv_dtype: fp8`); left out, it would stay 16-bit as vLLM's
`--kv-cache-dtype auto`.
The blog does not give the sequence lengths of its scenarios; the ones used here are stated in
the output.

Usage: python benchmarks/published_pipeline.py"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from infersim.simulator.simulation import simulate
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import WorkloadSpec

HERE = Path(__file__).resolve().parent
OUT = HERE / "RESULTS-published-pipeline.md"
URL = (
    "https://developer.nvidia.com/blog/boosting-llama-3-1-405b-throughput-by-another-1-5x-on-"
    "nvidia-h200-tensor-core-gpus-and-nvlink-switch/"
)
DEPLOYMENTS = {"TP 8": (8, 1), "PP 8": (1, 8)}
# (requests, prompt tokens, output tokens): one user alone, and a burst that fills every batch
MIN_LATENCY = (1, 1024, 256)
MAX_THROUGHPUT = (3000, 1024, 512)
DECODE_HEAVY = (3000, 128, 1024)  # the same burst with short prompts: prefill (priced at FP16) matters less
PUBLISHED = {"min_latency_tp_over_pp": 5.6, "max_throughput_pp_over_tp": 1.5}


def spec(tp: int, pp: int, requests: int, prompt: int, output: int) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {
            "name": f"llama-405b-h200-tp{tp}-pp{pp}",
            "model": "llama-3.1-405b",
            "hardware": {"profile": "h200", "tensor_parallel": tp, "pipeline_parallel": pp},
            "serving": {"dtype": "fp8", "kv_dtype": "fp8", "max_model_len": 4096, "max_batch_size": 256},
            "requests": {
                "count": requests,
                "arrival": {"type": "burst"},
                "prompt_tokens": {"type": "fixed", "value": prompt},
                "output_tokens": {"type": "fixed", "value": output},
            },
        }
    )


def run(tp: int, pp: int, case: tuple[int, int, int]) -> dict:
    s = spec(tp, pp, *case)
    res = simulate(s, build_requests(s, "."))
    r = res.requests
    out_tokens = float(r["output_tokens"].sum())
    tpot = float(np.mean((r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)))
    pipe = res.extra.get("pipeline", {}).get("replicas", [{}])[0]
    return {
        "tokens_per_s_per_user": 1.0 / tpot,
        "tokens_per_s_per_gpu": out_tokens / res.sim_time_s / (tp * pp),
        "bubble": pipe.get("bubble_fraction"),
        "gpu_blocks": res.memory.gpu_blocks,
    }


def error(pred: float, pub: float) -> str:
    return f"{100 * (pred - pub) / pub:+.0f}%"


def main() -> None:
    t0 = time.perf_counter()
    lat = {k: run(*v, MIN_LATENCY) for k, v in DEPLOYMENTS.items()}
    thr = {k: run(*v, MAX_THROUGHPUT) for k, v in DEPLOYMENTS.items()}
    dec = {k: run(*v, DECODE_HEAVY) for k, v in DEPLOYMENTS.items()}
    ratio_dec = dec["PP 8"]["tokens_per_s_per_gpu"] / dec["TP 8"]["tokens_per_s_per_gpu"]
    ratio_lat = lat["TP 8"]["tokens_per_s_per_user"] / lat["PP 8"]["tokens_per_s_per_user"]
    ratio_thr = thr["PP 8"]["tokens_per_s_per_gpu"] / thr["TP 8"]["tokens_per_s_per_gpu"]
    pub_lat, pub_thr = PUBLISHED["min_latency_tp_over_pp"], PUBLISHED["max_throughput_pp_over_tp"]
    n, p, o = MAX_THROUGHPUT
    text = f"""# Published pipeline-parallel result against infersim

Produced by `python benchmarks/published_pipeline.py` ({time.perf_counter() - t0:.0f} s).

Published: NVIDIA technical blog, "Boosting Llama 3.1 405B Throughput by Another 1.5x on NVIDIA
H200 Tensor Core GPUs and NVLink Switch" (October 2024), {URL}: Llama 3.1 405B, FP8, TensorRT-LLM,
one HGX H200 (8 GPUs on NVLink Switch); tensor parallelism over the 8 GPUs against pipeline
parallelism over the 8 GPUs.

Predicted: `llama-3.1-405b` on the `h200` profile (datasheet peaks, the H100's fitted GEMM and
elementwise models, datasheet NVLink for the all-reduces and the stage hand-offs), weights and KV
cache `fp8` (one byte each), GEMMs at the FP8 dense peak. The cache is set to fp8 explicitly
(`kv_dtype: fp8`): NVIDIA's TensorRT Model Optimizer FP8 recipe for this model quantises the KV
cache too ("Boosting Llama 3.1 405B Performance up to 1.44x with NVIDIA TensorRT Model Optimizer
on NVIDIA H200 GPUs", NVIDIA technical blog, August 2024); without it the cache would stay 16-bit.
Sequence lengths are not in the blog: minimum latency is one request of {MIN_LATENCY[1]:,} prompt and
{MIN_LATENCY[2]} output tokens; maximum throughput is a burst of {n:,} requests of {p:,} + {o}
tokens (batch cap 256 per scheduler; PP 8 runs 8 virtual engines).

| scenario | published | infersim | error |
|---|---|---|---|
| minimum latency: TP 8 speed over PP 8 (tokens/s per user) | {pub_lat:.1f}x | {ratio_lat:.2f}x | {error(ratio_lat, pub_lat)} |
| maximum throughput: PP 8 over TP 8 (output tokens/s per GPU) | {pub_thr:.1f}x | {ratio_thr:.2f}x | {error(ratio_thr, pub_thr)} |
| the same with {DECODE_HEAVY[1]}-token prompts, {DECODE_HEAVY[2]:,}-token outputs | {pub_thr:.1f}x | {ratio_dec:.2f}x | {error(ratio_dec, pub_thr)} |

infersim's absolute numbers behind the ratios:

| deployment | tokens/s per user, one request | output tokens/s per GPU, burst | PP bubble in the burst | output tokens/s per GPU, short prompts |
|---|---|---|---|---|
"""
    for k in DEPLOYMENTS:
        b = thr[k]["bubble"]
        text += (
            f"| {k} | {lat[k]['tokens_per_s_per_user']:.1f} | {thr[k]['tokens_per_s_per_gpu']:.0f} | "
            f"{'-' if b is None else f'{100 * b:.1f}%'} | {dec[k]['tokens_per_s_per_gpu']:.0f} |\n"
        )
    text += """
The published absolute numbers (tokens/s per user, tokens/s per GPU) are in the blog's Table 1;
the ratios above are the ones its text states.

The `h200` profile carries vLLM's engine overhead per iteration (1,720 us + 446 us per
tensor-parallel worker beyond the first: 4.84 ms at TP 8, beyond the TP 4 it was fitted at;
benchmarks/RESULTS-vllm-published.md). This run is TensorRT-LLM, whose per-iteration cost is not
measured here; the overhead shortens TP 8's lead at one request most. With no engine overhead
the three ratios were 5.23x, 1.38x and 1.55x.
"""
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
