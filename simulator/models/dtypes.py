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


def normalize_dtype(name: str) -> str:
    key = _ALIASES.get(str(name).lower(), str(name).lower())
    if key not in BYTES_PER_ELEMENT:
        raise InfersimError(f"unknown dtype '{name}'; known: {', '.join(BYTES_PER_ELEMENT)}")
    return key


def bytes_per_element(dtype: str) -> float:
    return BYTES_PER_ELEMENT[normalize_dtype(dtype)]


def compute_dtype_for(weight_dtype: str) -> str:
    """The activations' dtype: weight-only quantisation (int8/int4) and FP8 keep 16-bit activations
    (FP8 GEMMs quantise their input per token; the residual stream stays 16-bit)."""
    return weight_dtype if weight_dtype in ("fp32", "fp16", "bf16") else "fp16"
