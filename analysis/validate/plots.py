"""The validation plots: predicted against measured per iteration, overlaid timelines of
batch size and KV use, latency CDFs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from infersim.analysis.report_html import save_figure
from infersim.simulator.metrics.plots import pyplot

MEASURED, PREDICTED = "#2e86ab", "#e07a5f"


def scatter_iterations(cmp, path: Path) -> Path:
    """Per executed iteration: the cost model's time on its exact batch against the measured one."""
    plt = pyplot()
    cm = cmp.cost_model
    p = np.asarray(cm["predicted_s"], dtype=np.float64) * 1e3
    m = np.asarray(cm["measured_s"], dtype=np.float64) * 1e3
    b = np.asarray(cm["batch_size"])
    ok = np.isfinite(m)
    fig, ax = plt.subplots(figsize=(5.6, 4.8))
    sc = ax.scatter(m[ok], p[ok], c=b[ok], s=8, cmap="viridis", alpha=0.7, linewidths=0)
    fig.colorbar(sc, ax=ax, label="sequences in the batch")
    if ok.any():
        lo, hi = float(min(m[ok].min(), p[ok].min())), float(max(m[ok].max(), p[ok].max()))
        xs = np.array([lo, hi])
        ax.plot(xs, xs, color="k", lw=1, label="exact")
        ax.fill_between(xs, xs * 0.9, xs * 1.1, color="k", alpha=0.08, label="±10%")
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("measured iteration time (ms)")
    ax.set_ylabel("predicted on the same batch (ms)")
    ax.set_title(f"{cmp.case}: per iteration (MAPE {cm['mape']:.1%})", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    save_figure(fig, path)
    plt.close(fig)
    return path


def timelines(exec_run, sim_run, path: Path) -> Path:
    """Batch size and KV blocks in use over time, measured and simulated, overlaid."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(8.5, 5.2), sharex=True)
    for run, label, color in ((exec_run, "measured", MEASURED), (sim_run, "simulated", PREDICTED)):
        s = run.series
        t = np.asarray(s["t_start_s"], dtype=np.float64) * 1e3
        axes[0].step(t, s["batch_size"], where="post", color=color, lw=1, label=label, alpha=0.85)
        axes[1].step(
            t,
            np.asarray(s["gpu_blocks_used"]) / max(1, run.gpu_blocks) * 100,
            where="post",
            color=color,
            lw=1,
            label=label,
            alpha=0.85,
        )
    axes[0].set_ylabel("batch size")
    axes[1].set_ylabel("KV blocks in use (%)")
    axes[1].set_xlabel("time (ms)")
    axes[0].legend(fontsize=8, loc="upper right")
    save_figure(fig, path)
    plt.close(fig)
    return path


def latency_cdfs(cmp, path: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for ax, (col, label) in zip(axes, (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "end-to-end"))):
        r = cmp.requests.get(col, {})
        for key, name, color in (
            ("measured_values", "measured", MEASURED),
            ("predicted_values", "simulated", PREDICTED),
        ):
            x = np.asarray(r.get(key, []), dtype=np.float64)
            x = np.sort(x[np.isfinite(x)]) * 1e3
            if x.size:
                ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", color=color, label=name)
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylim(0, 1.02)
    axes[0].set_ylabel("fraction of requests")
    axes[0].legend(fontsize=8, loc="lower right")
    save_figure(fig, path)
    plt.close(fig)
    return path
