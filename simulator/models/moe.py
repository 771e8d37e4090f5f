"""Mixture-of-experts layers: how many experts, how many each token uses, their widths, which
layers are sparse, and how many distinct experts a batch touches.

A token's router picks `experts_per_token` (top-k) of `num_experts` routed experts; shared
experts (DeepSeek, Qwen-MoE) run for every token. A batch of B tokens reads the weights of every
expert at least one of its tokens picked: under uniform routing an expert escapes one token with
probability 1 - k/E, so the expected number touched is E (1 - (1 - k/E)^B). A measured
per-expert popularity vector (`expert_popularity`, shares of the routing summing to 1) replaces
the uniform k/E by k p_e for expert e: sum_e (1 - (1 - k p_e)^B)."""

from __future__ import annotations

from typing import Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator

from ..validation import STRICT_CONFIG


class MoESpec(BaseModel):
    model_config = ConfigDict(**STRICT_CONFIG, frozen=True)

    num_experts: PositiveInt = Field(description="routed experts per MoE layer (E)")
    experts_per_token: PositiveInt = Field(description="routed experts each token uses (top-k)")
    expert_intermediate_size: PositiveInt = Field(description="intermediate width of one routed expert")
    num_shared_experts: NonNegativeInt = Field(0, description="experts every token uses (DeepSeek, Qwen-MoE)")
    shared_intermediate_size: NonNegativeInt = Field(
        0, description="intermediate width of the shared experts together (0: none), as checkpoints fuse them"
    )
    shared_expert_gate: bool = Field(False, description="a sigmoid gate (hidden -> 1) scales the shared output (Qwen)")
    first_dense_layers: NonNegativeInt = Field(
        0, description="leading layers with a dense MLP (DeepSeek first_k_dense_replace)"
    )
    layer_freq: PositiveInt = Field(1, description="after those, every layer_freq-th layer is sparse")
    layer_phase: NonNegativeInt = Field(0, description="layer i is sparse when i % layer_freq == layer_phase")
    expert_popularity: Optional[tuple[float, ...]] = Field(
        None, description="measured share of routing each expert receives (sums to 1); None: uniform"
    )
    popularity_source: str = Field("", description="where expert_popularity was measured")

    @model_validator(mode="after")
    def _check(self):
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token ({self.experts_per_token}) exceeds num_experts ({self.num_experts})")
        if self.layer_phase >= self.layer_freq:
            raise ValueError(f"layer_phase ({self.layer_phase}) must be below layer_freq ({self.layer_freq})")
        if bool(self.num_shared_experts) != bool(self.shared_intermediate_size):
            raise ValueError("num_shared_experts and shared_intermediate_size are both zero or both set")
        pop = self.expert_popularity
        if pop is not None:
            if len(pop) != self.num_experts:
                raise ValueError(f"expert_popularity has {len(pop)} entries for {self.num_experts} experts")
            if min(pop) < 0 or abs(sum(pop) - 1.0) > 1e-6:
                raise ValueError("expert_popularity entries are >= 0 and sum to 1")
            if max(pop) * self.experts_per_token > 1.0 + 1e-9:
                raise ValueError("expert_popularity gives an expert more than 1/experts_per_token of the routing")
            if not self.popularity_source:
                raise ValueError("expert_popularity needs popularity_source")
        return self

    # ---- layer pattern ---------------------------------------------------------------
    def is_moe_layer(self, index: int) -> bool:
        return index >= self.first_dense_layers and index % self.layer_freq == self.layer_phase

    def moe_layer_count(self, num_layers: int) -> int:
        return sum(self.is_moe_layer(i) for i in range(num_layers))

    # ---- parameters ------------------------------------------------------------------
    def params_expert(self, hidden: int, gated: bool = True) -> int:
        return (3 if gated else 2) * hidden * self.expert_intermediate_size

    def params_shared(self, hidden: int, gated: bool = True) -> int:
        gate = hidden if self.shared_expert_gate else 0
        return (3 if gated else 2) * hidden * self.shared_intermediate_size + gate

    def params_router(self, hidden: int) -> int:
        return hidden * self.num_experts

    def params_layer(self, hidden: int, gated: bool = True) -> int:
        """Every weight of one sparse MLP: all routed experts, the router, the shared experts."""
        return (
            self.num_experts * self.params_expert(hidden, gated)
            + self.params_router(hidden)
            + self.params_shared(hidden, gated)
        )

    def params_layer_active(self, hidden: int, gated: bool = True) -> int:
        """The weights one token's pass through a sparse MLP uses: top-k experts, router, shared."""
        return (
            self.experts_per_token * self.params_expert(hidden, gated)
            + self.params_router(hidden)
            + self.params_shared(hidden, gated)
        )

    # ---- routing -----------------------------------------------------------------------
    def pick_probabilities(self) -> np.ndarray:
        """Probability that one token's top-k includes each expert: k/E, or k times its share."""
        if self.expert_popularity is None:
            return np.full(self.num_experts, self.experts_per_token / self.num_experts)
        return np.minimum(1.0, self.experts_per_token * np.asarray(self.expert_popularity, dtype=np.float64))


def expected_distinct_experts(pick: np.ndarray, tokens) -> np.ndarray:
    """Expected experts touched by each batch of `tokens` tokens, the experts picked with
    probabilities `pick` independently per token: sum_e 1 - (1 - pick_e)^tokens. Elementwise over
    `tokens`."""
    tokens = np.asarray(tokens, dtype=np.float64)
    escape = np.log1p(-np.minimum(pick, 1.0 - 1e-15))  # log(1 - p), finite for p = 1
    return np.sum(-np.expm1(np.multiply.outer(tokens, escape)), axis=-1)
