"""A pipelined run's stage timeline in the run folder: `stages.parquet` (one row per batch per
stage: replica, stage, virtual engine, start, end) and `plots/stages.png` (each stage's busy
share over time, and a close-up of the stages' occupancy where bubbles and imbalance show)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..metrics.plots import REPRODUCIBLE_PNG, finish_figure, pyplot
from ..metrics.rundir import read_columns, write_table
from .replica import PipelineReplica

CLOSEUP_BATCHES = 24  # batches per stage in the close-up panel


def write_stage_timeline(sim, run_dir: Path) -> Path | None:
    """stages.parquet for a simulation with pipelined replicas; None otherwise."""
    tables = [r.stage_table() for r in sim.replicas if isinstance(r, PipelineReplica)]
    if not tables:
        return None
    path = Path(run_dir) / "stages.parquet"
    write_table(path, {c: np.concatenate([t[c] for t in tables]) for c in tables[0]})
    return path


def busy_until(start_s: np.ndarray, end_s: np.ndarray, t_s: np.ndarray) -> np.ndarray:
    """Busy time of one stage from the start up to each time in t_s; its intervals do not
    overlap and come in order (a stage takes batches one at a time, in issue order)."""
    cum = np.concatenate(([0.0], np.cumsum(end_s - start_s)))
    i = np.searchsorted(start_s, t_s, side="right")  # intervals begun by t
    ongoing = np.where(i > 0, np.maximum(0.0, end_s[np.maximum(i - 1, 0)] - t_s), 0.0)
    return cum[i] - ongoing


def plot_stages(run_dir: Path) -> list[Path]:
    """The stage panel of a run folder that has stages.parquet."""
    run_dir = Path(run_dir)
    if not (run_dir / "stages.parquet").is_file():
        return []
    t = read_columns(run_dir / "stages.parquet", "a pipelined run folder")
    sel = t["replica"] == 0
    stage, ve, a, b = t["stage"][sel], t["virtual_engine"][sel], t["t_start_s"][sel], t["t_end_s"][sel]
    if not a.size:
        return []
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 5.6))
    stages = int(stage.max()) + 1
    edges = np.linspace(a.min(), b.max(), 201)
    width = edges[1] - edges[0]
    for s in range(stages):
        m = stage == s
        top.plot(edges[:-1] + width / 2, np.diff(busy_until(a[m], b[m], edges)) / width, lw=1, label=f"stage {s}")
    top.set_ylim(0, 1.05)
    top.set_ylabel("busy share")
    top.set_xlabel("simulated time (s)")
    top.legend(loc="lower right", fontsize=8)
    top.set_title("replica 0: each stage's busy share over time (the rest is bubble)")
    # close-up: the middle of the run, CLOSEUP_BATCHES batches of stage 0 and what overlaps them
    first = np.flatnonzero(stage == 0)
    mid = first[len(first) // 2 : len(first) // 2 + CLOSEUP_BATCHES]
    lo, hi = a[mid].min(), b[mid].max()
    win = (b > lo) & (a < hi)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for s_, v_, a_, b_ in zip(stage[win], ve[win], a[win], b[win]):
        bottom.barh(s_, (b_ - a_) * 1e3, left=(a_ - lo) * 1e3, color=colors[int(v_) % len(colors)], linewidth=0)
    bottom.set_yticks(range(stages))
    bottom.set_yticklabels([f"stage {s}" for s in range(stages)])
    bottom.invert_yaxis()
    bottom.set_xlabel(f"ms after {lo:.3f} s (colour: virtual engine)")
    bottom.set_title("close-up: batches on the stages; gaps are bubbles")
    out = run_dir / "plots" / "stages.png"
    out.parent.mkdir(exist_ok=True)
    return [finish_figure(fig, out, **REPRODUCIBLE_PNG)]
