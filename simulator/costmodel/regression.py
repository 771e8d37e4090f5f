"""Step-time cost model from a measured profile (AdaptiveLLM 3.2-3.3), and the portable,
versioned form of the fitted regressors it uses. NumPy only: the simulator never needs
PyTorch or scikit-learn to use a profile.

A profile measured by `sim profile` is a hardware YAML plus a sidecar `<name>.calib.json`
holding what the HardwareProfile schema has no field for: the measured curves and the
step-time regressors. The YAML names the sidecar and its SHA-256 in `sources`:

    sources:
      calibration: cpu-reference.calib.json           # relative to the profile's folder
      calibration.sha256: 3f2a...                     # checked before anything is read

A sidecar whose hash differs is refused with a one-line error. The regressors are stored as
plain numbers (coefficients and polynomial powers for the linear family; node arrays for
trees, forests and boosting; training points for k-NN), never as pickles, so loading one runs
no code from the file.

RegressionCostModel: the iteration time of a batch is the fitted step-time predictor at the
batch's (layers, hidden size, tokens per request, batch size), sampled once per model onto a
grid in (tokens, batch) and made monotone there, then carried to the actual model and batch
by the calibrated roofline:

    time(M, B) = R(L', h', t', b') x roofline_M(B) / roofline_ref(L', h', t', b')

where (L', h', t', b') is the batch's representative setting clamped into the measured
domain and `ref` the profiled transformer of that size. Inside the domain, for the profiled
family and a uniform batch, the ratio is 1 and the time is the regressor's; outside it (a
7B model on a profile of small transformers, a mixed batch, another MLP shape, tensor
parallelism) the roofline supplies the relative change. Transfers use the measured copy
bandwidths (latency + bytes / bandwidth, per direction)."""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from itertools import combinations_with_replacement
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InfersimError
from ..hardware.profile import HardwareProfile
from ..models.dtypes import bytes_per_element
from ..models.spec import ModelSpec
from .base import CostModel, Direction
from .batch import BatchShape, BatchTotals
from .calibration_file import calibration_for
from .roofline import RooflineCostModel

REGRESSOR_FORMAT = "infersim-regressor"
REGRESSOR_VERSION = 1
FEATURES = ("layers", "hidden", "tokens", "batch")


# ---- arrays as text -------------------------------------------------------------------------
def pack_array(a: np.ndarray) -> dict:
    """Exact, compact and portable: little-endian bytes, zlib, base64, with dtype and shape."""
    a = np.ascontiguousarray(a)
    dt = a.dtype.newbyteorder("<")
    raw = a.astype(dt, copy=False).tobytes()
    return {"dtype": dt.str, "shape": list(a.shape), "zlib_b64": base64.b64encode(zlib.compress(raw, 9)).decode()}


def unpack_array(d: dict) -> np.ndarray:
    dt = np.dtype(d["dtype"])
    if dt.kind not in "iuf":  # numbers only: no object arrays
        raise ValueError(f"refusing array dtype {d['dtype']}")
    raw = zlib.decompress(base64.b64decode(d["zlib_b64"]))
    return np.frombuffer(raw, dtype=dt).reshape(d["shape"]).astype(dt.newbyteorder("="))


# ---- the feature transform shared by fitting and prediction --------------------------------
def poly_powers(n_features: int, degree: int) -> np.ndarray:
    """Exponent rows of every monomial of total degree 0..degree, in scikit-learn's
    PolynomialFeatures order (bias, then by degree, then lexicographic combinations)."""
    rows = []
    for deg in range(degree + 1):
        for combo in combinations_with_replacement(range(n_features), deg):
            r = [0] * n_features
            for j in combo:
                r[j] += 1
            rows.append(r)
    return np.array(rows, dtype=np.int64)


def design_matrix(X: np.ndarray, mean: np.ndarray, scale: np.ndarray, powers: np.ndarray) -> np.ndarray:
    """log features, standardised, expanded into monomials."""
    Z = (np.log(np.asarray(X, dtype=np.float64)) - mean) / scale
    out = np.ones((Z.shape[0], powers.shape[0]), dtype=np.float64)
    for c, row in enumerate(powers):
        for j, p in enumerate(row):
            if p:
                out[:, c] *= Z[:, j] ** int(p)
    return out


# ---- portable regressors ------------------------------------------------------------------------
def _tree_apply(tree: dict, Xf: np.ndarray) -> np.ndarray:
    """Leaf values of a scikit-learn-style tree: go left when x[feature] <= threshold, with
    the features in float32 as scikit-learn compares them."""
    left, right, feat, thr, val = tree["left"], tree["right"], tree["feature"], tree["threshold"], tree["value"]
    node = np.zeros(Xf.shape[0], dtype=np.int64)
    rows = np.arange(Xf.shape[0])
    while True:
        active = left[node] >= 0
        if not active.any():
            return val[node]
        f = feat[node[active]]
        go_left = Xf[rows[active], f] <= thr[node[active]]
        node[active] = np.where(go_left, left[node[active]], right[node[active]])


class PortableRegressor:
    """A fitted regressor as plain arrays, with the transform it was fitted under."""

    def __init__(self, spec: dict):
        self.spec = spec
        if spec.get("format") != REGRESSOR_FORMAT or int(spec.get("version", -1)) != REGRESSOR_VERSION:
            raise InfersimError(
                f"unsupported regressor format {spec.get('format')!r} version {spec.get('version')!r} "
                f"(this infersim reads {REGRESSOR_FORMAT} v{REGRESSOR_VERSION})"
            )
        self.kind = spec["kind"]
        if self.kind == "physical":
            # time = intercept + coef . features, in raw units (no log transform): the
            # affine + quadratic-in-tokens model of a prefill, fitted with coefficients >= 0
            self.coef = unpack_array(spec["model"]["coef"]).astype(np.float64)
            self.intercept = float(spec["model"]["intercept"])
            return
        t = spec["transform"]
        self.mean, self.scale = np.asarray(t["mean"], dtype=np.float64), np.asarray(t["scale"], dtype=np.float64)
        self.powers = np.asarray(spec["powers"], dtype=np.int64)
        m = spec["model"]
        if self.kind == "linear":
            self.coef = unpack_array(m["coef"]).astype(np.float64)
            self.intercept = float(m["intercept"])
        elif self.kind in ("tree", "forest", "boosting"):
            self.trees = [self._tree(t) for t in m["trees"]]
            self.init = float(m.get("init", 0.0))
            self.learning_rate = float(m.get("learning_rate", 1.0))
        elif self.kind == "knn":
            self.fit_X = unpack_array(m["X"]).astype(np.float64)
            self.fit_y = unpack_array(m["y"]).astype(np.float64)
            self.k = int(m["k"])
        else:
            raise InfersimError(f"unknown regressor kind '{self.kind}'")

    @staticmethod
    def _tree(t: dict) -> dict:
        return {
            "left": unpack_array(t["left"]).astype(np.int64),
            "right": unpack_array(t["right"]).astype(np.int64),
            "feature": unpack_array(t["feature"]).astype(np.int64),
            "threshold": unpack_array(t["threshold"]).astype(np.float64),
            "value": unpack_array(t["value"]).astype(np.float64).reshape(-1),
        }

    @property
    def name(self) -> str:
        return self.spec["estimator"]

    @property
    def degree(self) -> int:
        return int(self.spec["degree"])

    def raw_predict(self, D: np.ndarray) -> np.ndarray:
        """The estimator on an already expanded design matrix (log-time units)."""
        if self.kind == "linear":
            return D @ self.coef + self.intercept
        if self.kind == "knn":
            out = np.empty(D.shape[0])
            xx = (self.fit_X**2).sum(1)
            for s in range(0, D.shape[0], 256):  # squared distances by |a|^2 - 2ab + |b|^2, in chunks
                q = D[s : s + 256]
                d2 = (q**2).sum(1)[:, None] - 2.0 * (q @ self.fit_X.T) + xx[None, :]
                idx = np.argsort(d2, axis=1, kind="stable")[:, : self.k]
                out[s : s + 256] = self.fit_y[idx].mean(axis=1)
            return out
        Xf = D.astype(np.float32).astype(np.float64)
        if self.kind == "tree":
            return _tree_apply(self.trees[0], Xf)
        if self.kind == "forest":
            acc = np.zeros(D.shape[0])
            for t in self.trees:
                acc += _tree_apply(t, Xf)
            return acc / len(self.trees)
        acc = np.full(D.shape[0], self.init)
        for t in self.trees:
            acc += self.learning_rate * _tree_apply(t, Xf)
        return acc

    def predict(self, X) -> np.ndarray:
        """Seconds for rows of the regressor's features (the generic step model's:
        layers, hidden, tokens, batch; a per-model recompute predictor's: MODEL_FEATURES)."""
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        if self.kind == "physical":
            return X @ self.coef + self.intercept
        return np.exp(self.raw_predict(design_matrix(X, self.mean, self.scale, self.powers)))


def reference_spec(layers: int, hidden: float, arch: dict) -> ModelSpec:
    """The ModelSpec of the step benchmark's transformer with `layers` layers and about
    `hidden` hidden size (rounded to whole heads)."""
    d = int(arch.get("head_dim", 64))
    heads = max(1, int(round(float(hidden) / d)))
    inter = max(64, 64 * int(round(float(arch.get("ffn_ratio", 11008 / 4096)) * heads * d / 64)))
    return ModelSpec(
        name=f"profiler-{int(layers)}x{heads * d}",
        family="llama",
        source="infersim profiler step benchmark",
        num_layers=int(layers),
        hidden_size=heads * d,
        num_heads=heads,
        head_dim=d,
        intermediate_size=inter,
        vocab_size=int(arch.get("vocab", 32000)),
        max_position_embeddings=1 << 16,
        tied_embeddings=bool(arch.get("tied_embeddings", True)),
    )


def max_tokens_for(kind: str, batch: np.ndarray, layers: int, hidden: int, domain: dict, kv_bytes: float) -> np.ndarray:
    """Largest tokens per request the sweep measured at this batch (its caps on batched
    tokens and on KV-cache bytes)."""
    sub = domain[kind]
    hi = np.full(np.shape(batch), float(sub["tokens"][1]))
    if kind == "prefill" and sub.get("max_batched_tokens"):
        hi = np.minimum(hi, sub["max_batched_tokens"] / batch)
    if domain.get("max_kv_bytes"):
        pos = domain["max_kv_bytes"] / (2.0 * layers * batch * hidden * kv_bytes)
        hi = np.minimum(hi, pos - (1 if kind == "decode" else 0))
    return np.maximum(hi, float(sub["tokens"][0]))


# ---- per-model predictors (AdaptiveLLM 3.2-3.3: fitted on the served model's own prefills) --------
MODEL_PREDICTORS_FORMAT = "infersim-model-predictors"
MODEL_PREDICTORS_VERSION = 1
MODEL_FEATURES = ("tokens", "batch", "sum_sq_tokens")  # of a prefill batch: sum q, sequences, sum q^2
# ModelSpec fields that do not change what a forward pass computes
_NOT_SHAPE = {
    "name",
    "aliases",
    "source",
    "published_params",
    "published_active_params",
    "published_params_source",
    "default_dtype",
}
# shape fields added later, left out at their defaults so a dense model's hash stays what it was
_LATER_SHAPE_DEFAULTS = {
    "qk_norm": False,
    "moe": None,
    "mla": None,
    "o_proj_bias": None,
    "lm_head_bias": False,
    "rotary_fraction": 1.0,
    "parallel_block": False,
    "shared_block_norm": False,
}


def model_config_hash(spec: ModelSpec) -> str:
    """SHA-256 of the fields of a model's shape (layers, widths, heads, MLP/norm kind, vocab,
    positions...), not of its name: the same checkpoint named by a zoo name, a folder or a
    config.json path hashes alike, and another model (or a renamed copy of a different
    shape) does not."""
    shape = spec.model_dump(exclude=_NOT_SHAPE)
    for key, default in _LATER_SHAPE_DEFAULTS.items():
        if shape.get(key) == default:
            shape.pop(key)
    shape["num_kv_heads"], shape["head_dim"] = spec.kv_heads, spec.dim_head  # defaults made explicit
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


def model_key(name: str, config_hash: str) -> str:
    """The sidecar key of a model's predictors: its name and config hash."""
    return f"{name}@{config_hash[:16]}"


def model_features(q) -> np.ndarray:
    """MODEL_FEATURES of a prefill batch whose prompts have q tokens each."""
    q = np.asarray(q, dtype=np.float64).reshape(-1)
    return np.array([q.sum(), float(q.size), float(np.square(q).sum())])


def per_model_entry(calibration: dict, model: ModelSpec, dtype: str) -> dict | None:
    """The calibration's predictors for this model (same config hash) measured in this
    dtype, or None. A section in an unknown format, or an entry whose key does not carry its
    hash, is refused."""
    sect = calibration.get("per_model")
    if not sect:
        return None
    if sect.get("format") != MODEL_PREDICTORS_FORMAT or int(sect.get("version", -1)) != MODEL_PREDICTORS_VERSION:
        raise InfersimError(
            f"calibration '{calibration.get('profile')}': per_model section format "
            f"{sect.get('format')!r} v{sect.get('version')!r} is not supported (this infersim reads "
            f"{MODEL_PREDICTORS_FORMAT} v{MODEL_PREDICTORS_VERSION})"
        )
    h = model_config_hash(model)
    for key, e in sect.get("models", {}).items():
        if not key.endswith("@" + str(e.get("config_hash", ""))[:16]):
            raise InfersimError(
                f"calibration '{calibration.get('profile')}': per_model entry '{key}' does not "
                f"carry its config hash"
            )
        if e.get("config_hash") == h and e.get("dtype") == dtype:
            return e
    return None


# ---- the cost model ------------------------------------------------------------------------------
class RegressionCostModel(CostModel):
    name = "regression"
    from_workload = True

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareProfile,
        *,
        calibration: str | Path | dict | None = None,
        grid_points: int = 160,
        **roofline_options,
    ):
        """`roofline_options` are RooflineCostModel's (dtype, kv_dtype, tensor_parallel, ...): the
        served model's roofline, which the step predictor's reference roofline is scaled to."""
        self.model, self.hardware = model, hardware
        self.calibration = calibration if isinstance(calibration, dict) else calibration_for(hardware, calibration)
        steps = self.calibration.get("step_model")
        if not steps or not steps.get("predictors"):
            raise InfersimError(f"hardware profile '{hardware.name}': its calibration has no step-time predictor")
        self.roof = RooflineCostModel(model, hardware, **roofline_options)
        self.domain = steps["domain"]
        self.predictors = {k: PortableRegressor(v) for k, v in steps["predictors"].items()}
        lo_L, hi_L = self.domain["layers"]
        lo_h, hi_h = self.domain["hidden"]
        self.ref_layers = int(np.clip(model.num_layers, lo_L, hi_L))
        self.ref_hidden = float(np.clip(model.hidden_size, lo_h, hi_h))
        self.ref_spec = reference_spec(self.ref_layers, self.ref_hidden, steps.get("arch", {}))
        self.ref_dtype = steps.get("dtype", "fp32")
        self.ref = RooflineCostModel(self.ref_spec, hardware, dtype=self.ref_dtype)
        self._kv_bytes = bytes_per_element(self.ref_dtype)
        self.iteration_overhead_s = self.roof.iteration_overhead_s
        self._tables = {k: self._table(k, grid_points) for k in ("prefill", "decode") if k in self.predictors}
        link = self.calibration.get("host_link") or {}
        hl = hardware.host_link
        self._bw = {
            "h2d": float(link.get("h2d_gbps", hl.h2d_gbps)) * 1e9,
            "d2h": float(link.get("d2h_gbps", hl.d2h_gbps)) * 1e9,
        }
        self._lat = {
            "h2d": float(link.get("h2d_latency_us", hl.latency_us)) * 1e-6,
            "d2h": float(link.get("d2h_latency_us", hl.latency_us)) * 1e-6,
        }
        self._copy_issue_s = hl.copy_issue_us * 1e-6
        # the served model's own prefill predictor, when the profile measured this model (same
        # config hash, same dtype, one device); otherwise the generic step model above
        entry = per_model_entry(self.calibration, model, self.roof.weight_dtype) if self.roof.tp == 1 else None
        self.model_predictor_key = None
        self._pm = None
        if entry is not None and entry.get("recompute", {}).get("predictor"):
            rc = entry["recompute"]
            self.model_predictor_key = model_key(entry["name"], entry["config_hash"])
            self._pm = PortableRegressor(rc["predictor"])
            self._pm_domain = rc["domain"]
            for d, f in (entry.get("swap", {}).get("fit") or {}).items():
                # the executor's own swap of this model, its blocks in one run (K and V: two
                # slice copies): the fitted cost per swap and per copy, and its bandwidth
                lat_s = (float(f["latency_us"]) + 2.0 * float(f.get("per_copy_us", 0.0))) * 1e-6
                self._lat[d], self._bw[d] = lat_s, float(f["gbps"]) * 1e9

    # ---- the representative uniform batch and its roofline -------------------------------
    @staticmethod
    def _ref_totals(kind: str, t, b) -> BatchTotals:
        t, b = np.asarray(t, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if kind == "prefill":  # b prompts of t tokens, no cache, logits at the last position
            return BatchTotals(b * t, b * t * t, b * t, b)
        keys = b * (t + 1.0)  # b sequences with t cached tokens and one new
        return BatchTotals(b, keys, keys, b)

    def _ref_time(self, kind: str, t, b) -> np.ndarray:
        return self.ref._time_from_totals(self._ref_totals(kind, t, b))

    def _table(self, kind: str, n: int):
        """The model's time for uniform batches on a log-spaced (tokens, batch) grid wide
        enough for any batch the engine forms: the regressor at the setting clamped into the
        measured domain, carried to the model and the setting by the calibrated roofline,
        then made non-decreasing along both axes (monotone in tokens and batch by
        construction, whatever the regressor does between its training points)."""
        sub = self.domain[kind]
        t_hi = float(max(sub["tokens"][1], 2 * self.model.max_position_embeddings, 16384))
        b_hi = float(max(sub["batch"][1], 1024))
        tg = np.geomspace(1.0, t_hi, n)
        bg = np.geomspace(1.0, b_hi, max(16, n // 4))
        T, B = np.meshgrid(tg, bg, indexing="ij")
        Bc = np.clip(B, *sub["batch"])
        Tc = np.clip(
            T,
            sub["tokens"][0],
            max_tokens_for(kind, Bc, self.ref_layers, self.ref_spec.hidden_size, self.domain, self._kv_bytes),
        )
        X = np.column_stack(
            [
                np.full(T.size, float(self.ref_layers)),
                np.full(T.size, float(self.ref_spec.hidden_size)),
                Tc.ravel(),
                Bc.ravel(),
            ]
        )
        pred = self.predictors[kind].predict(X)
        pred = (
            pred
            * self.roof._time_from_totals(self._ref_totals(kind, T.ravel(), B.ravel()))
            / self._ref_time(kind, Tc.ravel(), Bc.ravel())
        )
        pred = pred.reshape(T.shape)
        pred = np.maximum.accumulate(np.maximum.accumulate(pred, axis=0), axis=1)
        return np.log(tg), np.log(bg), pred

    def _lookup(self, kind: str, t, b) -> np.ndarray:
        """Bilinear in (log tokens, log batch); elementwise, so any number of settings give
        the same numbers one by one."""
        lt, lb, tab = self._tables[kind]
        x = np.log(np.asarray(t, dtype=np.float64))
        y = np.log(np.asarray(b, dtype=np.float64))
        i = np.clip(np.searchsorted(lt, x, side="right") - 1, 0, len(lt) - 2)
        j = np.clip(np.searchsorted(lb, y, side="right") - 1, 0, len(lb) - 2)
        fx = (x - lt[i]) / (lt[i + 1] - lt[i])
        fy = (y - lb[j]) / (lb[j + 1] - lb[j])
        # a + (b - a) f: exact on plateaus and monotone in f under rounding
        top = tab[i, j] + (tab[i, j + 1] - tab[i, j]) * fy
        bot = tab[i + 1, j] + (tab[i + 1, j + 1] - tab[i + 1, j]) * fy
        return top + (bot - top) * fx

    def _times(self, kind: str, totals: BatchTotals, t, b) -> np.ndarray:
        """The table at the batch's representative uniform setting (clamped to the table),
        times the roofline's ratio of the actual batch to that setting (1 for a uniform batch
        inside the table; the roofline's growth beyond it)."""
        lt, lb, _ = self._tables[kind]
        tq = np.clip(np.asarray(t, dtype=np.float64), 1.0, np.exp(lt[-1]))
        bq = np.clip(np.asarray(b, dtype=np.float64), 1.0, np.exp(lb[-1]))
        base = self._lookup(kind, tq, bq)
        ratio = self.roof._time_from_totals(totals) / self.roof._time_from_totals(self._ref_totals(kind, tq, bq))
        if kind == "decode":
            # a decode batch has exactly its representative's totals: the ratio is 1 unless
            # the setting was clamped to the table (skip the rounding of x / x)
            ratio = np.where((tq == np.asarray(t)) & (bq == np.asarray(b)), 1.0, ratio)
        return base * ratio

    def _model_prefill_time_s(self, q: np.ndarray) -> float:
        """The per-model predictor for prompts of q tokens (no cache). Outside the measured
        domain (longer prompts, bigger batches) it is taken at the nearest uniform setting
        inside and carried to the batch by the calibrated roofline, as the generic model."""
        dom = self._pm_domain
        lo, hi = dom["tokens"]
        b_hi = int(dom["batch"][1])
        cap = float(dom.get("max_batched_tokens") or hi * b_hi)
        if q.size <= b_hi and q.min() >= lo and q.max() <= hi and q.sum() <= cap:
            return float(self._pm.predict(model_features(q)[None])[0])
        b = min(q.size, b_hi)
        t = float(np.clip(q.sum() / q.size, lo, min(hi, cap / b)))
        ref = np.full(b, t)
        ref_s = float(np.asarray(self.roof._time_from_totals(self._ref_totals("prefill", t, b))).reshape(-1)[0])
        ratio = self.roof.iteration_time_s(BatchShape.prefill(q)) / ref_s
        return float(self._pm.predict(model_features(ref)[None])[0]) * float(ratio)

    # ---- interface ----------------------------------------------------------------------------
    def iteration_time_s(self, batch: BatchShape) -> float:
        totals = batch.totals()
        q = batch.query_tokens
        n_prefill = int((q > 1).sum())
        if self._pm is not None and q.size and not batch.context_tokens.any():
            return self._model_prefill_time_s(q)  # whole prompts (no cache): what the model's profile measured
        if n_prefill == 0 or "prefill" not in self._tables:
            n = max(1, batch.num_seqs)
            t = max(0.0, totals.keys / n - 1.0)
            return float(self._times("decode", totals, max(t, 1.0), n)[0])
        return float(self._times("prefill", totals, totals.tokens / n_prefill, n_prefill)[0])

    def decode_step_times_s(self, context_tokens, steps: int) -> np.ndarray:
        ctx = np.asarray(context_tokens, dtype=np.int64)
        b = max(1, ctx.size)
        keys = ((ctx.sum() + ctx.size) + ctx.size * np.arange(steps, dtype=np.int64)).astype(np.float64)
        bf = np.full(steps, float(ctx.size))
        t = np.maximum(np.maximum(0.0, keys / b - 1.0), 1.0)
        return self._times("decode", BatchTotals(bf, keys, keys, bf), t, np.full(steps, float(b)))

    def transfer_time_s(self, nbytes: float, direction: Direction) -> float:
        if nbytes <= 0:
            return 0.0
        return self._lat[direction] + float(nbytes) / self._bw[direction]

    def kv_transfer_time_s(self, nbytes: float, direction: Direction, copies: int = 1) -> float:
        # as the roofline: the fitted link, floored by the host's cost per issued copy
        if nbytes <= 0:
            return 0.0
        return self._lat[direction] + max(float(nbytes) / self._bw[direction], int(copies) * self._copy_issue_s)

    def breakdown(self, batch: BatchShape):
        return self.roof.breakdown(batch)


def profile_summary(hardware: HardwareProfile) -> dict[str, Any]:
    """Headline numbers of a profile (for listings and reports)."""
    return {
        "name": hardware.name,
        "peak_tflops": dict(hardware.peak_tflops),
        "memory_bandwidth_gbps": hardware.memory_bandwidth_gbps,
        "h2d_gbps": hardware.host_link.h2d_gbps,
        "d2h_gbps": hardware.host_link.d2h_gbps,
    }
