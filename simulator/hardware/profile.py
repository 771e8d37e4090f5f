"""A GPU (or any device) as numbers: peaks, memory, host link, interconnect, efficiencies.

Host-to-device and device-to-host bandwidth are separate fields because they differ in
practice (FlexGen measured 12.89 vs 0.97 GB/s on one host) and because the host link is a
property of the machine the GPU sits in, not of the GPU (InfiniGen's A6000 sat on PCIe 3.0).
Units: GB/s and TFLOP/s are decimal (1e9 bytes, 1e12 FLOP) as on datasheets."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from ..errors import InfersimError
from ..validation import STRICT_CONFIG
from .collectives import CollectivesSection

OPERATOR_CLASSES = ("linear", "attention", "elementwise", "communication")


class HostLink(BaseModel):
    model_config = STRICT_CONFIG
    name: str = "PCIe 4.0 x16"
    h2d_gbps: PositiveFloat = Field(description="achieved host-to-device copy bandwidth, GB/s")
    d2h_gbps: PositiveFloat = Field(description="achieved device-to-host copy bandwidth, GB/s")
    latency_us: NonNegativeFloat = 10.0
    copy_issue_us: NonNegativeFloat = Field(
        0.0,
        description="host cost of issuing one async copy (driver call): a stream of many small copies "
        "cannot run faster than one per copy_issue_us, whatever the bandwidth; 0 = not known",
    )
    source: str = ""


class Interconnect(BaseModel):
    """GPU-to-GPU link used by tensor-parallel all-reduce."""

    model_config = STRICT_CONFIG
    name: str = "PCIe"
    bandwidth_gbps: PositiveFloat = Field(description="per direction, per GPU, GB/s")
    latency_us: NonNegativeFloat = 10.0
    source: str = ""


class Efficiency(BaseModel):
    """Achieved fraction of the peaks for one operator class (1.0 = datasheet roofline)."""

    model_config = STRICT_CONFIG
    compute: float = Field(1.0, gt=0, le=1.5)
    memory: float = Field(1.0, gt=0, le=1.5)
    source: str = "datasheet peak (not calibrated)"
    confidence: Literal["datasheet", "published", "derived", "measured"] = Field(
        "datasheet",
        description="datasheet: 1.0 placeholders; published: a paper's or vendor's reported kernel "
        "efficiency, no table of ours backs it; derived: another card's numbers carried over; "
        "measured: fitted on timed kernels",
    )


class Overheads(BaseModel):
    """What an iteration costs beyond its kernels: the serving engine's own work (scheduling,
    input preparation, sampling, output processing), which the GPU waits for."""

    model_config = STRICT_CONFIG
    kernel_launch_us: NonNegativeFloat = 0.0  # added once per kernel
    iteration_us: NonNegativeFloat = 0.0  # added once per engine iteration (scheduling, sampling)
    tp_worker_us: NonNegativeFloat = Field(
        0.0,
        description="added once per engine iteration for each tensor-parallel worker beyond the first: the "
        "driver hands every step's inputs to the other workers and the step waits for the slowest",
    )
    source: str = ""
    status: Optional[Literal["measured", "derived", "none"]] = Field(
        None,
        description="measured: fitted on, or checked against, runs on this card; derived: carried from a measured "
        "card (`inherits`) without a run on this one; none: no engine overhead (kernels only); unset: the numbers "
        "as given",
    )
    inherits: Optional[str] = Field(
        None,
        description="profile whose overhead this card carries: the numbers this entry leaves out are that "
        "profile's (one definition of a fit that several cards share)",
    )
    why: str = Field("", description="why the inherited overhead carries over to this card")

    @model_validator(mode="after")
    def _check(self):
        if self.status == "derived" and not self.inherits:
            raise ValueError("a derived overhead names the profile it inherits")
        return self

    @property
    def state(self) -> str:
        """The status as `sim hardware` shows it: the given one, else none (all zero) or given."""
        if self.status is not None:
            return self.status
        return "none" if not (self.kernel_launch_us or self.iteration_us or self.tp_worker_us) else "given"

    def kernels_only(self) -> "Overheads":
        """These overheads without the engine's per-iteration time: what a draft model's step
        pays inside a speculative round, whose engine iteration the target's step already
        carries (a draft step's own framework cost is `speculation.draft_step_overhead_us`)."""
        return self.model_copy(update={"iteration_us": 0.0, "tp_worker_us": 0.0})

    def iteration_s(self, tensor_parallel: int) -> float:
        """One engine iteration's overhead at this tensor parallelism, seconds."""
        return (self.iteration_us + (int(tensor_parallel) - 1) * self.tp_worker_us) * 1e-6


class FittedValue(BaseModel):
    """Where a fitted number came from and how well it reproduces its rows."""

    model_config = STRICT_CONFIG
    source: str = Field(description="the measurements: table files and who published them")
    rows: int = Field(ge=0, description="measured rows the value was fitted on")
    mape_pct: NonNegativeFloat = Field(description="mean absolute percentage error of the fit on those rows")
    bias_pct: float = Field(description="mean signed error, (predicted - measured) / measured, percent")
    fitted_on: list[str] = Field([], description="the models (or table labels) whose rows were used")


class MeasuredShapes(BaseModel):
    """The measured GEMM medians the model is corrected by, shape by shape
    (simulator/costmodel/measured_gemms.py)."""

    model_config = STRICT_CONFIG
    file: str = Field(description="gzipped CSV of n, k, tokens, time_us; relative to the profile's folder")
    rows: int = Field(ge=1, description="measured shapes (one median per n, k, tokens)")
    k_width_octaves: float = Field(
        gt=0, le=4.0, description="width of the weight over log2 K: how far a measured K carries to another"
    )
    dtype: Literal["fp32", "fp16", "bf16"] = Field(
        "fp16", description="the measured GEMMs' dtype: GEMMs of another width of element run other kernels"
    )
    mape_pct: NonNegativeFloat = Field(description="MAPE of the corrected model on the fitted rows")
    bias_pct: float = Field(description="signed error of the corrected model on the fitted rows, percent")


class GemmFit(FittedValue):
    """A GEMM of M tokens (x K inputs -> N outputs) takes
    launch + ((weight + activation bytes) / (bandwidth x memory)) (+) (2 M' K N / (peak x compute))
    where (+) is the p-norm of the two times (p = corner_exponent): the memory-bound and
    compute-bound limits and the smooth corner between them; M' is M up to one tile and M
    rounded up to a multiple of the tile beyond (tile quantisation: a share `tile_share` of the
    rounding at the tile, the rest at twice the tile)."""

    compute: float = Field(gt=0, le=1.5, description="fraction of peak FLOP/s a compute-bound GEMM reaches")
    memory: float = Field(gt=0, le=1.5, description="fraction of peak bandwidth a weight-read-bound GEMM reaches")
    launch_us: NonNegativeFloat = Field(description="latency floor added to every GEMM, microseconds")
    corner_exponent: float = Field(ge=1.0, le=20.0, description="p of the p-norm joining memory and compute time")
    tile_tokens: int = Field(ge=1, description="tokens per tile: past one tile, M is rounded up to a multiple of it")
    wave_exponent: float = Field(
        0.0,
        ge=0.0,
        le=1.5,
        description="compute time x fill^-w, fill = share of the "
        "SM slots of all waves that 128 x 128 output tiles occupy (0: no wave model)",
    )
    wave_latency_us: NonNegativeFloat = Field(0.0, description="fixed time of each wave of output tiles, microseconds")
    tile_share: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="share of the rounding of M at tile_tokens; the rest rounds to twice the tile (cuBLAS runs "
        "tiles of both heights, shape by shape)",
    )
    measured_shapes: Optional[MeasuredShapes] = Field(
        None, description="measured shapes that correct the model where a GEMM's N and K were measured"
    )


class ElementwiseFit(FittedValue):
    """launch + max(1, S / tokens) x (min(B, C) / (bandwidth x cache_memory) + max(B - C, 0) /
    (bandwidth x memory)) for one elementwise operator kind moving B bytes (S =
    saturation_tokens: below S tokens, a one-row-per-block kernel leaves SMs idle; C =
    cache_mb: a working set that fits the L2 cache streams from it, faster than from memory);
    for a gather of at most `gather_tokens` rows, gather_us + gather_us_per_token x tokens
    instead (the small-index kernel walks the rows one after another)."""

    memory: float = Field(gt=0, le=3.0, description="fraction of peak bandwidth the kernel reaches")
    launch_us: NonNegativeFloat = Field(description="latency floor of one kernel, microseconds")
    saturation_tokens: int = Field(1, ge=1, description="tokens that fill the GPU: fewer take as long as this many")
    cache_mb: NonNegativeFloat = Field(
        0.0, description="bytes (MB, 2^20) of a kernel's working set that stream from the L2 cache (0: none)"
    )
    cache_memory: Optional[float] = Field(
        None,
        gt=0,
        le=20.0,
        description="fraction of peak memory bandwidth the kernel reaches on its cached bytes (with cache_mb)",
    )
    gather_tokens: Optional[int] = Field(
        None,
        ge=1,
        description="batches of at most this many tokens run the serial small-index gather (none: no such branch)",
    )
    gather_us: Optional[NonNegativeFloat] = Field(
        None, description="fixed time of the small-index gather, microseconds"
    )
    gather_us_per_token: Optional[NonNegativeFloat] = Field(
        None, description="time the small-index gather adds per token, microseconds"
    )

    @model_validator(mode="after")
    def _gather_complete(self):
        given = [self.gather_tokens, self.gather_us, self.gather_us_per_token]
        if any(v is not None for v in given) and any(v is None for v in given):
            raise ValueError("gather_tokens, gather_us and gather_us_per_token go together")
        if (self.cache_mb > 0) != (self.cache_memory is not None):
            raise ValueError("cache_mb and cache_memory go together")
        if self.cache_memory is not None and self.cache_memory < self.memory:
            raise ValueError("cache_memory is at least memory (the cache is no slower than memory)")
        return self


CALIBRATED_KINDS = ("norm", "act", "rope", "add", "emb")


class Calibration(BaseModel):
    """Per-kernel time models fitted from measured tables (`sim calibrate`), or inherited from a
    measured card of the same architecture (`from`), which keeps its fractions and floors and
    applies them to this card's own peaks."""

    model_config = {**STRICT_CONFIG, "populate_by_name": True}
    status: Literal["measured", "derived"] = "measured"
    inherits: Optional[str] = Field(None, description="measured profile whose fits this card uses (derived cards)")
    why: str = Field("", description="why those fits carry over (same architecture, same kernels)")
    source: str = ""
    gemm: Optional[GemmFit] = None
    elementwise: dict[str, ElementwiseFit] = {}

    @model_validator(mode="after")
    def _check(self):
        unknown = set(self.elementwise) - set(CALIBRATED_KINDS)
        if unknown:
            raise ValueError(f"unknown elementwise kind {sorted(unknown)}; known: {list(CALIBRATED_KINDS)}")
        if self.status == "derived" and not self.inherits:
            raise ValueError("a derived calibration names the measured profile it inherits")
        if self.status == "measured" and self.gemm is None and not self.elementwise:
            raise ValueError("a measured calibration holds a gemm or elementwise fit")
        return self


class HardwareProfile(BaseModel):
    model_config = STRICT_CONFIG

    name: str
    aliases: list[str] = []
    source: str
    peak_tflops: dict[str, PositiveFloat] = Field(description="dense peak per dtype: fp16, bf16, fp32, fp8, int8, int4")
    memory_bandwidth_gbps: PositiveFloat
    memory_gb: PositiveFloat = Field(description="memory on the datasheet, GB (1e9 bytes)")
    memory_visible_gib: Optional[PositiveFloat] = Field(
        None,
        description="memory the CUDA driver reports as the card's total (torch.cuda.mem_get_info()[1]), GiB "
        "(2^30 bytes), as measured on real cards (source in `sources`): serving engines size the KV cache from it. "
        "Without it (CPU profiles, cards not measured, a profile of your own that leaves it out) the memory "
        "plan takes memory_gb x 1e9",
    )
    device: Literal["gpu", "cpu"] = Field(
        "gpu", description="gpu: a CUDA device, whose serving engine reserves non-torch memory; cpu: host memory"
    )
    sm_count: Optional[PositiveInt] = Field(None, description="streaming multiprocessors: the slots of one GEMM wave")
    compute_capability: Optional[PositiveFloat] = Field(
        None,
        description="CUDA compute capability (7.5 for sm75): which quantised-weight kernels vLLM runs "
        "(simulator/catalog/quantization.yaml); without it, FP8 is refused on cards without an fp8 or bf16 peak",
    )
    l2_cache_mb: Optional[PositiveFloat] = Field(
        None, description="L2 cache, MB (2^20): a derived card scales the measured card's cached working set by it"
    )
    host_link: HostLink
    interconnect: Optional[Interconnect] = None
    efficiency: dict[str, Efficiency] = {}
    overheads: Overheads = Overheads()
    calibration: Optional[Calibration] = None
    sources: dict[str, str] = {}  # field -> citation
    collectives: Optional[CollectivesSection] = Field(
        None, description="measured NCCL all-reduce and send/recv times; without it the interconnect prices them"
    )
    all_reduce: Literal["nccl", "custom", "auto"] = Field(
        "nccl",
        description="kernel of the tensor-parallel all-reduces, a serving-engine choice (a workload sets it with "
        "hardware.all_reduce): nccl (the measured NCCL fits in `collectives:`, else a ring over the interconnect), "
        "custom (vLLM's and SGLang's custom all-reduce, from hwprofiles/_custom_all_reduce.yaml; refused where it "
        "cannot run), auto (custom where vLLM would run it, NCCL elsewhere)",
    )

    @model_validator(mode="after")
    def _check(self):
        unknown = set(self.efficiency) - set(OPERATOR_CLASSES)
        if unknown:
            raise ValueError(f"unknown operator class {sorted(unknown)} in efficiency; known: {list(OPERATOR_CLASSES)}")
        if "fp16" not in self.peak_tflops:
            raise ValueError("peak_tflops must give at least fp16")
        return self

    def peak_flops(self, dtype: str) -> float:
        """FLOP/s for a compute dtype; int4 falls back to int8 rate and bf16 to fp16. FP8 has no
        fallback: a card without FP8 tensor cores runs no FP8 GEMM at any rate we could quote (its
        FP8 weights run 16-bit GEMMs: costmodel/kernel_times.py gemm_dtype_for)."""
        table = self.peak_tflops
        if dtype == "fp8" and "fp8" not in table:
            raise InfersimError(f"hardware profile '{self.name}' has no fp8 peak: fp8 GEMMs need FP8 tensor cores")
        for key in (dtype, {"bf16": "fp16", "int4": "int8"}.get(dtype, "fp16"), "fp16"):
            if key in table:
                return table[key] * 1e12
        raise KeyError(dtype)

    def require_dtype(self, dtype: str, field: str) -> None:
        """Refuse a dtype the card cannot serve: a KV cache dtype, bf16, and weights on a profile
        without a compute capability (weights on a profile with one: hardware/quantization.py,
        which follows vLLM per architecture). FP8 runs on FP8 tensor cores (Ada, Hopper and later)
        and on Ampere without them: an FP8 KV cache converted with bit operations in the attention
        kernel (https://github.com/vllm-project/vllm/pull/2279, run on an A100), FP8 weights
        weight-only through FP8 Marlin (W8A16, https://docs.vllm.ai/en/stable/features/quantization/fp8/).
        A profile with neither an fp8 nor a bf16 peak (T4, V100) refuses an FP8 cache. bf16 came
        with Ampere: vLLM refuses it below compute capability 8.0 ("Bfloat16 is only supported on
        GPUs with compute capability of at least 8.0"; use float16), and so does a profile
        without a bf16 peak rather than run it at the fp16 rate."""
        table = self.peak_tflops
        if dtype == "fp8" and "fp8" not in table and "bf16" not in table:
            raise InfersimError(
                f"{field}: fp8 needs FP8 tensor cores, or Ampere or later for weight-only FP8 (Marlin), and "
                f"hardware profile '{self.name}' has neither an fp8 nor a bf16 peak; use fp16, int8 or int4"
            )
        if dtype == "bf16" and "bf16" not in table:
            raise InfersimError(
                f"{field}: bf16 needs bf16 tensor cores (Ampere and later) and hardware profile '{self.name}' "
                f"has no bf16 peak; use fp16"
            )

    def require_tensor_parallel(self, tp: int, field: str) -> None:
        """Refuse tensor parallelism on a card whose profile can price no all-reduce: neither an
        interconnect nor measured all-reduces."""
        if tp > 1 and self.interconnect is None and (self.collectives is None or not self.collectives.all_reduce):
            raise InfersimError(
                f"{field}: tensor parallel {tp} needs an interconnect and hardware profile '{self.name}' gives none "
                f"(nor measured all-reduces); use tensor_parallel 1 or a profile with `interconnect:`"
            )

    def memory_bandwidth_bytes_per_s(self) -> float:
        return self.memory_bandwidth_gbps * 1e9

    def efficiency_for(self, op_class: str) -> Efficiency:
        return self.efficiency.get(op_class, Efficiency())

    @property
    def mode(self) -> str:
        """measured (fitted kernel models, or `sim profile`'s fitted efficiencies), derived
        (inherits a measured card's fits) or datasheet (pure roofline)."""
        if self.calibration is not None:
            return self.calibration.status
        return "measured" if "calibration" in self.sources else "datasheet"

    def memory_bytes(self) -> float:
        """The card's total as a serving engine sees it: the driver-visible total where the profile
        measured it, else the datasheet figure."""
        if self.memory_visible_gib is not None:
            return self.memory_visible_gib * 2**30
        return self.memory_gb * 1e9

    def memory_label(self) -> str:
        """The total memory_bytes() takes, as messages name it."""
        if self.memory_visible_gib is not None:
            return f"{self.memory_visible_gib:g} GiB visible"
        return f"{self.memory_gb:g} GB"

    def record(self) -> dict:
        """The profile as a run's config.yaml records it: its measured GEMM table by file name,
        as the profile file names it, not by where this installation keeps it, so the same run
        writes the same bytes wherever infersim is installed."""
        out = self.model_dump(mode="json")
        shapes = ((out.get("calibration") or {}).get("gemm") or {}).get("measured_shapes")
        if shapes:
            shapes["file"] = Path(shapes["file"]).name
        return out
