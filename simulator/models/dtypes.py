"""Storage size of the numeric formats the cost model knows."""

from __future__ import annotations

from typing import Literal

from ..errors import InfersimError

DType = Literal["fp32", "fp16", "bf16", "fp8", "int8", "int4"]

# fp8: the 8-bit floats of Hopper and Ada tensor cores (E4M3 weights, E4M3 or E5M2 KV cache)
BYTES_PER_ELEMENT: dict[str, float] = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}

_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "torch.float16": "fp16",
    "torch.bfloat16": "bf16",
    "torch.float32": "fp32",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
}


# Weight-only INT4 checkpoints (AWQ, GPTQ; vLLM runs both through its Marlin kernels from Turing on,
# GPTQ through exllama on Volta: simulator/catalog/quantization.yaml) quantise
# each group of 128 input weights with one fp16 scale and, in AWQ's asymmetric format, one 4-bit
# zero point per output column (AutoAWQ `q_group_size: 128, zero_point: true`; GPTQ's symmetric
# default drops the zero point): 0.5 + (2 + 0.5) / 128 = 0.5195 bytes per weight, stored and read.
# Checked against hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4 on Hugging Face (two
# safetensors shards, 4.68 + 1.05 = 5.73 GB): Llama-3-8B at these bytes with a 16-bit
# embedding and LM head is 5.73 GB, at a bare 0.5 bytes 5.59 GB.
# INT8 and FP8 weights carry one scale per output channel or tensor (under 0.05% at width 4096).
QUANT_GROUP_SIZE = 128
_GROUP_OVERHEAD_BYTES = {"int4": (2.0 + 0.5) / QUANT_GROUP_SIZE}


def normalize_dtype(name: str) -> str:
    key = _ALIASES.get(str(name).lower(), str(name).lower())
    if key not in BYTES_PER_ELEMENT:
        raise InfersimError(f"unknown dtype '{name}'; known: {', '.join(BYTES_PER_ELEMENT)}")
    return key


def bytes_per_element(dtype: str) -> float:
    return BYTES_PER_ELEMENT[normalize_dtype(dtype)]


def weight_bytes_per_element(dtype: str) -> float:
    """Bytes of one quantised linear weight in memory and in what a GEMM reads: the element and
    its share of the group's scale and zero point."""
    key = normalize_dtype(dtype)
    return BYTES_PER_ELEMENT[key] + _GROUP_OVERHEAD_BYTES.get(key, 0.0)


def lower_dtype_advice(dtype: str) -> str:
    """The ", or lower the dtype" of a does-not-fit refusal, left out where nothing is smaller."""
    return "" if bytes_per_element(dtype) <= min(BYTES_PER_ELEMENT.values()) else ", or lower the dtype"


def kv_dtype_for(weight_dtype: str, kv_dtype: str | None = None) -> str:
    """The KV cache's dtype: the one given, else the activations' (compute_dtype_for): 16-bit
    under FP8 and weight-only INT8 / INT4 weights, as vLLM's and SGLang's `kv_cache_dtype: auto`,
    which take the model's dtype (an FP8, AWQ or GPTQ checkpoint's `torch_dtype` is bf16 or fp16).
    An FP8 cache is opted into, as `--kv-cache-dtype fp8` does there: `serving.kv_dtype: fp8`."""
    if kv_dtype:
        return normalize_dtype(kv_dtype)
    return compute_dtype_for(normalize_dtype(weight_dtype))


def compute_dtype_for(weight_dtype: str) -> str:
    """The activations' dtype: weight-only quantisation (int8/int4) and FP8 keep 16-bit activations
    (FP8 GEMMs quantise their input per token; the residual stream stays 16-bit)."""
    return weight_dtype if weight_dtype in ("fp32", "fp16", "bf16") else "fp16"
