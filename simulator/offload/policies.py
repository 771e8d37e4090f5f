"""KV placement policies: where the KV cache lives and, per layer, how much of it a decoding
query loads over the host link. Named in YAML (`offload.policy`) through a registry.

A policy answers only counting questions, on numpy arrays of per-sequence context lengths
(any shape), and knows nothing of SimPy or of time: the cost model turns its answers into
seconds, the serving replica into memory, and the real executor can reuse it as is.

  gpu        every KV on the GPU, nothing moves (the "Ideal" of InfiniGen Fig. 18)
  full       FlexGen: all KV in CPU memory, every layer loads all of it in fp16
  h2o        H2O: a fixed budget of tokens per sequence (default 20% of its length), the
             rest evicted for good; every layer loads the budget
  int4       FlexGen's group-wise asymmetric 4-bit KV: all tokens, 4 bits + an fp16 scale and
             minimum per group of 64, dequantized on the GPU
  infinigen  InfiniGen: layers before `start_layer` load everything; from it on, each layer
             loads the tokens whose predicted score is above max - alpha (the count from the
             sparsity data, the same for all heads), at most 20% of the KV; the prediction at
             layer i-1 costs a partial query projection (ratio 0.3) and partial scores

Quality proxies (`proxies`): the relative KV size a query attends over, and the attention
mass a best-case selection of that size keeps (see `coverage`). They are proxies, not
accuracy: they see how much KV a policy uses, not selection errors (H2O's permanent eviction,
InfiniGen's mispredictions) or quantization error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
from pydantic import BaseModel, Field, PositiveInt, ValidationError

from ..errors import InfersimError, pydantic_error_line
from ..models.dtypes import bytes_per_element, compute_dtype_for, kv_dtype_for, weight_bytes_per_element
from ..models.spec import ModelSpec
from ..registry import Registry
from ..validation import STRICT_CONFIG
from .sparsity import SparsityModel

POLICIES: Registry = Registry("offload policy")


@dataclass(frozen=True)
class KVShape:
    """The model sizes a policy counts with."""

    num_layers: int
    hidden: int
    num_heads: int
    q_dim: int
    kv_dim: int
    kv_bytes: float  # per element of the KV cache in its home format (fp16: 2)
    w_bytes: float  # per weight as stored, int4's group scales included
    a_bytes: float

    @classmethod
    def of(cls, model: ModelSpec, dtype: str = "fp16", kv_dtype: Optional[str] = None) -> "KVShape":
        act = compute_dtype_for(dtype)
        return cls(
            model.num_layers,
            model.hidden_size,
            model.num_heads,
            model.q_dim,
            model.kv_dim,
            bytes_per_element(kv_dtype_for(dtype, kv_dtype)),
            weight_bytes_per_element(dtype),
            bytes_per_element(act),
        )

    @property
    def token_layer_bytes(self) -> float:
        """K and V of one token in one layer."""
        return 2.0 * self.kv_dim * self.kv_bytes


@dataclass(frozen=True)
class Work:
    """Extra GPU work a policy adds, as the roofline counts it: per layer (arrays broadcast
    with the layer axis) FLOPs and bytes of one operator class."""

    name: str
    op_class: str
    flops: np.ndarray
    bytes: np.ndarray
    kernels: int = 1


def coverage(k, n, c, mass: float) -> np.ndarray:
    """Attention mass kept by the best k of c tokens when the n important ones hold `mass` and
    the rest is spread evenly over the others (all arrays broadcast)."""
    k, n, c = (np.asarray(x, dtype=np.float64) for x in (k, n, c))
    n = np.minimum(n, c)
    with np.errstate(divide="ignore", invalid="ignore"):
        below = mass * k / np.maximum(n, 1.0)
        above = mass + (1.0 - mass) * (k - n) / np.maximum(c - n, 1.0)
    out = np.where(k <= n, below, above)
    return np.clip(np.where(k >= c, 1.0, out), 0.0, 1.0)


class _Params(BaseModel):
    model_config = STRICT_CONFIG


class PlacementPolicy:
    """Base: all KV in CPU memory, every layer attends over every held token."""

    name = "base"
    kv_on_gpu = False
    predicts = False
    sparsity_use = "none"  # none | proxy (quality proxy only) | required (decides what is loaded)
    Params: type[BaseModel] = _Params

    def __init__(self, params, shape: KVShape, sparsity: Optional[SparsityModel] = None):
        if isinstance(params, BaseModel):
            self.params = params
        else:
            try:
                self.params = self.Params.model_validate(dict(params or {}))
            except ValidationError as exc:
                known = ", ".join(self.Params.model_fields) or "none"
                raise InfersimError(
                    pydantic_error_line(f"offload.params for policy '{self.name}' (known: {known})", exc)
                ) from None
        self.shape = shape
        self.sparsity = sparsity

    # ---- bytes ------------------------------------------------------------------------
    @property
    def fetch_bytes_per_token(self) -> float:
        """Host-link bytes per loaded token per layer."""
        return self.shape.token_layer_bytes

    @property
    def store_bytes_per_token(self) -> float:
        """Bytes per new token per layer written to CPU memory."""
        return self.shape.token_layer_bytes

    def cpu_bytes_per_token(self) -> float:
        """CPU pool bytes per cached token, all layers (for capacity)."""
        return self.shape.num_layers * self.shape.token_layer_bytes

    def gpu_bytes_per_token(self) -> float:
        """GPU bytes per cached token, all layers: a double buffer of two layers' loaded KV."""
        return 2.0 * self.shape.token_layer_bytes

    def gpu_fixed_bytes(self) -> float:
        """GPU bytes the policy needs regardless of the batch (partial weights)."""
        return 0.0

    # ---- tokens -------------------------------------------------------------------------
    def held_tokens(self, context, final) -> np.ndarray:
        """Tokens of a sequence still in the cache (attention can only see these)."""
        return np.asarray(context, dtype=np.int64)

    def attended_tokens(self, context, final) -> np.ndarray:
        """Cached tokens a decoding query attends over at each layer: shape + (layers,)."""
        h = self.held_tokens(context, final)
        return np.broadcast_to(h[..., None], h.shape + (self.shape.num_layers,))

    def stored_new_tokens(self, context, query, final) -> np.ndarray:
        """New tokens per sequence whose KV is written to CPU memory this iteration."""
        return np.asarray(query, dtype=np.int64)

    # ---- extra GPU work ----------------------------------------------------------------
    def attention_work(self, attended_total: np.ndarray, new_tokens: np.ndarray) -> list[Work]:
        """Extra work inside each layer's attention, given the attended tokens summed over
        the batch (n, layers) and the new tokens (n, 1)."""
        return []

    def prediction_work(self, decode_queries, decode_context, prefill_tokens) -> list[Work]:
        """Work done at layer i-1 to choose layer i's tokens, arrays (n, 1) summed over the
        batch; applies to layers >= `prediction_layers` start."""
        return []

    def prediction_mask(self) -> np.ndarray:
        """Layers whose KV is chosen by a prediction run in the layer before."""
        return np.zeros(self.shape.num_layers, dtype=bool)

    # ---- quality proxies ---------------------------------------------------------------
    def proxies(self, context, final=None) -> dict[str, np.ndarray]:
        """Per decoding sequence: relative KV size attended (bytes, vs all tokens in fp16) and
        attention mass kept, both averaged over layers."""
        c = np.maximum(np.asarray(context, dtype=np.int64), 1)
        fin = c + 1 if final is None else np.asarray(final, dtype=np.int64)
        att = self.attended_tokens(c, fin).astype(np.float64)
        size = (att / c[..., None]).mean(axis=-1) * self.fetch_bytes_per_token / self.shape.token_layer_bytes
        return {"relative_kv_size": size, "attention_mass": self._mass(c, fin, att).mean(axis=-1)}

    def _mass(self, c, fin, att) -> np.ndarray:
        if self.sparsity is None:
            return np.where(att >= c[..., None], 1.0, att / c[..., None])
        n = self.sparsity.tokens(c, self.shape.num_layers)
        return coverage(att, n, c[..., None], self.sparsity.important_mass)

    def describe(self) -> dict:
        return {"policy": self.name, **self.params.model_dump()}


@POLICIES.register("gpu")
@POLICIES.register("ideal")
class GpuPolicy(PlacementPolicy):
    """Everything on the GPU: no host traffic (InfiniGen's Ideal)."""

    name = "gpu"
    kv_on_gpu = True

    @property
    def fetch_bytes_per_token(self) -> float:
        return self.shape.token_layer_bytes  # proxies only: nothing crosses the link

    def cpu_bytes_per_token(self) -> float:
        return 0.0

    def gpu_bytes_per_token(self) -> float:
        return self.shape.num_layers * self.shape.token_layer_bytes

    def stored_new_tokens(self, context, query, final) -> np.ndarray:
        return np.zeros_like(np.asarray(query, dtype=np.int64))


@POLICIES.register("full")
@POLICIES.register("flexgen")
class FullOffload(PlacementPolicy):
    """FlexGen with all KV on the CPU: every layer loads every cached token in fp16."""

    name = "full"


class H2OParams(_Params):
    budget: float = Field(
        0.2,
        gt=0,
        le=1,
        description="fraction of the sequence's final length kept (InfiniGen's "
        "H2O baseline: 20%, 409 tokens at 2048)",
    )
    budget_tokens: Optional[PositiveInt] = Field(None, description="a fixed budget in tokens instead")


@POLICIES.register("h2o")
class H2OPolicy(PlacementPolicy):
    """H2O (heavy hitters + recent tokens) on FlexGen: a budget of B tokens per sequence,
    B = budget x (prompt + output) as InfiniGen's scripts set it (--max-num-kv
    (prompt_len + 128) / 5); evicted tokens are gone, so prefill stores only B tokens and every
    layer of every decode step loads min(context, B). Without the final length (a bare
    BatchShape) the sequence's current length stands in for it."""

    name = "h2o"
    sparsity_use = "proxy"
    Params = H2OParams

    def budget(self, final) -> np.ndarray:
        fin = np.asarray(final, dtype=np.int64)
        if self.params.budget_tokens is not None:
            return np.full_like(fin, self.params.budget_tokens)
        return np.maximum(1, np.floor(self.params.budget * fin + 1e-9).astype(np.int64))

    def held_tokens(self, context, final) -> np.ndarray:
        return np.minimum(np.asarray(context, dtype=np.int64), self.budget(final))

    def stored_new_tokens(self, context, query, final) -> np.ndarray:
        c, q = np.asarray(context, dtype=np.int64), np.asarray(query, dtype=np.int64)
        b = self.budget(final)
        # a decode token always lands (replacing an evicted one); a prefill keeps B tokens
        return np.where(q == 1, 1, np.minimum(c + q, b) - np.minimum(c, b))

    def gpu_bytes_per_token(self) -> float:
        return 2.0 * self.shape.token_layer_bytes * self.params.budget


class Int4Params(_Params):
    group_size: PositiveInt = Field(64, description="elements per quantization group (FlexGen's cache default)")
    bits: Literal[4] = 4
    kernels: Literal["fused", "flexgen"] = Field(
        "fused",
        description="fused: one pass reads the packed data and writes fp16 (2.56 B/element); flexgen: "
        "FlexGen's PyTorch ops (unpack by shift/and into strided halves, div_, add_: 13 B/element "
        "to dequantize, ~25 to quantize)",
    )


@POLICIES.register("int4")
class Int4Policy(PlacementPolicy):
    """FlexGen's KV compression: 4-bit asymmetric groups along the head dimension, an fp16
    scale and minimum per group: (0.5 + 4/group) bytes per element instead of 2."""

    name = "int4"
    Params = Int4Params

    @property
    def bytes_per_element(self) -> float:
        return self.params.bits / 8.0 + 4.0 / self.params.group_size

    @property
    def fetch_bytes_per_token(self) -> float:
        return 2.0 * self.shape.kv_dim * self.bytes_per_element

    @property
    def store_bytes_per_token(self) -> float:
        return self.fetch_bytes_per_token

    def cpu_bytes_per_token(self) -> float:
        return self.shape.num_layers * self.fetch_bytes_per_token

    def gpu_bytes_per_token(self) -> float:
        # two layers of packed KV in flight plus the current layer dequantized to fp16
        return 2.0 * self.fetch_bytes_per_token + self.shape.token_layer_bytes

    def _bpe(self) -> tuple[float, float]:
        packed = self.bytes_per_element
        if self.params.kernels == "fused":
            return packed + 2.0, 2.0 + packed
        return 13.0, 25.0

    def attention_work(self, attended_total, new_tokens) -> list[Work]:
        deq_bpe, q_bpe = self._bpe()
        el = 2.0 * self.shape.kv_dim * np.asarray(attended_total, dtype=np.float64)
        new = 2.0 * self.shape.kv_dim * np.asarray(new_tokens, dtype=np.float64)
        kern = 1 if self.params.kernels == "fused" else 6
        return [
            Work("dequantize", "elementwise", 4.0 * el, deq_bpe * el, kern),
            Work("quantize", "elementwise", 6.0 * new, q_bpe * new, 1 if kern == 1 else 10),
        ]


class InfiniGenParams(_Params):
    alpha: float = Field(4.0, description="score threshold max - alpha (InfiniGen: 4 for OPT, 5 for Llama-2)")
    partial_weight_ratio: float = Field(
        0.3, gt=0, le=1, description="fraction of q/k columns used to predict " "(paper 0.3; reference code 0.2)"
    )
    max_fetch_fraction: float = Field(0.2, gt=0, le=1, description="per-layer cap as a fraction of the KV (20%)")
    max_fetch_tokens: Optional[PositiveInt] = Field(None, description="a fixed cap in tokens instead")
    cap_basis: Literal["context", "final"] = Field(
        "context",
        description="the cap is a fraction of the current KV "
        "(context) or of the sequence's final "
        "length (final: the reference code's "
        "--max-num-kv (prompt + 128) / 5)",
    )
    start_layer: int = Field(
        1,
        ge=0,
        description="first layer loaded selectively (paper: 1; the reference code "
        "loads layers 0 and 1 in full, i.e. 2)",
    )
    pool_limit: Optional[float] = Field(
        None, gt=0, le=1, description="CPU pool limit as a fraction of each " "sequence's KV (InfiniGen Table 2: 0.8)"
    )
    victim: Literal["counter", "lru", "fifo"] = Field("counter", description="pool victim policy under a limit")


@POLICIES.register("infinigen")
class InfiniGenPolicy(PlacementPolicy):
    name = "infinigen"
    predicts = True
    sparsity_use = "required"
    Params = InfiniGenParams

    def __init__(self, params, shape, sparsity=None):
        super().__init__(params, shape, sparsity)
        if sparsity is None:
            raise InfersimError("offload policy 'infinigen' needs sparsity data (offload.sparsity)")
        if self.params.start_layer > shape.num_layers:
            raise InfersimError(
                f"offload.params.start_layer {self.params.start_layer} is beyond the model's "
                f"{shape.num_layers} layers"
            )

    def held_tokens(self, context, final) -> np.ndarray:
        c = np.asarray(context, dtype=np.int64)
        if self.params.pool_limit is None:
            return c
        return np.minimum(c, np.ceil(self.params.pool_limit * c - 1e-9).astype(np.int64))

    def cap(self, context, final=None) -> np.ndarray:
        c = np.asarray(context, dtype=np.int64)
        if self.params.max_fetch_tokens is not None:
            return np.full_like(c, self.params.max_fetch_tokens)
        basis = c if self.params.cap_basis == "context" or final is None else np.asarray(final, dtype=np.int64)
        return np.maximum(1, np.floor(self.params.max_fetch_fraction * basis + 1e-9).astype(np.int64))

    def attended_tokens(self, context, final) -> np.ndarray:
        c = np.asarray(context, dtype=np.int64)
        held = self.held_tokens(c, final)[..., None]
        important = np.ceil(self.sparsity.tokens(c, self.shape.num_layers) - 1e-9).astype(np.int64)
        chosen = np.minimum(np.minimum(important, self.cap(c, final)[..., None]), held)
        return np.where(self.prediction_mask(), chosen, held)

    def prediction_mask(self) -> np.ndarray:
        return np.arange(self.shape.num_layers) >= self.params.start_layer

    def cpu_bytes_per_token(self) -> float:
        return super().cpu_bytes_per_token() * (self.params.pool_limit or 1.0)

    def gpu_bytes_per_token(self) -> float:
        # the partial key cache of every layer (ratio x K: 15% of the KV at 0.3) + a double buffer
        s = self.shape
        return self.params.partial_weight_ratio * s.num_layers * s.kv_dim * s.kv_bytes + 2.0 * s.token_layer_bytes

    def gpu_fixed_bytes(self) -> float:
        s = self.shape
        return self.params.partial_weight_ratio * s.num_layers * s.hidden * s.q_dim * s.w_bytes

    def prediction_work(self, decode_queries, decode_context, prefill_tokens) -> list[Work]:
        """At layer i-1 for layer i: x @ W_q[:, partial] for each decoding query, scores of the
        partial query against the partial key cache of every cached token, then max, threshold
        and count over the scores. In prefill: column sums of |Q~| + |K~| and the partial key
        cache written (InfiniGen 4.3)."""
        s, r = self.shape, self.params.partial_weight_ratio
        D = np.asarray(decode_queries, dtype=np.float64)
        C = np.asarray(decode_context, dtype=np.float64)
        Tp = np.asarray(prefill_tokens, dtype=np.float64)
        w = [
            Work(
                "partial_q",
                "linear",
                2.0 * D * s.hidden * r * s.q_dim,
                np.where(D > 0, r * s.hidden * s.q_dim * s.w_bytes, 0.0) + D * (s.hidden + r * s.q_dim) * s.a_bytes,
            ),
            Work(
                "partial_scores",
                "attention",
                2.0 * r * s.q_dim * C,
                r * s.kv_dim * C * s.kv_bytes + s.num_heads * C * s.a_bytes,
            ),
            Work("select", "elementwise", 4.0 * s.num_heads * C, 2.0 * s.num_heads * C * s.a_bytes),
            Work(
                "partial_setup",
                "elementwise",
                3.0 * Tp * s.hidden,
                Tp * (2.0 * s.hidden * s.a_bytes + r * s.kv_dim * s.kv_bytes),
            ),
        ]
        return w

    def _mass(self, c, fin, att) -> np.ndarray:
        if self.params.pool_limit is None or self.params.victim != "fifo":
            # LRU and counter keep the tokens that keep being fetched: InfiniGen Table 2 finds
            # their perplexity equal to the unlimited pool's, so a limit costs no mass here
            return super()._mass(c, fin, att)
        # FIFO keeps the newest tokens whatever their importance: with important tokens spread
        # over positions, the pool holds h/c of the mass, and the selection works inside it
        h = self.held_tokens(c, fin).astype(np.float64)[..., None]
        n = self.sparsity.tokens(c, self.shape.num_layers)
        frac = h / c[..., None]
        return frac * coverage(att, n * frac, h, self.sparsity.important_mass)


def build_policy(name: str, params: dict | None, shape: KVShape, sparsity: Optional[SparsityModel] = None):
    return POLICIES.get(name)(params or {}, shape, sparsity)
