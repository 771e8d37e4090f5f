"""A transformer's shape, as the cost model needs it, with derived sizes.

One `ModelSpec` describes every supported decoder-only family; the family-specific parts
(gated vs plain MLP, biases, tied embeddings, learned positions, partial rotary, a parallel
attention/MLP block) are explicit fields so the parameter count follows from the fields alone."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from ..validation import STRICT_CONFIG
from .dtypes import bytes_per_element, compute_dtype_for, normalize_dtype, weight_bytes_per_element
from .mla import MLASpec
from .moe import MoESpec


class ModelSpec(BaseModel):
    model_config = ConfigDict(**STRICT_CONFIG, frozen=True)

    name: str
    aliases: tuple[str, ...] = ()  # other spellings the catalog resolves (HF ids); a tuple keeps the spec hashable
    family: Literal[
        "llama",
        "mistral",
        "qwen",
        "qwen2",
        "phi",
        "opt",
        "gpt2",
        "gpt_neox",
        "mixtral",
        "qwen2_moe",
        "qwen3_moe",
        "deepseek_v2",
        "deepseek_v3",
    ]
    source: str = Field(description="where the shape numbers come from (config.json URL, paper table)")
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_heads: PositiveInt
    num_kv_heads: Optional[PositiveInt] = None  # GQA/MQA; None means num_heads
    head_dim: Optional[PositiveInt] = None  # None means hidden_size / num_heads
    intermediate_size: PositiveInt
    vocab_size: PositiveInt
    max_position_embeddings: PositiveInt = 2048
    mlp: Literal["gated", "plain"] = "gated"  # gated: up+gate+down (SwiGLU); plain: fc1+fc2
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    attention_bias: bool = False  # biases on q/k/v/o
    o_proj_bias: Optional[bool] = Field(
        None, description="bias on the attention output projection; None: as attention_bias (Qwen biases q/k/v only)"
    )
    mlp_bias: bool = False
    tied_embeddings: bool = False
    lm_head_bias: bool = Field(False, description="a bias on the untied output projection (phi)")
    learned_positions: bool = False
    position_offset: int = 0  # OPT stores max_position_embeddings + 2 position rows
    qk_norm: bool = False  # per-head RMSNorm of queries and keys (Qwen3)
    rotary_fraction: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="share of each query and key head the rotary embedding rotates (config.json "
        "partial_rotary_factor, GPT-NeoX rotary_pct); the rest passes through unrotated",
    )
    parallel_block: bool = Field(
        False,
        description="attention and MLP both read the layer input and the layer returns "
        "input + attention + MLP (phi, GPT-J, GPT-NeoX use_parallel_residual); false: the MLP reads "
        "the attention block's output",
    )
    shared_block_norm: bool = Field(
        False,
        description="with parallel_block, attention and MLP read one input norm (phi, GPT-J: one norm "
        "per layer); false: each has its own (GPT-NeoX)",
    )
    moe: Optional[MoESpec] = Field(None, description="mixture-of-experts layers; None: every MLP is dense")
    mla: Optional[MLASpec] = Field(None, description="multi-head latent attention; None: multi-/grouped-query")
    published_params: Optional[float] = None
    published_active_params: Optional[float] = None
    published_params_source: Optional[str] = None
    default_dtype: str = "fp16"

    @model_validator(mode="after")
    def _check_heads(self):
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) is not divisible by num_heads ({self.num_heads})")
        if self.shared_block_norm and not self.parallel_block:
            raise ValueError("shared_block_norm needs parallel_block: a sequential block normalises twice")
        if self.lm_head_bias and self.tied_embeddings:
            raise ValueError("lm_head_bias needs an untied lm_head (tied_embeddings: false)")
        return self

    # ---- shape helpers ---------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.dim_head

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.dim_head

    def kv_heads_per_gpu(self, tensor_parallel: int) -> int:
        """KV heads each tensor-parallel rank holds: kv_heads / tp, or one replicated head
        when tp exceeds kv_heads (as vLLM shards a GQA model over more GPUs than KV heads)."""
        return max(1, self.kv_heads // int(tensor_parallel))

    def kv_dim_per_gpu(self, tensor_parallel: int) -> int:
        return self.kv_heads_per_gpu(tensor_parallel) * self.dim_head

    def kv_elements_per_layer_per_gpu(self, tensor_parallel: int) -> int:
        """Cached values per token per layer on one rank: K and V of its heads, or MLA's latent
        (kept whole on every rank)."""
        if self.mla is not None:
            return self.mla.latent_width
        return 2 * self.kv_dim_per_gpu(tensor_parallel)

    @property
    def has_o_proj_bias(self) -> bool:
        """Whether the attention output projection carries a bias (o_proj_bias, else attention_bias)."""
        return self.attention_bias if self.o_proj_bias is None else self.o_proj_bias

    @property
    def norms_per_layer(self) -> int:
        """Input and post-attention norm; one when a parallel block shares its input norm."""
        return 1 if self.shared_block_norm else 2

    @property
    def moe_layers(self) -> int:
        return 0 if self.moe is None else self.moe.moe_layer_count(self.num_layers)

    @property
    def dense_layers(self) -> int:
        return self.num_layers - self.moe_layers

    def sparse_layers_in(self, start: int, stop: int) -> int:
        """Sparse (mixture-of-experts) layers among layers start .. stop - 1."""
        return 0 if self.moe is None else sum(self.moe.is_moe_layer(i) for i in range(start, stop))

    # ---- parameter counts ------------------------------------------------------------
    def params_attention_per_layer(self) -> int:
        h = self.hidden_size
        if self.mla is not None:
            return self.mla.params_attention(h, self.num_heads)
        weights = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        qkv_bias = (self.q_dim + 2 * self.kv_dim) if self.attention_bias else 0
        o_bias = h if self.has_o_proj_bias else 0
        return weights + qkv_bias + o_bias

    def params_mlp_per_layer(self) -> int:
        h, i = self.hidden_size, self.intermediate_size
        n_in = 2 if self.mlp == "gated" else 1
        weights = n_in * h * i + i * h
        bias = (n_in * i + h) if self.mlp_bias else 0
        return weights + bias

    def params_norm(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    def params_per_layer(self) -> int:
        """A dense layer's parameters (attention, dense MLP, norms)."""
        return (
            self.params_attention_per_layer() + self.params_mlp_per_layer() + self.norms_per_layer * self.params_norm()
        )

    def _params_layers(self, moe_mlp: int) -> int:
        norms = self.norms_per_layer * self.params_norm() + (2 * self.dim_head if self.qk_norm else 0)
        shared = self.params_attention_per_layer() + norms
        return self.num_layers * shared + self.dense_layers * self.params_mlp_per_layer() + self.moe_layers * moe_mlp

    def _params_outside_layers(self) -> int:
        return self.params_embedding() + self.params_norm() + self.params_lm_head()  # the final norm

    def params_embedding(self) -> int:
        tok = self.vocab_size * self.hidden_size
        pos = (self.max_position_embeddings + self.position_offset) * self.hidden_size if self.learned_positions else 0
        return tok + pos

    def params_lm_head(self) -> int:
        if self.tied_embeddings:
            return 0
        return self.vocab_size * (self.hidden_size + (1 if self.lm_head_bias else 0))

    def params_total(self) -> int:
        gated = self.mlp == "gated"
        moe_mlp = self.moe.params_layer(self.hidden_size, gated) if self.moe else 0
        return self._params_layers(moe_mlp) + self._params_outside_layers()

    def params_active_per_token(self) -> int:
        """Parameters one token's forward pass uses: all of a dense model; for a mixture of
        experts, its top-k routed experts, the router and the shared experts of each sparse layer."""
        gated = self.mlp == "gated"
        moe_mlp = self.moe.params_layer_active(self.hidden_size, gated) if self.moe else 0
        return self._params_layers(moe_mlp) + self._params_outside_layers()

    # ---- bytes -----------------------------------------------------------------------
    def params_edges(self) -> int:
        """The embedding table, final norm and LM head: kept in 16 bits by a quantised checkpoint."""
        return self._params_outside_layers()

    def edge_bytes_per_element(self, dtype: str) -> float:
        # FP8 and weight-only INT8/INT4 quantise the decoder layers' linear weights only: vLLM's
        # quantisation methods apply to linear layers, so the embedding and LM head keep the
        # activations' 16 bits
        return bytes_per_element(compute_dtype_for(normalize_dtype(dtype)))

    def weight_bytes(self, dtype: str | None = None) -> float:
        dtype = dtype or self.default_dtype
        edges = self.params_edges()
        return (self.params_total() - edges) * weight_bytes_per_element(dtype) + edges * self.edge_bytes_per_element(
            dtype
        )

    def weight_bytes_per_gpu(self, tensor_parallel: int, dtype: str | None = None) -> float:
        """Weights on one tensor-parallel rank: 1/tp of the model, plus the K and V projection
        columns (and biases) of KV heads replicated when tp exceeds kv_heads."""
        tp = int(tensor_parallel)
        if self.mla is not None:  # the latent projections (kv_a, and q_a when present) are replicated on every rank
            replicated = self.mla.latent_width + (self.mla.q_lora_rank or 0)
            extra = self.num_layers * (tp - 1) * self.hidden_size * replicated
        else:
            extra_columns = 2 * (self.kv_dim_per_gpu(tp) * tp - self.kv_dim)
            extra = self.num_layers * extra_columns * (self.hidden_size + (1 if self.attention_bias else 0))
        dtype = dtype or self.default_dtype
        return (self.weight_bytes(dtype) + extra * weight_bytes_per_element(dtype)) / tp

    def layer_weight_bytes_per_gpu(self, tensor_parallel: int, dtype: str | None = None) -> tuple[float, float]:
        """One dense and one sparse decoder layer's weights on one rank; over the model's layers
        they add up to `weight_bytes_per_gpu` less the edges. A sparse layer holds all its
        experts, router and shared experts (1/tp of them, as E/EP whole experts under expert
        parallelism); every layer its attention, norms and replicated projections."""
        tp, dtype = int(tensor_parallel), dtype or self.default_dtype
        layers = self.weight_bytes_per_gpu(tp, dtype) - self.edge_weight_bytes_per_gpu(tp, dtype)
        extra = 0.0
        if self.moe is not None:
            sparse_mlp = self.moe.params_layer(self.hidden_size, self.mlp == "gated")
            extra = (sparse_mlp - self.params_mlp_per_layer()) * weight_bytes_per_element(dtype) / tp
        dense = (layers - self.moe_layers * extra) / self.num_layers
        return dense, dense + extra

    def edge_weight_bytes_per_gpu(self, tensor_parallel: int, dtype: str | None = None) -> float:
        """The embedding, final norm and LM head's share of `weight_bytes_per_gpu`."""
        dtype = dtype or self.default_dtype
        return self.params_edges() * self.edge_bytes_per_element(dtype) / int(tensor_parallel)

    def bytes_kv_per_token(self, dtype: str | None = None) -> float:
        """K and V of one token across all layers (GQA-aware; MLA's latent)."""
        return self.num_layers * self.kv_elements_per_layer_per_gpu(1) * bytes_per_element(dtype or self.default_dtype)

    def bytes_kv_per_block(self, block_size: int, dtype: str | None = None) -> float:
        return block_size * self.bytes_kv_per_token(dtype)

    def bytes_kv_per_token_per_gpu(self, tensor_parallel: int, dtype: str | None = None) -> float:
        """K and V of one token on one tensor-parallel rank (replicated heads counted on each)."""
        per_layer = self.kv_elements_per_layer_per_gpu(tensor_parallel)
        return self.num_layers * per_layer * bytes_per_element(dtype or self.default_dtype)

    def bytes_kv_per_block_per_gpu(self, block_size: int, tensor_parallel: int, dtype: str | None = None) -> float:
        return block_size * self.bytes_kv_per_token_per_gpu(tensor_parallel, dtype)

    def summary(self, dtype: str | None = None) -> dict:
        dtype = dtype or self.default_dtype
        return {
            "name": self.name,
            "family": self.family,
            "params": self.params_total(),
            "weight_bytes": self.weight_bytes(dtype),
            "kv_bytes_per_token": self.bytes_kv_per_token(dtype),
            "dtype": dtype,
        }
