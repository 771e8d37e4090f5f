"""Medusa Appendix G.3: predicted speedup of tree (multi-candidate) decoding from the roofline.

speedup = acceleration rate / overhead, where
- the acceleration rate is the mean number of tokens accepted per decoding step, from either
  (a) the paper's log fit to its Fig. 4a, rate = 0.477 ln(candidates) (`rate_model="log"`), or
  (b) a head-accuracy table and a sparse tree (`rate_model="tree"`): expected accepted length
      = 1 + sum over tree nodes of the product of the top-i accuracies along the node's path
      (Medusa section 2.3.3, accuracies assumed independent);
- the overhead is the time of one verification pass over `candidates` tokens per sequence
  (BatchShape.verify) divided by the time of a plain decode step, both over `batch` sequences
  with `seq_len` cached tokens; either the whole model (`block="model"`) or the paper's
  simplified block, one layer of XW_Q, XW_K, XW_V, QK^T, PV, XW_u, XW_g, XW_d
  (`block="paper"`, unfused attention by default so the score matrix traffic counts as in the
  paper's Table 5).
Medusa's own heads and the accept step are left out, as in the paper."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.plots import agg_pyplot, finish_figure
from infersim.simulator.metrics.rundir import staged_files
from infersim.simulator.speculative.medusa_heads import (
    HeadAccuracies,
    expected_accept_length,
    grow_tree,
    load_accuracies,
)

from .roofline import POW2_BATCHES, POW2_SEQ_LENS, build_cost_model, memory_bytes_per_gpu, memory_fit_note, tp_node_note

LOG_RATE_COEF = 0.477  # Medusa G.3: acceleration rate = 0.477 * ln(#candidates), fitted to Fig. 4a
POW2_CANDIDATES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PAPER_BLOCK_OPERATORS = (
    "q_proj",
    "k_proj",
    "v_proj",
    "qk",
    "pv",
    "up_proj",
    "gate_proj",
    "down_proj",
    "fc1",
    "fc2",
)  # fc1/fc2: the up/down of plain-MLP models (OPT); Llama has none
RATE_MODELS = ("log", "tree")
BLOCKS = ("model", "paper")
SEQ_SWEEP_BATCH = 4  # the paper's Fig. 23 fixes batch 4


# ---- acceleration rate -----------------------------------------------------------------
def log_rate(candidates) -> np.ndarray:
    """0.477 ln(q), clamped to at least 1.0: every step accepts at least one token (the base
    model's own next token is always kept), so a rate below 1 is impossible; the fit drops
    below 1 for fewer than e^(1/0.477) ~ 8 candidates and is 0 at one candidate."""
    q = np.asarray(candidates, dtype=np.float64)
    return np.maximum(1.0, LOG_RATE_COEF * np.log(q))


def tree_rate(candidates, table: HeadAccuracies) -> np.ndarray:
    acc = table.rank_accuracies()
    return np.array([expected_accept_length(grow_tree(table, int(q)), acc) for q in np.atleast_1d(candidates)])


def acceleration_rate(
    candidates, rate_model: str = "log", accuracies: str | HeadAccuracies = "vicuna-7b"
) -> np.ndarray:
    if rate_model == "log":
        return log_rate(candidates)
    if rate_model == "tree":
        table = load_accuracies(accuracies) if isinstance(accuracies, str) else accuracies
        return tree_rate(candidates, table)
    raise InfersimError(f"unknown rate model '{rate_model}'; known: {', '.join(RATE_MODELS)}")


# ---- overhead ----------------------------------------------------------------------------
def step_time_s(cost: RooflineCostModel, shape: BatchShape, block: str = "model") -> float:
    if block == "model":
        return cost.iteration_time_s(shape)
    if block == "paper":
        return float(sum(op.time_s for op in cost.breakdown(shape) if op.name in PAPER_BLOCK_OPERATORS))
    raise InfersimError(f"unknown block '{block}'; known: {', '.join(BLOCKS)}")


def overhead(
    cost: RooflineCostModel, batch: int, seq_len: int, candidates: int, block: str = "model"
) -> tuple[float, float, float]:
    """(verify time, plain decode time, their ratio) for `batch` sequences of `seq_len` cached tokens."""
    contexts = [int(seq_len)] * int(batch)
    verify_s = step_time_s(cost, BatchShape.verify(contexts, int(candidates)), block)
    decode_s = step_time_s(cost, BatchShape.decode(contexts), block)
    return verify_s, decode_s, verify_s / decode_s


# ---- the study ----------------------------------------------------------------------------
STUDY_COLUMNS = [
    "model",
    "hardware",
    "block",
    "attention",
    "rate_model",
    "batch",
    "seq_len",
    "candidates",
    "acceleration_rate",
    "decode_time_s",
    "verify_time_s",
    "overhead",
    "speedup",
    "memory_bytes_per_gpu",
]


@dataclass(frozen=True)
class MedusaStudyOptions:
    """How a Medusa study models one decoding step: the acceleration-rate model, the block whose
    time is the overhead, and the cost model's precision and parallelism."""

    rate_model: str = field(
        default="log", metadata={"help": "log (the paper's fit to Fig. 4a) or tree (head accuracies)"}
    )
    accuracies: str | HeadAccuracies = field(
        default="vicuna-7b", metadata={"help": "head-accuracy table (name or table) for rate_model tree"}
    )
    block: str = field(default="model", metadata={"help": "model (whole model) or paper (Table 5's one-layer block)"})
    attention: str | None = field(
        default=None, metadata={"help": "fused or unfused; None: unfused for the paper block, fused for the model"}
    )
    dtype: str = field(default="fp16", metadata={"help": "weight dtype of the cost model"})
    kv_dtype: str | None = field(
        default=None,
        metadata={
            "help": "KV-cache dtype; None: the activations' 16 bits under fp8, int8 and int4 weights, else the weight dtype"
        },
    )
    tensor_parallel: int = field(default=1, metadata={"help": "tensor-parallel degree"})

    def resolved_attention(self) -> str:
        """The attention kind the study costs, checked."""
        if self.block not in BLOCKS:
            raise InfersimError(f"unknown block '{self.block}'; known: {', '.join(BLOCKS)}")
        attention = self.attention or ("unfused" if self.block == "paper" else "fused")
        if attention not in ("fused", "unfused"):
            raise InfersimError(f"unknown attention '{attention}'; known: fused, unfused")
        return attention


@dataclass(frozen=True)
class MedusaSweeps:
    """The paper's three sweeps: candidates at one (batch, seq_len) (Fig. 21), batch sizes at
    seq_len (Fig. 22) and sequence lengths at seq_sweep_batch (Fig. 23), each over `candidates`."""

    batch: int = field(default=1, metadata={"help": "batch of the candidate sweep"})
    seq_len: int = field(default=1024, metadata={"help": "cached tokens of the candidate and batch sweeps"})
    candidates: Sequence[int] = field(default=POW2_CANDIDATES, metadata={"help": "candidate tokens per step"})
    batches: Sequence[int] = field(default=POW2_BATCHES, metadata={"help": "batch sizes of the batch sweep"})
    seq_lens: Sequence[int] = field(default=POW2_SEQ_LENS, metadata={"help": "cached tokens of the seq_len sweep"})
    seq_sweep_batch: int = field(default=SEQ_SWEEP_BATCH, metadata={"help": "batch of the seq_len sweep"})


def medusa_study(
    model: str,
    hardware: str,
    *,
    batches: Sequence[int] = (1,),
    seq_lens: Sequence[int] = (1024,),
    candidates: Sequence[int] = POW2_CANDIDATES,
    options: MedusaStudyOptions = MedusaStudyOptions(),
) -> pd.DataFrame:
    """One row per (batch, seq_len, candidates). `attention` defaults to unfused for the paper
    block (the paper's Table 5 traffic) and fused (the simulator's default) for the model."""
    o = options
    attention = o.resolved_attention()
    if min(list(batches) + list(seq_lens) + list(candidates)) < 1:
        raise InfersimError("batch sizes, sequence lengths and candidate counts must be >= 1")
    cost = study_cost_model(model, hardware, o)
    rates = acceleration_rate(candidates, o.rate_model, o.accuracies)
    rows = []
    for b in batches:
        for s in seq_lens:
            for q, rate in zip(candidates, rates):
                verify_s, decode_s, ratio = overhead(cost, b, s, q, o.block)
                rows.append(
                    (
                        cost.model.name,
                        cost.hardware.name,
                        o.block,
                        attention,
                        o.rate_model,
                        int(b),
                        int(s),
                        int(q),
                        float(rate),
                        decode_s,
                        verify_s,
                        ratio,
                        float(rate) / ratio,
                        memory_bytes_per_gpu(cost, "verify", b, s, q),
                    )
                )
    return pd.DataFrame(rows, columns=STUDY_COLUMNS)


def study_cost_model(model: str, hardware: str, options: MedusaStudyOptions) -> RooflineCostModel:
    """The cost model a study prices its steps with; the paper block is Table 5's eight
    operators, projections counted one GEMM per weight."""
    o = options
    return build_cost_model(
        model,
        hardware,
        dtype=o.dtype,
        kv_dtype=o.kv_dtype,
        tensor_parallel=o.tensor_parallel,
        fused_attention=o.resolved_attention() == "fused",
        fused_projections=o.block != "paper",
    )


def study_notes(model: str, hardware: str, options: MedusaStudyOptions, df: pd.DataFrame) -> list[str]:
    """The lines `sim roofline` prints for the same settings: which ones the card cannot hold
    (weights and KV cache per GPU after verification) and a tensor-parallel group wider than a node."""
    cost = study_cost_model(model, hardware, options)
    notes = (memory_fit_note(cost, df.assign(phase="verify")), tp_node_note(cost))
    return [note for note in notes if note]


def standard_sweeps(
    model: str,
    hardware: str,
    sweeps: MedusaSweeps = MedusaSweeps(),
    options: MedusaStudyOptions = MedusaStudyOptions(),
) -> pd.DataFrame:
    """The paper's three sweeps in one table, told apart by `sweep`: 'candidates' (Fig. 21, at
    batch/seq_len), 'batch' (Fig. 22, at seq_len) and 'seq_len' (Fig. 23, at seq_sweep_batch)."""
    w = sweeps
    grids = (
        ("candidates", [w.batch], [w.seq_len]),
        ("batch", w.batches, [w.seq_len]),
        ("seq_len", [w.seq_sweep_batch], w.seq_lens),
    )
    parts = [
        medusa_study(
            model, hardware, batches=batches, seq_lens=seq_lens, candidates=w.candidates, options=options
        ).assign(sweep=sweep)
        for sweep, batches, seq_lens in grids
    ]
    df = pd.concat(parts, ignore_index=True)
    return df[["sweep"] + STUDY_COLUMNS]


def best_candidates(df: pd.DataFrame) -> pd.DataFrame:
    """The row with the highest speedup for each (batch, seq_len)."""
    idx = df.groupby(["batch", "seq_len"], sort=True)["speedup"].idxmax()
    return df.loc[idx].reset_index(drop=True)


# ---- plots (Figs. 21-23) -------------------------------------------------------------------
def _setup_axes(ax, candidates) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(candidates))
    ax.set_xticklabels([str(int(c)) for c in candidates])
    ax.set_xlabel("candidate tokens per step")
    ax.grid(True, ls="-", lw=0.4, color="0.87")
    ax.axhline(1.0, color="0.45", lw=0.8, ls=":", zorder=1)


def _subtitle(df: pd.DataFrame) -> str:
    r = df.iloc[0]
    block = "simplified block (1 layer)" if r["block"] == "paper" else "whole model"
    return f"{r['hardware']}, {block}, {r['attention']} attention, rate: {r['rate_model']}"


def plot_candidates(df: pd.DataFrame, path: str | Path) -> Path:
    """Fig. 21: acceleration rate, speedup and normalized latency (= overhead) vs candidates
    at one (batch, seq_len)."""
    plt = agg_pyplot()

    d = df.sort_values("candidates")
    fig, ax = plt.subplots(figsize=(7.2, 4.6), dpi=150)
    ax.plot(d["candidates"], d["acceleration_rate"], "o-", color="#1f77b4", label="acceleration rate (tokens/step)")
    ax.plot(d["candidates"], d["overhead"], "s--", color="#7f7f7f", label="normalized latency (step time / decode)")
    ax.plot(d["candidates"], d["speedup"], "D-", color="#d62728", lw=2, label="speedup = rate / overhead")
    best = d.loc[d["speedup"].idxmax()]
    ax.annotate(
        f"best: {int(best['candidates'])} candidates, {best['speedup']:.2f}x",
        (best["candidates"], best["speedup"]),
        xytext=(0, -30),
        textcoords="offset points",
        ha="center",
        va="top",
        fontsize=9,
        bbox=dict(boxstyle="round,pad=0.25", fc="white", ec="0.7"),
        arrowprops=dict(arrowstyle="-", color="0.4", lw=0.8),
    )
    _setup_axes(ax, d["candidates"])
    ax.set_ylabel("ratio")
    ax.set_ylim(0, max(d[["acceleration_rate", "overhead", "speedup"]].max().max() * 1.15, 1.5))
    r = d.iloc[0]
    ax.set_title(
        f"Medusa on {r['model']}, batch {r['batch']}, sequence length {r['seq_len']}\n{_subtitle(d)}", fontsize=10.5
    )
    ax.legend(loc="upper left", fontsize=8.5, framealpha=0.9)
    return finish_figure(fig, path)


def _plot_lines(df: pd.DataFrame, path, by: str, label: str, title: str) -> Path:
    plt = agg_pyplot()

    keys = sorted(df[by].unique())
    cmap = plt.get_cmap("viridis")
    fig, ax = plt.subplots(figsize=(7.2, 4.6), dpi=150)
    for n, key in enumerate(keys):
        d = df[df[by] == key].sort_values("candidates")
        colour = cmap(n / max(1, len(keys) - 1) * 0.9)
        ax.plot(d["candidates"], d["speedup"], "o-", ms=4, color=colour, label=f"{label} {key}")
        best = d.loc[d["speedup"].idxmax()]
        ax.plot([best["candidates"]], [best["speedup"]], marker="*", ms=11, color=colour, mec="black", mew=0.6)
    _setup_axes(ax, sorted(df["candidates"].unique()))
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(f"{title}\n{_subtitle(df)}  (star: best per line)", fontsize=10.5)
    ax.legend(loc="best", fontsize=8, ncol=2, framealpha=0.9)
    return finish_figure(fig, path)


def plot_speedup_by_batch(df: pd.DataFrame, path: str | Path) -> Path:
    """Fig. 22: speedup vs candidates, one line per batch size (fixed sequence length)."""
    r = df.iloc[0]
    return _plot_lines(df, path, "batch", "batch", f"Medusa on {r['model']}, sequence length {r['seq_len']}")


def plot_speedup_by_seq(df: pd.DataFrame, path: str | Path) -> Path:
    """Fig. 23: speedup vs candidates, one line per sequence length (fixed batch)."""
    r = df.iloc[0]
    return _plot_lines(df, path, "seq_len", "seq", f"Medusa on {r['model']}, batch {r['batch']}")


def write_study(df: pd.DataFrame, out_dir: str | Path) -> dict[str, Path]:
    """CSV of a standard_sweeps table plus the three figures, staged and moved into place
    together (an interrupted study leaves the previous four files whole); returns name -> path."""
    out = Path(out_dir)
    paths = {
        "csv": out / "medusa_study.csv",
        "fig21": out / "fig21_candidates.png",
        "fig22": out / "fig22_speedup_by_batch.png",
        "fig23": out / "fig23_speedup_by_seq.png",
    }
    with staged_files(*paths.values()) as staged:
        df.to_csv(staged.path(paths["csv"]), index=False)
        plot_candidates(df[df["sweep"] == "candidates"], staged.path(paths["fig21"]))
        plot_speedup_by_batch(df[df["sweep"] == "batch"], staged.path(paths["fig22"]))
        plot_speedup_by_seq(df[df["sweep"] == "seq_len"], staged.path(paths["fig23"]))
    return paths
