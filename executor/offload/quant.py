"""Group-wise asymmetric integer quantization of the KV cache (FlexGen's compression, the
INT4 baseline of InfiniGen): each group of `group_size` consecutive elements keeps a minimum
and a scale (stored in fp16, as FlexGen does) and `bits`-bit codes; dequantized on use.

The zoo target's head dimension (32) is below FlexGen's group of 64, so groups run along a
token's flattened K (or V) vector over its KV heads: with 2 KV heads x 32, one group per token
per K and per V. A group size that does not divide the flattened width is an error."""

from __future__ import annotations

import torch

from infersim.simulator.errors import InfersimError


def quantize_dequantize(
    x: torch.Tensor, group_size: int = 64, bits: int = 4, meta_dtype: torch.dtype | None = torch.float16
) -> torch.Tensor:
    """x [B, Hkv, T, d] -> the values the cache returns after a round trip through `bits`-bit
    codes (same shape and dtype). Each code is round((x - min) / scale), scale = (max - min) /
    (2^bits - 1), so the error is at most scale / 2 per element (plus the fp16 rounding of
    min and scale when meta_dtype is set)."""
    B, H, T, d = x.shape
    width = H * d
    if width % group_size:
        raise InfersimError(
            f"int4 group_size {group_size} does not divide the KV width {width} "
            f"({H} KV heads x {d}); use a divisor of {width}"
        )
    flat = x.transpose(1, 2).reshape(B, T, width // group_size, group_size).float()
    lo = flat.amin(dim=-1, keepdim=True)
    hi = flat.amax(dim=-1, keepdim=True)
    levels = float(2**bits - 1)
    scale = (hi - lo) / levels
    if meta_dtype is not None:
        lo, scale = lo.to(meta_dtype).float(), scale.to(meta_dtype).float()
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.clamp(torch.round((flat - lo) / safe), 0, levels)
    out = codes * scale + lo
    return out.view(B, T, H, d).transpose(1, 2).to(x.dtype).contiguous()


__all__ = ["quantize_dequantize"]
