"""The workload file: what to serve (model, hardware, serving config) and what arrives.

Every field has a default where a serious default exists (vLLM 0.2-0.4 era for serving), so
a workload file may be as short as a model name and a request generator."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union, get_args

from pydantic import BaseModel, Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator, model_validator

from ..disaggregation.config import DisaggregatedSection
from ..parallel.config import ClusterSection
from ..validation import MAX_SEED, MAX_TOKENS, STRICT_CONFIG, whole_number


class _Strict(BaseModel):
    model_config = STRICT_CONFIG


# A token count: int64 arithmetic must hold it (and sums of it) without overflow.
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
Column = Annotated[str, Field(min_length=1)]


class HardwareSection(_Strict):
    profile: str = Field("a100-80gb-pcie", description="hardware profile name or path to a YAML file")
    replicas: PositiveInt = 1
    tensor_parallel: PositiveInt = 1
    expert_parallel: PositiveInt = Field(
        1,
        description="GPUs the experts of a mixture-of-experts model are spread over: 1 or tensor_parallel, or "
        "with data_parallel_attention the replicas of one group",
    )
    data_parallel_attention: bool = Field(
        False,
        description="attention data-parallel: every replica is one GPU with its own requests and KV cache, and "
        "each expert_parallel replicas share their experts through dispatch/combine all-to-alls (SGLang "
        "--enable-dp-attention, vLLM --data-parallel-size with --enable-expert-parallel; docs/moe-and-fp8.md)",
    )
    two_batch_overlap: Union[bool, Literal["auto"]] = Field(
        False,
        description="with data_parallel_attention: split every rank's batch into two micro-batches whose "
        "all-to-alls overlap the other's compute; true: every step the group can split, as SGLang "
        "--enable-two-batch-overlap does; auto: only the steps the cost model prices faster split "
        "(docs/moe-and-fp8.md)",
    )
    pipeline_parallel: PositiveInt = Field(
        1, description="pipeline stages per replica: layers split over them, each stage a tensor-parallel group"
    )
    all_reduce: Optional[Literal["nccl", "custom", "auto"]] = Field(
        None,
        description="kernel of the tensor-parallel all-reduces: nccl (the profile's measured NCCL fits), custom "
        "(vLLM's and SGLang's custom all-reduce inside one NVLink node, from measured times; refused where it "
        "cannot run), auto (custom where vLLM would run it: 2, 4, 6 or 8 GPUs of one node, all NVLink-connected "
        "or only 2, messages below 8 MiB, a card with measured times; NCCL otherwise); none: the profile's own "
        "(auto in a100-80gb-sxm, h100-sxm and h200, nccl in the others) (docs/pipeline-and-multinode.md)",
    )
    cluster: Optional[ClusterSection] = Field(
        None, description="GPUs per node and the inter-node link; none: 8-GPU nodes on InfiniBand NDR"
    )
    router: str = Field("round_robin", description="router registry name: round_robin, least_outstanding")
    host_link: Optional[str] = Field(None, description="override the profile's host link, e.g. 'pcie3x16'")
    disaggregated: Optional[DisaggregatedSection] = Field(
        None, description="separate prefill and decode pools with a KV link between them (docs/disaggregation.md)"
    )

    @model_validator(mode="after")
    def _pools(self):
        if self.disaggregated is not None and (
            self.replicas != 1 or self.tensor_parallel != 1 or self.pipeline_parallel != 1
        ):
            raise ValueError(
                "with 'disaggregated', give replicas and tensor_parallel per pool (pipeline_parallel stays 1) "
                "(disaggregated.prefill, disaggregated.decode), not in hardware"
            )
        return self

    @property
    def gpus(self) -> int:
        """GPUs the deployment uses, every pool together."""
        if self.disaggregated is not None:
            return self.disaggregated.gpus
        return self.replicas * self.tensor_parallel

    @property
    def instances(self) -> int:
        """Replicas, every pool together."""
        d = self.disaggregated
        return self.replicas if d is None else d.prefill.replicas + d.decode.replicas


class ServingSection(_Strict):
    scheduler: str = Field("fcfs", description="scheduler registry name: fcfs (vLLM), fairness (AdaptiveLLM Alg. 2)")
    preemption: str = Field("recompute", description="preemption registry name: recompute, swap, cost_aware")
    chunked_prefill: bool = False
    max_batch_size: PositiveInt = 256  # vLLM max_num_seqs
    max_batched_tokens: Optional[PositiveInt] = (
        None  # None: max(max_model_len, 2048) as vLLM; chunk budget with chunked prefill
    )
    max_model_len: Optional[PositiveInt] = None  # None: the model's max_position_embeddings
    block_size: PositiveInt = 16
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    non_torch_reserve_gib: Optional[float] = Field(
        None,
        ge=0,
        le=1e6,
        description="GiB per GPU the engine's process holds outside torch's allocator (cuBLAS workspaces, NCCL "
        "buffers), kept out of the KV budget; none: vLLM's measured 0.25 GiB on a GPU, 0 on a CPU profile "
        "(simulator/engine/memory.py gives the measurements)",
    )
    gpu_blocks: Optional[PositiveInt] = None  # explicit GPU KV blocks (overrides utilisation)
    cpu_blocks: Optional[int] = Field(None, ge=0)  # explicit CPU KV blocks (overrides swap_space_gb)
    swap_space_gb: float = Field(4.0, ge=0, le=1e6)  # GiB, as vLLM's swap_space; 1e6 GiB is beyond any host
    watermark: float = Field(0.01, ge=0, lt=1)
    dtype: str = "fp16"
    kv_dtype: Optional[str] = Field(
        None,
        description="KV cache dtype; none: the weights' dtype, 16-bit under fp8, int8 and int4 weights (vLLM's and "
        "SGLang's kv_cache_dtype auto; dtypes.kv_dtype_for); fp8 stores the cache in one byte per element",
    )
    cost_model: str = Field("roofline", description="cost model registry name")
    prefix_caching: bool = Field(
        False,
        description="automatic prefix caching (vLLM's): full KV blocks are kept by the identity of their "
        "tokens and everything before them, shared between requests and after a request ends, evicted "
        "least recently used when blocks are needed; a hit skips that part of the prefill. Token identity "
        "comes from requests.trace.hash_column or requests.sharing (docs/prefix-caching.md)",
    )


class FixedDist(_Strict):
    type: Literal["fixed"]
    value: Tokens


class UniformDist(_Strict):
    type: Literal["uniform"]
    low: Tokens
    high: Tokens

    @model_validator(mode="after")
    def _order(self):
        if self.high < self.low:
            raise ValueError("high must be >= low")
        return self


class LognormalDist(_Strict):
    """Lognormal given by its mean and coefficient of variation (std/mean) in tokens."""

    type: Literal["lognormal"]
    mean: float = Field(gt=0, le=MAX_TOKENS)
    cv: PositiveFloat = 1.0
    min: Tokens = 1
    max: Optional[Tokens] = None

    @model_validator(mode="after")
    def _order(self):
        if self.max is not None and self.max < self.min:
            raise ValueError("max must be >= min")
        return self


class QuantileDist(_Strict):
    """Empirical distribution carried as its quantiles (evenly spaced from 0 to 1 unless `probs`
    gives their probabilities): a built-in workload keeps a trace's statistics, not the trace.
    Sampling interpolates the inverse CDF linearly between the given points."""

    type: Literal["quantiles"]
    values: list[Annotated[float, Field(ge=0, le=MAX_TOKENS)]] = Field(min_length=2)
    # Optional probabilities of `values` (0 first, 1 last, increasing); a finer grid in the tail
    # (e.g. ..., 0.95, 0.975, 0.99, 0.995, 0.999, 1) keeps a heavy tail's mean honest.
    probs: Optional[list[float]] = None
    source: str = ""

    @model_validator(mode="after")
    def _shape(self):
        if any(b < a for a, b in zip(self.values, self.values[1:])):
            raise ValueError("values must be non-decreasing")
        if self.probs is not None:
            p = self.probs
            if len(p) != len(self.values):
                raise ValueError("probs must have as many entries as values")
            if p[0] != 0 or p[-1] != 1 or any(b <= a for a, b in zip(p, p[1:])):
                raise ValueError("probs must increase strictly from 0 to 1")
        return self


class EmpiricalDist(_Strict):
    """Sample lengths from a column of a file (CSV/JSONL/JSON)."""

    type: Literal["empirical"]
    file: str = Field(min_length=1)
    column: Column
    format: Optional[Literal["csv", "jsonl", "json"]] = None
    # tokens: the column holds numbers; text_words: it holds text, and its word count is used
    kind: Literal["tokens", "text_words"] = "tokens"
    scale: PositiveFloat = 1.0  # multiplies the value, e.g. 1.3 for words -> tokens


LengthDist = Union[FixedDist, UniformDist, LognormalDist, QuantileDist, EmpiricalDist]


class PoissonArrivals(_Strict):
    type: Literal["poisson"]
    rate: PositiveFloat  # requests per second


class GammaArrivals(_Strict):
    type: Literal["gamma"]
    rate: PositiveFloat
    cv: PositiveFloat = 1.0  # coefficient of variation of inter-arrival times


class ClosedLoopArrivals(_Strict):
    type: Literal["closed_loop"]
    clients: PositiveInt
    think_time_s: NonNegativeFloat = 0.0


class BurstArrivals(_Strict):
    """Every request present at time 0 (offline batch, as in throughput benchmarks)."""

    type: Literal["burst"]


Arrivals = Union[PoissonArrivals, GammaArrivals, ClosedLoopArrivals, BurstArrivals]


class SharingModel(_Strict):
    """Synthetic prefix sharing (multi-turn chat): request i is the next turn of conversation slot
    i mod `conversations`. A conversation's first prompt is the shared system prompt plus a user
    message drawn from prompt_tokens; turn k's prompt is the whole previous turn (its prompt and
    its output_tokens reply) plus a new user message drawn from prompt_tokens. After `max_turns`
    turns, or when a prompt would pass max_prompt_tokens, the slot starts a new conversation."""

    conversations: PositiveInt = Field(description="conversation slots; request i continues slot i mod this")
    system_prompt_tokens: int = Field(0, ge=0, le=MAX_TOKENS, description="tokens every prompt starts with")
    max_turns: PositiveInt = Field(8, description="turns before a slot starts a new conversation")


class TraceSource(_Strict):
    """Requests replayed from a file; columns are mapped here, so any trace needs only YAML."""

    file: str = Field(min_length=1)
    format: Optional[Literal["csv", "jsonl", "json"]] = None  # None: from the file suffix
    arrival_column: Optional[Column] = None  # None: arrivals come from `arrival` below
    time_unit: Literal["s", "ms", "us", "datetime"] = "s"
    prompt_column: Optional[Column] = None
    output_column: Optional[Column] = None
    # tokens: the column holds token counts; text_words: it holds the text itself, and its
    # length is whitespace-separated words x tokens_per_word (a rough count, no tokenizer)
    prompt_column_kind: Literal["tokens", "text_words"] = "tokens"
    output_column_kind: Literal["tokens", "text_words"] = "tokens"
    tokens_per_word: PositiveFloat = 1.3
    time_scale: PositiveFloat = 1.0  # >1 stretches time (lower rate), <1 compresses it
    start_row: int = Field(0, ge=0)
    hash_column: Optional[Column] = Field(
        None,
        description="column holding each request's prefix-block hash ids (a list of integers, one per "
        "hash_block_tokens tokens of the prompt, equal ids meaning equal prompt prefixes, as Mooncake's "
        "hash_ids): the token identity serving.prefix_caching looks up",
    )
    hash_block_tokens: PositiveInt = Field(
        512, description="prompt tokens per hash id in hash_column; serving.block_size must divide it"
    )


def _typed(value, union):
    """`value` unchanged, unless it is a mapping without `type`: then a one-line error listing
    the kinds of `union` (each member's `type` literal)."""
    if isinstance(value, dict) and "type" not in value:
        kinds = [get_args(m.model_fields["type"].annotation)[0] for m in get_args(union)]
        raise ValueError(f"give its 'type': one of {', '.join(kinds)}")
    return value


class RequestsSection(_Strict):
    count: Optional[PositiveInt] = None
    duration_s: Optional[PositiveFloat] = None
    arrival: Optional[Arrivals] = Field(None, discriminator="type")
    prompt_tokens: Optional[LengthDist] = Field(None, discriminator="type")
    output_tokens: Optional[LengthDist] = Field(None, discriminator="type")
    max_prompt_tokens: Optional[Tokens] = None
    max_output_tokens: Optional[Tokens] = None
    trace: Optional[TraceSource] = None
    sharing: Optional[SharingModel] = Field(
        None, description="synthetic prefix sharing (multi-turn conversations, a shared system prompt)"
    )

    _whole_count = field_validator("count", "max_prompt_tokens", "max_output_tokens", mode="before")(whole_number)

    @field_validator("prompt_tokens", "output_tokens", mode="before")
    @classmethod
    def _plain_length(cls, value, info):
        """A plain number is a fixed length (`prompt_tokens: 512`); a mapping without its `type`
        is told the kinds there are, which pydantic's tagged union would not name."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return {"type": "fixed", "value": value}
        return _typed(value, LengthDist)

    @field_validator("arrival", mode="before")
    @classmethod
    def _typed_arrival(cls, value):
        return _typed(value, Arrivals)

    @model_validator(mode="after")
    def _complete(self):
        if self.trace is None:
            if self.arrival is None:
                raise ValueError("give 'arrival' (poisson, gamma, closed_loop, burst) or a 'trace'")
            if self.prompt_tokens is None or self.output_tokens is None:
                raise ValueError("give 'prompt_tokens' and 'output_tokens' distributions or a 'trace'")
        else:
            if self.trace.arrival_column is None and self.arrival is None:
                raise ValueError("the trace has no arrival_column: give 'arrival' too")
            if self.trace.prompt_column is None and self.prompt_tokens is None:
                raise ValueError("the trace has no prompt_column: give 'prompt_tokens' too")
            if self.trace.output_column is None and self.output_tokens is None:
                raise ValueError("the trace has no output_column: give 'output_tokens' too")
            if self.trace.arrival_column is not None and self.arrival is not None:
                raise ValueError("give either trace.arrival_column or 'arrival', not both")
        if self.count is None and self.duration_s is None and self.trace is None:
            raise ValueError("give 'count' or 'duration_s'")
        if self.sharing is not None and self.trace is not None and self.trace.hash_column is not None:
            raise ValueError("give either 'sharing' or trace.hash_column as the prompts' identity, not both")
        if self.count is None and self.trace is None and self.arrival.type in ("closed_loop", "burst"):
            raise ValueError(f"'{self.arrival.type}' arrivals need 'count' (the number of requests)")
        return self


from ..offload.config import OffloadSection  # noqa: E402  (sections owned by their features)
from ..speculative.config import SpeculationSection  # noqa: E402


class WorkloadSpec(_Strict):
    name: str = "workload"
    description: str = ""
    source: str = ""  # where the numbers in this file come from
    model: str = "llama-2-7b"
    hardware: HardwareSection = HardwareSection()
    serving: ServingSection = ServingSection()
    requests: RequestsSection
    speculation: Optional[SpeculationSection] = None  # speculative decoding (draft models, Minions, Medusa)
    offload: Optional[OffloadSection] = None  # KV cache in CPU memory with selective prefetch
    seed: int = Field(0, ge=0, le=MAX_SEED)
