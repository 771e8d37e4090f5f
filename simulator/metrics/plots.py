"""Plots of one run directory: latency CDFs, batch size and KV use over time, throughput."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from ..yamlio import atomic_path


def agg_pyplot():
    """matplotlib.pyplot on the file-only Agg backend, its settings left as they are."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pyplot(**rc):
    """matplotlib.pyplot on the file-only Agg backend, in the project's style (a fixed SVG hash
    salt, so the same figure gives the same bytes); `rc` overrides settings (dots per inch, font)."""
    plt = agg_pyplot()
    plt.rcParams.update(
        {
            "figure.dpi": 110,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "svg.hashsalt": "infersim",
            "axes.spines.top": False,
            "axes.spines.right": False,
            **rc,
        }
    )
    return plt


# fixed metadata (no matplotlib version) and a tight box: identical inputs give identical PNGs
REPRODUCIBLE_PNG = {"metadata": {"Software": None}, "bbox_inches": "tight"}


def write_figure(fig, path: str | Path, **savefig) -> None:
    """Save atomically, in the format of the file's suffix; `savefig` goes to Figure.savefig."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=Path(path).suffix.lstrip(".") or "png", **savefig)


def finish_figure(fig, path: str | Path, **savefig) -> Path:
    """The end of every plot function: the layout tightened, the figure saved atomically
    (`savefig` as Figure.savefig's, e.g. dpi or REPRODUCIBLE_PNG) and closed; returns the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    write_figure(fig, path, **savefig)
    plt.close(fig)
    return Path(path)


def _cdf(ax, values: np.ndarray, label: str, scale: float = 1.0) -> None:
    v = np.sort(values[np.isfinite(values)]) * scale
    if v.size:
        ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label)
    else:  # every request aborted: an empty panel that says why
        ax.text(0.5, 0.5, "no request finished", ha="center", va="center", transform=ax.transAxes, color="grey")


def _time_weighted(t0: np.ndarray, t1: np.ndarray, values, bins: int = 400):
    """Time-weighted means of piecewise-constant series on a regular grid: a busy run has
    millions of iterations, far more than pixels."""
    edges = np.linspace(t0.min(), max(t1.max(), t0.min() + 1e-9), bins + 1)
    lo = np.clip(np.searchsorted(edges, t0, side="right") - 1, 0, bins - 1)
    dur = t1 - t0
    wsum = np.bincount(lo, weights=dur, minlength=bins)
    out = [np.bincount(lo, weights=dur * v, minlength=bins) / np.where(wsum > 0, wsum, np.nan) for v in values]
    return (edges[:-1] + edges[1:]) / 2, out


def plot_run(run_dir: Path) -> list[Path]:
    plt = pyplot()
    run_dir = Path(run_dir)
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    req = pq.read_table(run_dir / "requests.parquet").to_pydict()
    req = {k: np.asarray(v, dtype=float) for k, v in req.items()}
    made = []

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, (col, title, scale, unit) in zip(
        axes,
        (
            ("ttft_s", "time to first token", 1.0, "s"),
            ("tpot_s", "time per output token", 1e3, "ms"),
            ("e2e_s", "end-to-end latency", 1.0, "s"),
        ),
    ):
        _cdf(ax, req[col], title, scale)
        for p, ls in ((50, ":"), (99, "--")):
            finite = req[col][np.isfinite(req[col])]
            if finite.size:
                x = np.percentile(finite, p) * scale
                ax.axvline(x, color="grey", ls=ls, lw=1)
                ax.annotate(
                    f"p{p} {x:.3g}",
                    (x, 0.05 if p == 50 else 0.15),
                    fontsize=8,
                    color="grey",
                    xytext=(3, 0),
                    textcoords="offset points",
                )
        ax.set_xlabel(f"{title} ({unit})")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.01)
    fig.suptitle("latency CDFs")
    made.append(finish_figure(fig, out / "latency_cdf.png", **REPRODUCIBLE_PNG))

    series_path = run_dir / "series.parquet"
    s = pq.read_table(series_path).to_pydict() if series_path.exists() else {}
    s = {k: np.asarray(v, dtype=float) for k, v in s.items()}
    if s and s["t_start_s"].size:  # no segment at all when every request was aborted before running
        fig, (a1, a2) = plt.subplots(2, 1, figsize=(11, 5.2), sharex=True)
        multi = s["replica"].max() > 0
        for rep in np.unique(s["replica"]):
            sel = s["replica"] == rep
            grid, means = _time_weighted(
                s["t_start_s"][sel],
                s["t_end_s"][sel],
                (
                    s["batch_size"][sel],
                    s["gpu_blocks_used"][sel],
                    s["cpu_blocks_used"][sel],
                    s.get("gpu_blocks_cached", np.zeros_like(s["batch_size"]))[sel],
                ),
            )
            lab = f"replica {int(rep)}" if multi else None
            a1.plot(grid, means[0], lw=1, label=lab)
            a2.plot(grid, means[1], lw=1, label=lab or "GPU")
            if means[2].max() > 0:
                a2.plot(grid, means[2], lw=1, ls="--", label=None if multi else "CPU (swapped out)")
            if np.nanmax(means[3], initial=0) > 0:  # prefix caching: blocks holding cached prefixes
                a2.plot(grid, means[3], lw=1, ls=":", label=None if multi else "GPU, prefix-cached")
        a1.set_ylabel("batch size\n(time-weighted)")
        a2.set_ylabel("KV blocks in use")
        a2.set_xlabel("simulated time (s)")
        a2.legend(loc="upper right", fontsize=8)
        fig.suptitle("batch size and KV-cache use over time")
        made.append(finish_figure(fig, out / "timeline.png", **REPRODUCIBLE_PNG))

    ok = np.isfinite(req["e2e_s"])
    if ok.any():
        finish = req["finish_s"][ok]
        tokens = req["output_tokens"][ok]
        span = max(finish.max(), 1e-9)
        bins = np.linspace(0, span, min(100, max(10, int(ok.sum() // 20))) + 1)
        tok, _ = np.histogram(finish, bins=bins, weights=tokens)
        cnt, _ = np.histogram(finish, bins=bins)
        width = bins[1] - bins[0]
        fig, ax = plt.subplots(figsize=(11, 3.4))
        ax.plot(bins[:-1] + width / 2, tok / width, label="output tokens/s")
        ax2 = ax.twinx()
        ax2.plot(bins[:-1] + width / 2, cnt / width, color="tab:orange", lw=0.8, label="requests/s")
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("output tokens/s")
        ax2.set_ylabel("requests finished/s")
        fig.legend(loc="upper right", fontsize=8)
        ax.set_title("throughput over time (by finish time)")
        made.append(finish_figure(fig, out / "throughput.png", **REPRODUCIBLE_PNG))
    if "transfer_s" in req:  # a disaggregated run: where each request's time went
        fig, ax = plt.subplots(figsize=(8, 3.6))
        for col in ("queueing_s", "prefill_s", "transfer_wait_s", "transfer_s", "decode_queueing_s", "decode_s"):
            _cdf(ax, req[col], col[:-2].replace("_", " "), 1e3)
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_xlabel("time (ms)")
        ax.set_ylabel("fraction of requests")
        ax.legend(fontsize=8)
        ax.set_title("per-request phases (disaggregated)")
        made.append(finish_figure(fig, out / "disaggregation_phases.png", **REPRODUCIBLE_PNG))
    return made
