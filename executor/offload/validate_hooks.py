"""The validation matrix's hooks for the offload executor (analysis/validate/modes.py):

execute(spec, requests, model, out, opts)  serve.py's `sim exec` for an `offload:` workload
recorded_statistics(run_dir) -> dict       what the run measured that the simulator takes as
                                           input: tokens loaded per layer by context (the
                                           sparsity the policy used: H2O's budget, InfiniGen's
                                           selected tokens per layer), bytes per iteration,
                                           the host pool; for InfiniGen a sparsity file
                                           `recorded_sparsity.yaml` written into the run dir
simulator_updates(stats) -> dict           {"offload": {"pool_blocks": ..., "sparsity": <path>}}
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import yaml

from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import read_columns, write_yaml
from infersim.simulator.offload.policies import InfiniGenParams

from .serve import execute  # noqa: F401  (the hook)

SPARSITY_FILE = "recorded_sparsity.yaml"
CONTEXT_BINS = 8


def binned_tokens(context: np.ndarray, tokens: np.ndarray, bins: int = CONTEXT_BINS) -> tuple[list, list]:
    """(geometric-mean context, mean tokens) over up to `bins` bins of equal counts, contexts
    strictly increasing."""
    order = np.argsort(context, kind="stable")
    c, t = np.asarray(context, dtype=np.float64)[order], np.asarray(tokens, dtype=np.float64)[order]
    cs, ts = [], []
    for part_c, part_t in zip(np.array_split(c, min(bins, c.size)), np.array_split(t, min(bins, c.size))):
        if part_c.size == 0:
            continue
        x = float(np.exp(np.log(np.maximum(part_c, 1.0)).mean()))
        if cs and x <= cs[-1]:  # equal contexts across a bin edge: merge
            n_prev = ts[-1][1]
            ts[-1] = ((ts[-1][0] * n_prev + part_t.sum()) / (n_prev + part_t.size), n_prev + part_t.size)
            continue
        cs.append(x)
        ts.append((float(part_t.mean()), part_t.size))
    return cs, [m for m, _ in ts]


def recorded_statistics(run_dir) -> dict:
    run_dir = Path(run_dir)
    summary_cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    off = summary_cfg.get("offload_executor") or {}
    if not off:
        raise InfersimError(f"{run_dir}: no offload_executor entry in config.yaml (not an offload executor run)")
    it = read_columns(run_dir / "offload_iterations.parquet", "an offload executor run directory")
    counts = read_columns(run_dir / "offload_counts.parquet", "an offload executor run directory")
    layers = int(
        summary_cfg.get("model", {}).get("num_layers")
        or (int(counts["layer"].max()) + 1 if counts["layer"].size else 0)
    )
    stats = {
        "policy": off["policy"],
        "params": off.get("params", {}),
        "pool_blocks": int(off["pool_blocks"]),
        "iterations": int(it["iteration"].size),
        "loaded_bytes_total": float(it["loaded_bytes"].sum()),
        "stored_bytes_total": float(it["stored_bytes"].sum()),
        "loaded_bytes_per_iteration_mean": float(it["loaded_bytes"].mean()) if it["loaded_bytes"].size else 0.0,
        "load_s_total": float(it["load_s"].sum()),
        "store_s_total": float(it["store_s"].sum()),
        "tokens_loaded": {},
    }
    # tokens loaded per decoding sequence, per layer, by context: the sparsity the policy used
    for layer in sorted(set(int(x) for x in counts["layer"])):
        sel = counts["layer"] == layer
        cs, ts = binned_tokens(counts["context"][sel], counts["loaded"][sel])
        stats["tokens_loaded"][str(layer)] = {"context": cs, "tokens": ts}
    if off["policy"] == "infinigen":
        stats["sparsity_file"] = str(_write_sparsity(run_dir, counts, off, layers))
    return stats


def _write_sparsity(run_dir: Path, counts: dict, off: dict, layers: int) -> Path:
    """The tokens InfiniGen loaded, as simulator sparsity data: one table at the run's alpha
    (mean over the selective layers, by context) and layer_scale (each selective layer's share;
    1 below start_layer, where everything held loads). The simulator rounds the interpolated
    count up, so the table holds the mean less half a token (the mean of ceil(x) over x is
    about x + 0.5); the cap it applies again is then a no-op, as the counts are already capped."""
    p = InfiniGenParams.model_validate(dict(off.get("params") or {}))
    sel = counts["layer"] >= p.start_layer
    if not sel.any():
        raise InfersimError(f"{run_dir}: the InfiniGen run decoded no token at a selective layer: nothing to record")
    cs, ts = binned_tokens(counts["context"][sel], counts["loaded"][sel])
    overall = float(counts["loaded"][sel].mean())
    scale = []
    for layer in range(layers):
        m = counts["layer"] == layer
        scale.append(
            1.0 if layer < p.start_layer or not m.any() else max(1e-3, float(counts["loaded"][m].mean()) / overall)
        )
    doc = {
        "name": f"recorded-{run_dir.name}",
        "model": str(run_dir),
        "source": f"recorded by the offload executor (executor/offload/validate_hooks.py) in {run_dir}: tokens "
        f"InfiniGen loaded per decoding sequence and layer, {int(sel.sum())} (sequence, step, layer) "
        f"samples, binned by context",
        "important_tokens": [
            {
                "alpha": float(p.alpha),
                "context": [round(x, 3) for x in cs],
                "tokens": [round(max(1.0, t - 0.5), 4) for t in ts],
                "source": "mean tokens loaded over the selective layers less 0.5 (the simulator " "rounds up)",
            }
        ],
        "layer_scale": [round(x, 5) for x in scale],
        "layer_scale_source": "each selective layer's mean tokens loaded over the mean of all selective layers",
    }
    path = run_dir / SPARSITY_FILE
    tmp = path.with_name(path.name + ".tmp")
    write_yaml(tmp, doc)
    os.replace(tmp, path)  # atomic: the run directory is never left with half a file
    return path


def simulator_updates(stats: dict) -> dict:
    up = {"pool_blocks": int(stats["pool_blocks"])}
    if stats.get("sparsity_file"):
        up["sparsity"] = str(stats["sparsity_file"])
    if not math.isfinite(float(stats.get("loaded_bytes_total", 0.0))):
        raise InfersimError("recorded offload statistics hold a non-finite byte count")
    return {"offload": up}


__all__ = ["execute", "recorded_statistics", "simulator_updates"]
