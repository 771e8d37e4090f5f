"""Per-operator roofline table and plot (Medusa Appendix G.1, Figs. 9-17).

`operator_table` runs the cost model's `breakdown()` over a sweep of (phase, batch, sequence
length, candidates) and returns one row per operator and setting; `plot_roofline` draws the
achieved FLOP/s of the paper's three matmul groups against their operational intensity under
the GPU's memory and compute roofs.

Settings: `prefill` is `batch` prompts of `seq_len` tokens each (no cache); `decode` is one new
token per sequence over a cache of `seq_len`; `verify` is `candidates` new tokens per sequence
(a Medusa tree or speculative draft) over a cache of `seq_len`. The `candidates` column holds
the new (query) tokens per sequence of the pass: seq_len for prefill, 1 for decode, q for
verify."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from infersim.simulator.costmodel import BatchShape, OperatorCost, RooflineCostModel
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.allreduce import build_all_reduce
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.hardware.profile import HardwareProfile
from infersim.simulator.metrics.plots import agg_pyplot, write_figure
from infersim.simulator.models.catalog import load_model
from infersim.simulator.models.spec import ModelSpec
from infersim.simulator.parallel.config import ClusterSection
from infersim.simulator.parallel.cost import PipelineCostModel
from infersim.simulator.parallel.dp_attention import DataParallelAttentionCostModel, dp_attention_weight_bytes_per_gpu
from infersim.simulator.parallel.layout import layout_cost_model
from infersim.simulator.parallel.memory import stage_weight_bytes
from infersim.simulator.parallel.placement import COLOCATED, check_deployment, tp_across_nodes_note
from infersim.simulator.validation import BASE_BYTES, check_memory, check_tensor_parallel, source_field
from infersim.simulator.workload.schema import HardwareSection, ServingSection

PHASES = ("prefill", "decode", "verify")
POW2_BATCHES = (1, 2, 4, 8, 16, 32, 64)  # Medusa Figs. 9-17
POW2_SEQ_LENS = (128, 256, 512, 1024, 2048, 4096, 8192)
DEFAULT_CANDIDATES = (1, 4, 16, 64)

SETTING_COLUMNS = ["model", "hardware", "phase", "batch", "seq_len", "candidates"]  # one setting of a sweep
COLUMNS = [
    *SETTING_COLUMNS,
    "operator",
    "op_class",
    "count",
    "flops",
    "bytes",
    "intensity",
    "achieved_flops_per_s",
    "bound",
    "time_s",
    "total_time_s",
    "stage",  # the pipeline stage (0 without stages)
    "link",  # a communication's link: node, network or node+network
]

# The paper's three matmul groups (Fig. 9 legend). o_proj has q_proj's shape, so it sits with
# the projections; OPT's fc1/fc2 are its up/down.
OPERATOR_GROUPS = {
    "q_proj": "qkv mlp",
    "k_proj": "qkv mlp",
    "v_proj": "qkv mlp",
    "o_proj": "qkv mlp",
    "up_proj": "up/gate/down",
    "gate_proj": "up/gate/down",
    "down_proj": "up/gate/down",
    "fc1": "up/gate/down",
    "fc2": "up/gate/down",
    "qk": "qk/pv",
    "pv": "qk/pv",
}
PHASE_LABELS = {"prefill": "init", "decode": "ar", "verify": "medusa"}  # the paper's suffixes


def operator_group(name: str) -> str | None:
    """'qkv mlp', 'up/gate/down', 'qk/pv', or None for operators the paper does not plot."""
    return OPERATOR_GROUPS.get(name)


def build_cost_model(model: str | ModelSpec, hardware: str | HardwareProfile, **options) -> RooflineCostModel:
    """The roofline cost model of `model` on `hardware` (names or loaded specs); `options` are
    RooflineCostModel's keyword arguments (dtype, kv_dtype, tensor_parallel, fused_attention,
    fused_projections, expert_parallel); the profile's `all_reduce` picks the all-reduce kernel.
    Tensor parallelism and that kernel are checked here against the model and the profile, each
    error naming its flag (--tp, --all-reduce)."""
    spec = load_model(model) if isinstance(model, str) else model
    hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
    tensor_parallel = options.get("tensor_parallel", 1)
    check_tensor_parallel(spec, tensor_parallel, field="--tp")
    hw.require_tensor_parallel(tensor_parallel, "--tp")
    build_all_reduce(hw.all_reduce, hw).check(tensor_parallel, False, "--all-reduce")
    return RooflineCostModel(spec, hw, **options)


SOURCE = "sim roofline"  # where the layout checks' messages come from, before they name the flag


@dataclass(frozen=True)
class LayoutSpec:
    """What `check_deployment` reads of a workload, for a layout given by flags: the hardware
    section and the defaults of the rest (no speculation, no offload, the roofline)."""

    hardware: HardwareSection
    serving: ServingSection = field(default_factory=ServingSection)
    speculation: None = None
    offload: None = None


def build_layout_cost_model(
    model: str | ModelSpec,
    hardware: str | HardwareProfile,
    *,
    pipeline_parallel: int = 1,
    dp_attention: int = 0,
    two_batch_overlap: bool | str = False,
    **options,
):
    """The cost model `sim run` prices the layout with: `dp_attention` ranks of one GPU sharing
    their experts (the group's expert-parallel degree; 0: off), or `pipeline_parallel` stages of
    tensor-parallel groups, on the default cluster (8-GPU nodes). The layout passes `sim run`'s
    checks (check_deployment), each refusal naming its flag; without either, build_cost_model."""
    spec = load_model(model) if isinstance(model, str) else model
    hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
    if pipeline_parallel == 1 and not dp_attention and not two_batch_overlap:
        return build_cost_model(spec, hw, **options)
    tp, ep = options.get("tensor_parallel", 1), options.get("expert_parallel", 1)
    section = HardwareSection(
        profile=hw.name,
        replicas=max(dp_attention, 1),
        tensor_parallel=tp,
        pipeline_parallel=pipeline_parallel,
        expert_parallel=dp_attention or ep,
        data_parallel_attention=dp_attention > 0,
        two_batch_overlap=two_batch_overlap,
    )
    flags = {
        "hardware.tensor_parallel": "--tp",
        "hardware.pipeline_parallel": "--pp",
        "hardware.expert_parallel": "--dp-attention" if dp_attention else "--ep",
        "hardware.data_parallel_attention": "--dp-attention",
        "hardware.two_batch_overlap": "--two-batch-overlap",
    }
    try:
        placement = check_deployment(spec, LayoutSpec(section), SOURCE)[COLOCATED]
        base = build_cost_model(spec, hw, **{**options, "expert_parallel": 1 if dp_attention else ep})
        return layout_cost_model(base, placement, section, SOURCE)
    except InfersimError as exc:
        message = str(exc)
        for name, flag in flags.items():
            message = message.replace(source_field(SOURCE, name), flag)
        raise InfersimError(message) from None


def base_of(cost):
    """The roofline of one GPU group under a layout's cost model (the model itself otherwise)."""
    return cost.base if isinstance(cost, PipelineCostModel) else cost


def layout_label(cost) -> str:
    """'tp 8 x pp 2', 'DP attention 16 x EP 16, two-batch overlap': how the GPUs are laid out."""
    base = base_of(cost)
    if isinstance(cost, DataParallelAttentionCostModel):
        overlap = {False: "", True: ", two-batch overlap", "auto": ", two-batch overlap auto"}[cost.two_batch_overlap]
        return f"DP attention {cost.ep} x EP {cost.ep}{overlap}"
    ep = f" x ep {base.ep}" if base.ep > 1 else ""
    pp = f" x pp {cost.placement.pp}" if isinstance(cost, PipelineCostModel) else ""
    return f"tp {base.tp}{pp}{ep}"


def stage_breakdowns(cost, shape: BatchShape) -> list[list[OperatorCost]]:
    """Each stage's operators (one stage without a layout)."""
    if isinstance(cost, PipelineCostModel):
        return cost.stage_breakdown(shape)
    return [cost.breakdown(shape)]


# A costed batch holds a Python list and three int64 arrays per sequence, plus the temporaries
# of its totals: about 60 bytes a sequence, rounded up.
BYTES_PER_BATCH_SEQUENCE = 64


def check_batch_memory(batches: Sequence[int], field: str = "--batch", allow_large: bool = False) -> None:
    """Refuse up front a batch whose per-sequence arrays cannot fit in memory."""
    largest = max(batches, default=0)
    check_memory(
        BASE_BYTES + BYTES_PER_BATCH_SEQUENCE * largest, f"{field}: a batch of {largest:,} sequences", allow_large
    )


def batch_shape(phase: str, batch: int, seq_len: int, candidates: int = 1) -> BatchShape:
    contexts = [int(seq_len)] * int(batch)
    if phase == "prefill":
        return BatchShape.prefill(contexts)
    if phase == "decode":
        return BatchShape.decode(contexts)
    if phase == "verify":
        return BatchShape.verify(contexts, int(candidates))
    raise InfersimError(f"unknown phase '{phase}'; known: {', '.join(PHASES)}")


@dataclass(frozen=True)
class Grid:
    """The settings a roofline study sweeps: every phase at every batch x sequence length
    (verify also at every candidate count)."""

    phases: Sequence[str] = ("prefill", "decode")
    batches: Sequence[int] = POW2_BATCHES
    seq_lens: Sequence[int] = POW2_SEQ_LENS
    candidates: Sequence[int] = DEFAULT_CANDIDATES  # query tokens per sequence of a verify step

    def settings(self) -> list[tuple[str, int, int, int]]:
        """(phase, batch, seq_len, query tokens per sequence) for every point of the sweep."""
        out = []
        for phase in self.phases:
            if phase not in PHASES:
                raise InfersimError(f"unknown phase '{phase}'; known: {', '.join(PHASES)}")
            for b, s in product(self.batches, self.seq_lens):
                if min(b, s) < 1:
                    raise InfersimError(f"batch and sequence length must be >= 1, got batch {b}, seq {s}")
                qs = {"prefill": [s], "decode": [1], "verify": list(self.candidates)}[phase]
                for q in qs:
                    if q < 1:
                        raise InfersimError(f"candidates must be >= 1, got {q}")
                    out.append((phase, int(b), int(s), int(q)))
        return out


def operator_table(cost: RooflineCostModel, grid: Grid = Grid()) -> pd.DataFrame:
    """One row per operator per setting. flops/bytes/time_s are per occurrence (one layer for
    per-layer operators), per GPU; total_time_s = time_s * count."""
    rows = []
    base = base_of(cost)
    for phase, b, s, q in grid.settings():
        for stage, op in _staged_rows(cost, batch_shape(phase, b, s, q)):
            rows.append(
                (
                    base.model.name,
                    base.hardware.name,
                    phase,
                    b,
                    s,
                    q,
                    op.name,
                    op.op_class,
                    op.count,
                    op.flops,
                    op.bytes,
                    op.intensity if op.bytes else float("nan"),
                    op.flops / op.time_s if op.time_s > 0 else float("nan"),
                    op.bound,
                    op.time_s,
                    op.total_time_s,
                    stage,
                    op.link,
                )
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def _staged_rows(cost, shape: BatchShape) -> list[tuple[int, OperatorCost]]:
    return [(stage, op) for stage, ops in enumerate(stage_breakdowns(cost, shape)) for op in ops]


def iteration_table(cost: RooflineCostModel, grid: Grid = Grid()) -> pd.DataFrame:
    """One row per setting: the whole iteration (all layers, lm_head, all-reduces, overheads)."""
    rows = []
    base = base_of(cost)
    for phase, b, s, q in grid.settings():
        shape = batch_shape(phase, b, s, q)
        t = shape.totals()
        ops = [op for _, op in _staged_rows(cost, shape)]
        time_s = cost.iteration_time_s(shape)
        flops = sum(op.flops * op.count for op in ops)
        nbytes = sum(op.bytes * op.count for op in ops if op.op_class != "communication")  # memory traffic only
        rows.append(
            (
                base.model.name,
                base.hardware.name,
                phase,
                b,
                s,
                q,
                int(t.tokens),
                flops,
                nbytes,
                time_s,
                t.tokens / time_s,
                memory_bytes_per_gpu(cost, phase, b, s, q),
            )
        )
    return pd.DataFrame(
        rows,
        columns=[
            *SETTING_COLUMNS,
            "new_tokens",
            "flops",
            "bytes",
            "iteration_time_s",
            "tokens_per_s",
            "memory_bytes_per_gpu",
        ],
    )


def stage_table(cost: PipelineCostModel, shape: BatchShape) -> pd.DataFrame:
    """One row per pipeline stage for one batch: its layers, the sparse ones among them, its
    compute time and its hand-off to the next stage, as the simulator's stage timeline takes
    them (stage_times_s); one batch alone takes their sum (iteration_time_s)."""
    stages_s, handoffs_s = cost.stage_times_s(shape)
    ranges = cost.placement.layer_ranges
    return pd.DataFrame(
        {
            "stage": range(cost.placement.pp),
            "layers": [f"{a}-{b - 1}" for a, b in ranges],
            "sparse_layers": list(cost.placement.sparse_layers(cost.base.model)),
            "stage_time_s": stages_s,
            "handoff_time_s": [*handoffs_s, 0.0],
            "handoff_link": [cost.handoff_link(s) for s in range(cost.placement.pp - 1)] + [""],
        }
    )


def overlap_table(cost: DataParallelAttentionCostModel, shape: BatchShape) -> pd.DataFrame:
    """The parts of a two-batch-overlap step of one rank whose peers run the same batch
    (parallel/dp_attention.py): `count` times `time_s` of the parts that add up to the
    overlapped step, and per sparse layer its compute and its all-to-alls (both micro-batches),
    the longer of which it takes, the shorter hidden under it."""
    parts = cost.overlap_parts(shape)
    dense, sparse = cost.dense_layers, cost.sparse_layers
    compute, comm = float(parts.compute[0]), float(parts.comm[0])
    rows = [
        ("before and after the layers (whole batch)", 1, float(parts.first[0] + parts.last[0]), True),
        ("dense layer, micro-batches a + b", dense, float(parts.dense[0]), True),
        ("sparse layer compute, a + b (attention, MLP, experts)", sparse, compute, False),
        ("sparse layer all-to-alls, a + b (dispatch, combine)", sparse, comm, False),
        (
            f"sparse layer: the longer ({'compute' if compute >= comm else 'all-to-alls'})",
            sparse,
            max(compute, comm),
            True,
        ),
        ("exposed: dispatch of a, combine of b", 1, float(parts.exposed[0]), True),
    ]
    return pd.DataFrame(
        [(part, n, t, n * t if counted else float("nan")) for part, n, t, counted in rows],
        columns=["part", "count", "time_s", "total_time_s"],
    )


def gpu_shares(cost) -> list[tuple[float, float]]:
    """(weight bytes, share of the model's KV cache) on one GPU of each kind the layout has: a
    tensor-parallel group's GPU, each stage's GPU, or a data-parallel-attention rank (its
    weights but E - E/N of the routed experts, all layers' KV of its own sequences)."""
    base = base_of(cost)
    model, dtype = base.model, base.weight_dtype
    if isinstance(cost, DataParallelAttentionCostModel):
        return [(dp_attention_weight_bytes_per_gpu(model, cost.ep, dtype), 1.0)]
    if isinstance(cost, PipelineCostModel):
        weights = stage_weight_bytes(model, cost.placement, dtype)
        return [(w, n / model.num_layers) for w, n in zip(weights, cost.placement.layers)]
    return [(model.weight_bytes_per_gpu(base.tp, dtype), 1.0)]


def memory_bytes_per_gpu(cost, phase: str, batch: int, seq_len: int, candidates: int) -> float:
    """What the fullest GPU holds to run the setting: its share of the weights and of the KV
    cache of every sequence after the pass (prompt tokens for prefill; cached context plus new
    tokens otherwise). Activations are left out: this is the floor a serving engine needs."""
    base = base_of(cost)
    tokens_per_sequence = seq_len if phase == "prefill" else seq_len + candidates
    kv = base.model.bytes_kv_per_token_per_gpu(base.tp, base.kv_dtype) * batch * tokens_per_sequence
    return max(weights + share * kv for weights, share in gpu_shares(cost))


def memory_fit_note(cost, iters: pd.DataFrame) -> str | None:
    """A line saying which settings of `iters` (iteration_table) need more memory per GPU than
    the card has, or None when all fit. The roofline times them anyway, as what-ifs; a planner
    reading the table should know that no engine could run them on this card."""
    base = base_of(cost)
    card = base.hardware.memory_bytes()
    on = f"{base.hardware.name}'s {base.hardware.memory_label()}"
    weights = max(w for w, _ in gpu_shares(cost))
    how = f"{base.weight_dtype}, {layout_label(cost)}"
    if weights >= card:
        more = "--dp-attention" if isinstance(cost, DataParallelAttentionCostModel) else "--tp or --pp"
        return (
            f"note: {base.model.name}'s weights alone take {weights / 1e9:.1f} GB per GPU ({how}), more than {on}: "
            f"none of these settings fits; raise {more} or lower --dtype"
        )
    over = iters[iters["memory_bytes_per_gpu"] > card]
    if over.empty:
        return None
    worst = over.loc[over["memory_bytes_per_gpu"].idxmax()]
    return (
        f"note: {len(over)} of {len(iters)} settings need more than {on} per GPU ({weights / 1e9:.1f} GB of weights, "
        f"{how}, plus the KV cache), up to {worst['memory_bytes_per_gpu'] / 1e9:.1f} GB at {worst['phase']} batch "
        f"{worst['batch']} x seq {worst['seq_len']}; their times are what-ifs"
    )


def tp_node_note(cost) -> str | None:
    """A line for a tensor-parallel degree larger than a node of the default cluster: this table
    prices the group as if it sat in one node, where `sim run` prices its all-reduces across
    nodes (hardware.cluster); with --pp the stages' cost model prices them as `sim run` does."""
    g = ClusterSection().gpus_per_node
    if isinstance(cost, PipelineCostModel) or cost.tp <= g:
        return None
    return (
        f"note: tp {cost.tp} is priced here as one group inside a node; on {g}-GPU nodes "
        f"{tp_across_nodes_note(cost.tp, g)}, which `sim run` prices (hardware.cluster)"
    )


# ---- plot ------------------------------------------------------------------------------
# colour and marker per group, fill per phase; sizes shrink group by group so that points of
# different groups at one spot (a roofline puts them on the same roof) stay visible as rings
_GROUP_STYLE = {"qkv mlp": ("#1f77b4", "o", 9.0), "up/gate/down": ("#d62728", "s", 6.0), "qk/pv": ("#2ca02c", "D", 3.8)}
_PHASE_FILL = {"prefill": "full", "decode": "none", "verify": "left"}


def _fmt_flops(x: float) -> str:
    return f"{x / 1e12:g} TFLOP/s" if x >= 1e12 else f"{x / 1e9:g} GFLOP/s"


def plot_roofline(
    df: pd.DataFrame,
    hardware: str | HardwareProfile,
    path: str | Path,
    *,
    compute_dtype: str = "fp16",
    title: str | None = None,
) -> Path:
    """Log-log roofline of the table's matmul operators (the paper's three groups) by phase.
    Roofs are the datasheet peaks; with calibrated efficiencies below 1 the achievable linear
    roof is drawn too. Written atomically; returns the path."""
    plt = agg_pyplot()

    hw = load_hardware(hardware) if isinstance(hardware, str) else hardware
    peak = hw.peak_flops(compute_dtype)
    bw = hw.memory_bandwidth_bytes_per_s()
    ridge = peak / bw

    data = df.assign(group=df["operator"].map(OPERATOR_GROUPS)).dropna(subset=["group"])
    data = data[(data["flops"] > 0) & (data["bytes"] > 0)]
    if data.empty:
        raise InfersimError("nothing to plot: the table has no matmul operators (q/k/v, up/gate/down, qk/pv)")

    lo = min(data["intensity"].min(), ridge) / 4
    hi = max(data["intensity"].max(), ridge) * 4
    x = np.geomspace(lo, hi, 400)

    fig, ax = plt.subplots(figsize=(8.0, 5.6), dpi=150)
    ax.plot(x, np.minimum(x * bw, peak), color="black", lw=1.6, zorder=3)
    ax.plot(x, x * bw, color="0.35", lw=0.9, ls="--", zorder=2)
    ax.axhline(peak, color="0.35", lw=0.9, ls="--", zorder=2)
    eff = hw.efficiency_for("linear")
    if eff.compute < 1 or eff.memory < 1:
        ax.plot(
            x,
            np.minimum(x * bw * eff.memory, peak * eff.compute),
            color="0.5",
            lw=1.0,
            ls=":",
            label="achievable (linear, calibrated)",
        )
    ax.axvline(ridge, color="0.6", lw=0.8, ls=":", zorder=1)
    ax.plot([ridge], [peak], marker="*", ms=13, color="gold", mec="black", zorder=5)
    ax.annotate(
        f"ridge {ridge:.0f} FLOP/B",
        (ridge, peak),
        xytext=(8, -18),
        textcoords="offset points",
        fontsize=8.5,
        bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.8),
    )
    ax.annotate(
        f"peak {_fmt_flops(peak)}", (lo, peak), xytext=(6, 5), textcoords="offset points", ha="left", fontsize=9
    )
    for phase in [p for p in PHASES if p in set(data["phase"])]:
        for group, (colour, marker, size) in _GROUP_STYLE.items():
            sel = data[(data["phase"] == phase) & (data["group"] == group)]
            if sel.empty:
                continue
            pts = sel[["intensity", "achieved_flops_per_s"]].drop_duplicates()
            fill = _PHASE_FILL[phase]
            ax.plot(
                pts["intensity"],
                pts["achieved_flops_per_s"],
                ls="none",
                marker=marker,
                ms=size,
                color=colour,
                mec=colour,
                mew=1.1,
                fillstyle="full" if fill == "none" else fill,
                mfc="none" if fill == "none" else colour,
                markerfacecoloralt="white",
                alpha=0.85,
                zorder=4,
                label=f"{group} {PHASE_LABELS[phase]}",
            )
    ax.text(0.02, 0.97, "memory-bound", transform=ax.transAxes, ha="left", va="top", fontsize=9, color="0.4")
    ax.text(0.98, 0.97, "compute-bound", transform=ax.transAxes, ha="right", va="top", fontsize=9, color="0.4")

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ymin = max(min(data["achieved_flops_per_s"].min(), lo * bw) / 2, 1e8)
    ax.set_ylim(ymin, peak * 3)
    ax.set_xlabel("operational intensity (FLOP/byte)")
    ax.set_ylabel("achieved performance (FLOP/s)")
    model = ", ".join(sorted(set(df["model"]))) if "model" in df else ""
    ax.set_title(title or f"Roofline: {model} on {hw.name} ({compute_dtype})")
    ax.grid(True, which="major", ls="-", lw=0.4, color="0.85")
    ax.grid(True, which="minor", ls="-", lw=0.25, color="0.93")
    ax.legend(loc="lower right", fontsize=8.5, frameon=True, framealpha=0.9, ncol=1)
    fig.tight_layout()
    # the memory roof's label follows its slope as drawn (screen angle, known after layout)
    x_lab = lo * 1.3
    p0 = ax.transData.transform((x_lab, x_lab * bw))
    p1 = ax.transData.transform((x_lab * 10, x_lab * 10 * bw))
    angle = float(np.degrees(np.arctan2(p1[1] - p0[1], p1[0] - p0[0])))
    ax.annotate(
        f"HBM {hw.memory_bandwidth_gbps:,.0f} GB/s",
        (x_lab, x_lab * bw),
        xytext=(-2, 10),
        textcoords="offset points",
        fontsize=9,
        rotation=angle,
        rotation_mode="anchor",
    )
    write_figure(fig, path)
    plt.close(fig)
    return Path(path)
