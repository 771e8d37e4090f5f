"""The offload cases' cost model: the simulator's `OffloadCostModel` composition (per layer:
compute stages + the load of the policy's tokens + the store of the new ones, pipelined as the
workload's `overlap` says) with its two inputs calibrated on held-out offload executor runs
(other seeds, never the validated run):

  compute  `LinearStageCompute` (simulator/offload/calibrated.py): per-layer attention / FFN /
           prediction stage times linear in the batch's counts, fitted by non-negative least
           squares in relative error on the measured engine time *less the measured copy
           times* (each iteration's load and store seconds, timed by the executor)
  link     `HostLink`: per direction latency + bytes / rate per layer copy, fitted on the
           measured load and store seconds against the bytes each iteration moved

The features are counted from what the executor measured (tokens loaded per layer), so the fit
never sees the simulator's sparsity model; the prediction then counts them from the policy
(and, for InfiniGen, the recorded sparsity) on the executed batches — the validation checks
the composition and the token counts together.

Bracketed like the plain cases' fit (calibrate.py): one calibration run before the validated
run and one after (seeds 9013 and 9014, the case's own serving and offload sections), one fit
over both, and `speed_shift` = median measured/fitted after over before, less 1."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import read_columns, write_json
from infersim.simulator.offload.calibrated import LINEAR_TERMS, HostLink, LinearStageCompute
from infersim.simulator.workload.builder import build_requests

from .execute import CaseOptions, speed_from_ticks, speed_tick_s
from .measured import ExecRun, load_exec_run, stalls
from .modes import MODES

OFFLOAD_CALIBRATION_SEEDS = (9013, 9014)  # inside calibrate.py's reserved 9001-9016: never a validated seed
STALL_RATIO = 1.8  # a point at this many times the fit or more is a stall, not the model's


@dataclass
class OffloadRunData:
    """An offload executor run with per-iteration measured copies and the fit's features."""

    run: ExecRun
    load_s: np.ndarray
    store_s: np.ndarray
    loaded_bytes: np.ndarray
    stored_bytes: np.ndarray
    features: np.ndarray  # (iterations, len(LINEAR_TERMS))
    layers: int


def load_offload_run(path: Path, predicts: bool) -> OffloadRunData:
    run = load_exec_run(path)
    oi = read_columns(Path(path) / "offload_iterations.parquet", "an offload executor run directory")
    ol = read_columns(Path(path) / "offload_layers.parquet", "an offload executor run directory")
    n = len(run.shapes)
    if oi["iteration"].size != n:
        raise InfersimError(f"{path}: offload_iterations.parquet has {oi['iteration'].size} rows for {n} iterations")
    L = int(ol["layer"].max()) + 1 if ol["layer"].size else 1
    loaded = np.zeros((n, L))
    loaded[np.searchsorted(oi["iteration"], ol["iteration"]), ol["layer"]] = ol["loaded_tokens"]
    X = np.zeros((n, len(LINEAR_TERMS)))
    col = {k: j for j, k in enumerate(LINEAR_TERMS)}
    for k, s in enumerate(run.shapes):
        q, c = s.query_tokens.astype(np.float64), s.context_tokens.astype(np.float64)
        dec = (q == 1) & (c > 0)
        X[k, col["const"]] = 1.0
        X[k, col["decode_seq"]] = dec.sum()
        X[k, col["prefill_seq"]] = (~dec).sum()
        X[k, col["prefill_token"]] = q[~dec].sum()
        # keys and query-key pairs summed over layers: the loaded tokens + the new ones
        X[k, col["key"]] = loaded[k].sum() + L * q.sum()
        X[k, col["pair"]] = loaded[k].sum() + L * (dec.sum() + (q[~dec] ** 2).sum())
        X[k, col["logit"]] = s.logit_tokens.sum()
        if predicts:
            X[k, col["pred_context"]] = c[dec].sum()
    return OffloadRunData(run, oi["load_s"], oi["store_s"], oi["loaded_bytes"], oi["stored_bytes"], X, L)


def compute_targets(d: OffloadRunData) -> np.ndarray:
    """Engine time less the iteration's own measured copies (NaN where the engine idled)."""
    return d.run.iteration_period_s - d.load_s - d.store_s


def nnls_relative(X: np.ndarray, y: np.ndarray, rounds: int = 3, trim: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """X c ~ y, c >= 0, in relative error; refitted a few times without the worst `trim` and
    the stalls (points at STALL_RATIO x the fit or more). Returns (c, kept)."""
    keep = np.isfinite(y) & (y > 0)
    coef = np.zeros(X.shape[1])
    if not keep.any():
        return coef, keep
    scale = np.maximum(np.abs(X[keep]).max(axis=0), 1e-30)
    for _ in range(rounds):
        A = (X[keep] / scale) / y[keep, None]
        cs, _ = nnls(A, np.ones(int(keep.sum())), maxiter=50 * X.shape[1])
        coef = cs / scale
        pred = X @ coef
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.abs(pred - y) / y
        cut = np.quantile(rel[keep], 1.0 - trim)
        keep = keep & (rel <= cut) & (y < STALL_RATIO * np.maximum(pred, 1e-12))
    return coef, keep


def _fit_link(datas: list[OffloadRunData]) -> tuple[HostLink, dict]:
    """Per direction: seconds = layers copied x latency + bytes / rate."""
    out, info = {}, {}
    for d_name, sec, nb in (("h2d", "load_s", "loaded_bytes"), ("d2h", "store_s", "stored_bytes")):
        y = np.concatenate([getattr(d, sec) for d in datas])
        b = np.concatenate([getattr(d, nb) for d in datas])
        layers = np.concatenate([np.where(getattr(d, nb) > 0, d.layers, 0) for d in datas]).astype(np.float64)
        m = b > 0
        if m.sum() < 3:
            raise InfersimError(f"offload calibration: fewer than 3 iterations with {d_name} copies to fit")
        X = np.column_stack([layers[m], b[m]])
        c, _ = nnls_relative(X, y[m])
        lat = float(c[0])
        rate = 1.0 / float(c[1]) if c[1] > 0 else 1.0 / max(float(np.median(y[m] / b[m])), 1e-15)
        pred = X @ c
        out[d_name] = (lat, rate)
        info[d_name] = {
            "latency_s": lat,
            "bytes_per_s": rate,
            "points": int(m.sum()),
            "mape_in_sample": float(np.mean(np.abs(pred - y[m]) / y[m])),
        }
    return HostLink(out["h2d"][0], out["h2d"][1], out["d2h"][0], out["d2h"][1]), info


@dataclass
class OffloadFit:
    compute: LinearStageCompute
    link: HostLink
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"compute": self.compute.to_json(), "link": self.link.to_json(), "meta": self.meta}

    def save(self, path: Path) -> None:
        write_json(Path(path), self.to_json())

    @classmethod
    def from_json(cls, d: dict) -> "OffloadFit":
        try:
            return cls(LinearStageCompute(d["compute"]["coef"]), HostLink(**d["link"]), dict(d.get("meta", {})))
        except (KeyError, TypeError) as exc:
            raise InfersimError(f"offload fit: malformed ({exc})") from None

    @classmethod
    def load(cls, path: Path) -> "OffloadFit":
        path = Path(path)
        if not path.is_file():
            raise InfersimError(f"offload fit not found: {path}")
        return cls.from_json(json.loads(path.read_text()))

    def scaled_compute(self, factor: float, why: str = "") -> "OffloadFit":
        """The compute times multiplied by factor (the machine's speed changed by 1/factor); the
        host link's copies as fitted."""
        f = float(factor)
        return OffloadFit(
            LinearStageCompute({k: v * f for k, v in self.compute.coef.items()}),
            self.link,
            {**self.meta, "scaled_by": f, "scaled_because": why},
        )

    def predict_compute(self, X: np.ndarray) -> np.ndarray:
        return X @ np.array([self.compute.coef[k] for k in LINEAR_TERMS])


def fit_offload(datas: list[OffloadRunData], meta: dict | None = None) -> OffloadFit:
    X = np.vstack([d.features for d in datas])
    y = np.concatenate([compute_targets(d) for d in datas])
    coef, kept = nnls_relative(X, y)
    ok = np.isfinite(y) & (y > 0)
    pred = X[ok] @ coef
    total_meas = np.concatenate([d.run.iteration_period_s for d in datas])[ok]
    link, link_info = _fit_link(datas)
    # in-sample error of the whole iteration (compute + the fitted copies), as the validation judges it
    full = pred + np.concatenate([_link_pred(link, d) for d in datas])[ok]
    st = np.concatenate([stalls(d.run.iteration_period_s, d.run.shapes)[0] for d in datas])
    fit = OffloadFit(LinearStageCompute(dict(zip(LINEAR_TERMS, coef.tolist()))), link, dict(meta or {}))
    fit.meta.update(
        {
            "iteration_fit": {
                "points": int(ok.sum()),
                "kept": int(kept.sum()),
                "mape_in_sample": float(np.mean(np.abs(full - total_meas) / total_meas)),
                "compute_mape_in_sample": float(np.mean(np.abs(pred - y[ok]) / y[ok])),
                "stalls": float(np.mean(st[ok])),
            },
            "link_fit": link_info,
        }
    )
    return fit


def _link_pred(link: HostLink, d: OffloadRunData) -> np.ndarray:
    lb, sb = d.loaded_bytes, d.stored_bytes
    return np.where(lb > 0, d.layers * link.h2d_latency_s + lb / link.h2d_bytes_per_s, 0.0) + np.where(
        sb > 0, d.layers * link.d2h_latency_s + sb / link.d2h_bytes_per_s, 0.0
    )


def calibration_spec(spec, seed: int):
    """The validated workload with other requests: same serving and offload sections and
    length distributions, another seed."""
    return spec.model_copy(update={"seed": int(seed), "name": f"calib-offload-{seed}"})


def calibrate_offload_around(
    run,
    spec,
    model: str,
    out_dir: Path,
    opts: CaseOptions = CaseOptions(),
    validated_dir: Path | None = None,
) -> OffloadFit:
    """Calibration run (seed 9013) / `run()` (the validated one) / calibration run (9014),
    one fit over both calibration runs. With speed ticks in all three runs (`validated_dir` the
    validated run's folder), the compute is scaled to the validated run's own speed as
    calibrate.calibrate_around does (its tick level times the calibration runs' median
    measured/fitted ratio per tick)."""
    mode = MODES.get("offload")
    if spec.offload is not None and spec.offload.overlap != "none":
        raise InfersimError(
            f"workload {spec.name}: offload.overlap '{spec.offload.overlap}': the offload calibration "
            f"separates compute from copies by subtracting each iteration's measured copy time, which "
            f"holds for the sequential pipeline only (overlap: none, as the CPU executor runs)"
        )
    out_dir = Path(out_dir)
    predicts = spec.offload is not None and spec.offload.policy == "infinigen"
    dirs = {}
    for side, seed in (("before", OFFLOAD_CALIBRATION_SEEDS[0]), ("after", OFFLOAD_CALIBRATION_SEEDS[1])):
        if side == "after":
            run()
        cs = calibration_spec(spec, seed)
        d = out_dir / side
        if opts.log:
            opts.log(f"offload calibration run (seed {seed}, {side} the validated run)")
        mode.run(cs, build_requests(cs), model, d, opts)
        dirs[side] = d
    datas = {k: load_offload_run(v, predicts) for k, v in dirs.items()}
    exec_meta = datas["before"].run
    fit = fit_offload(
        list(datas.values()),
        {
            "workloads": [f"calib-offload-{s}" for s in OFFLOAD_CALIBRATION_SEEDS],
            "seeds": list(OFFLOAD_CALIBRATION_SEEDS),
            "model": exec_meta.model,
            "device": exec_meta.device,
            "bracketed": True,
            "policy": spec.offload.policy if spec.offload is not None else None,
        },
    )
    ratio = {}
    for side, d in datas.items():
        y = d.run.iteration_period_s
        p = fit.predict_compute(d.features) + _link_pred(fit.link, d)
        ok = np.isfinite(y) & (p > 0)
        ratio[side] = float(np.median(y[ok] / p[ok])) if ok.any() else float("nan")
    fit.meta["speed_ratio_before"], fit.meta["speed_ratio_after"] = ratio["before"], ratio["after"]
    fit.meta["speed_shift"] = ratio["after"] / ratio["before"] - 1.0

    ticks = [speed_tick_s(d) for d in dirs.values()]
    tick_val = speed_tick_s(validated_dir) if validated_dir is not None and opts.device == "cpu" else float("nan")
    speed = speed_from_ticks([ratio[k] for k in dirs], ticks, tick_val)
    if np.isfinite(speed.speed):
        fit = fit.scaled_compute(speed.speed, speed.note)
        fit.meta["speed_ticks_s"] = {"calibration": ticks, "validated": tick_val, "tick_weight": speed.tick_weight}
    fit.save(out_dir / "offload-fit.json")
    return fit


__all__ = [
    "OFFLOAD_CALIBRATION_SEEDS",
    "OffloadFit",
    "OffloadRunData",
    "calibrate_offload_around",
    "fit_offload",
    "load_offload_run",
]
