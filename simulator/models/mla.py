"""Multi-head latent attention (DeepSeek-V2/V3): keys and values are stored as one compressed
latent per token (kv_lora_rank values plus a shared rotary key of qk_rope_head_dim), and each
head's keys and values are projected up from it. The KV cache holds the latent only, the same on
every tensor-parallel rank (as vLLM and SGLang keep it)."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from ..validation import STRICT_CONFIG


class MLASpec(BaseModel):
    model_config = ConfigDict(**STRICT_CONFIG, frozen=True)

    kv_lora_rank: PositiveInt = Field(description="width of the compressed KV latent")
    q_lora_rank: Optional[PositiveInt] = Field(None, description="width of the compressed query (None: a full q_proj)")
    qk_nope_head_dim: PositiveInt = Field(description="per-head query/key width without rotary embedding")
    qk_rope_head_dim: PositiveInt = Field(description="per-head rotary width (the rotary key is shared by heads)")
    v_head_dim: PositiveInt = Field(description="per-head value width")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_width(self) -> int:
        """Cached values per token per layer: the latent and the rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def params_attention(self, hidden: int, heads: int) -> int:
        q_width = heads * self.qk_head_dim
        if self.q_lora_rank:
            q = hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * q_width  # q_a, its norm, q_b
        else:
            q = hidden * q_width
        kv_a = hidden * self.latent_width + self.kv_lora_rank  # kv_a_proj_with_mqa and the latent's norm
        kv_b = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        o = heads * self.v_head_dim * hidden
        return q + kv_a + kv_b + o
