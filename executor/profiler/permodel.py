"""Per-model predictors (`sim profile --model NAME`): AdaptiveLLM 3.2-3.3 fit the recompute
predictor of each served model from that model's own profiled prefills. This stage does the
same on this machine: it loads a real checkpoint (`executor.models.load_model`), runs its
prefills through the executor's runner over a `PagedKVCache` (the code path that serves:
`plan_batch` + `forward`), and

- recompute: times prefills over a grid of prompt lengths (batch 1) and of batches of 2-4
  prompts (uniform and ragged), interleaved in the same rounds with HELD-OUT prefills at
  lengths the grid never has; compares the eight regressors x degrees and an affine +
  quadratic-in-tokens physical model on the model's own features (MODEL_FEATURES: tokens,
  batch, sum of squared prompt lengths), keeps one chosen on a validation part of the grid
  and reports its error on the held-out prefills, through `RegressionCostModel`;
- swap: times the executor's real swap path (`PagedKVCache.swap_out` / `swap_in` of one
  sequence) on fitted and held-out sizes, and scores three predictions per direction:
  bandwidth only (bytes / the profile's copy bandwidth), the profile's host link (its fitted
  latency + bytes / bandwidth), and latency + bandwidth fitted to this model's executor swaps
  on the fitted sizes.

Protocol against the drift of a shared machine: every round goes over all settings (fitted
and held-out alike, round-robin), the median over rounds is kept per setting, and a
sentinel prefill of the model is timed at the start of every round."""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls

from infersim.executor.prompts import make_prompts
from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.costmodel.regression import (
    MODEL_FEATURES,
    MODEL_PREDICTORS_FORMAT,
    MODEL_PREDICTORS_VERSION,
    PortableRegressor,
    RegressionCostModel,
    model_config_hash,
    model_features,
    model_key,
)
from infersim.simulator.errors import InfersimError
from infersim.simulator.models.catalog import load_model as load_spec
from infersim.simulator.paths import home_relative

from .accuracy import _pct, _rounds_median
from .device import Repeats, load_average, make_timer, measure
from .regress import Candidates, compare_sets

BLOCK_SIZE = 16
SENTINEL_TOKENS = 128


@dataclass(frozen=True)
class ModelPlan:
    fit_tokens: tuple[int, ...]  # batch-1 prompt lengths fitted
    held_tokens: tuple[int, ...]  # batch-1 prompt lengths held out (never fitted)
    batches: tuple[int, ...]  # batch sizes > 1 fitted (uniform prompts from fit_tokens)
    ragged_fit: int  # ragged batches (2..max batch, seeded lengths) fitted
    ragged_held: int  # ragged batches of held-out lengths held out
    max_batched_tokens: int
    swap_fit_tokens: tuple[int, ...]
    swap_held_tokens: tuple[int, ...]
    rounds: int
    rep: Repeats
    swap_rep: Repeats = field(default_factory=lambda: Repeats(warmup=2, min_repeats=7, max_repeats=60, target_s=0.03))


@dataclass(frozen=True)
class ModelSettings:
    """How the served models' own predictors are measured (`sim profile --model NAME`)."""

    device: object = field(metadata={"help": "torch.device the models run on"})
    dtype: str = field(metadata={"help": "fp32, fp16 or bf16: the weights' and KV cache's dtype"})
    quick: bool = field(default=False, metadata={"help": "a handful of prompt lengths (tests, smoke runs)"})
    seed: int = field(default=0, metadata={"help": "seed of the prompts, ragged batches and regressors"})
    rounds: int | None = field(default=None, metadata={"help": "passes over all settings; None: the plan's"})


@dataclass(frozen=True)
class ProfiledModel:
    """Which model a per-model entry describes: the key the cost model looks it up by."""

    name: str = field(metadata={"help": "the loaded model's name (zoo name or folder)"})
    spec: object = field(metadata={"help": "its simulator ModelSpec (model_spec_of)"})
    config_hash: str = field(metadata={"help": "hash of its architecture (model_config_hash)"})
    dtype: str = field(metadata={"help": "the dtype it was measured in"})


def model_plan(quick: bool, max_positions: int, rounds: int | None = None) -> ModelPlan:
    """Prompt lengths on a sqrt(2) grid up to the model's context (at most 2,048), held-out
    lengths between the grid's points; --quick: a handful of each (tests, smoke runs)."""
    hi = int(min(2048, max_positions))
    if quick:
        fit = tuple(t for t in (8, 16, 32, 64, 128) if t <= hi)
        held = tuple(t for t in (12, 45, 100) if t <= hi)
        return ModelPlan(
            fit,
            held,
            (2,),
            2,
            1,
            256,
            (16, 64),
            (45,),
            rounds or 2,
            Repeats(warmup=1, min_repeats=3, max_repeats=5, target_s=0.01),
            Repeats(warmup=1, min_repeats=3, max_repeats=10, target_s=0.005),
        )
    grid = sorted({int(round(8 * 2 ** (k / 2))) for k in range(40)})
    fit = tuple(t for t in grid if t <= hi)
    held = tuple(t for t in (10, 20, 38, 76, 150, 300, 600, 1200, 1800) if t <= hi and t not in fit)
    return ModelPlan(
        fit,
        held,
        (2, 3, 4),
        12,
        6,
        min(4096, 2 * hi),
        (16, 64, 256, 1024, 4096),
        (45, 150, 300, 600, 1500, 3000),
        rounds or 7,
        Repeats(warmup=1, min_repeats=5, max_repeats=25, target_s=0.06),
    )


def prefill_settings(plan: ModelPlan, seed: int = 0) -> list[tuple[str, tuple[int, ...]]]:
    """(role, prompt lengths): 'fit' or 'held'. Uniform batches take lengths of the grid,
    ragged ones log-uniform draws; the held-out ragged batches take held-out lengths."""
    rng = np.random.default_rng([seed, 31])
    out: list[tuple[str, tuple[int, ...]]] = [("fit", (t,)) for t in plan.fit_tokens]
    out += [("fit", (t,) * b) for b in plan.batches for t in plan.fit_tokens if t * b <= plan.max_batched_tokens]
    b_hi = max(plan.batches, default=1)
    lo, hi = min(plan.fit_tokens), max(plan.fit_tokens)
    held1 = set(plan.held_tokens)
    while sum(1 for r, q in out if r == "fit" and len(set(q)) > 1) < plan.ragged_fit:
        b = int(rng.integers(2, b_hi + 1))
        q = tuple(int(round(np.exp(rng.uniform(np.log(lo), np.log(hi))))) for _ in range(b))
        # no held-out length inside a fitted batch either: the held-out prompts stay unseen
        if sum(q) <= plan.max_batched_tokens and len(set(q)) > 1 and not held1 & set(q):
            out.append(("fit", q))
    out += [("held", (t,)) for t in plan.held_tokens]
    tries = 0
    while sum(1 for r, q in out if r == "held" and len(q) > 1) < plan.ragged_held and tries < 1000:
        tries += 1
        b = int(rng.integers(2, b_hi + 1))
        q = tuple(int(t) for t in rng.choice(sorted(held1), size=b))
        if sum(q) <= plan.max_batched_tokens and ("held", q) not in out:
            out.append(("held", q))
    return out


def model_spec_of(lm):
    """The simulator's ModelSpec of a loaded checkpoint (from its config.json, as `sim` reads
    a zoo model or a checkpoint folder), and its config hash."""
    spec = load_spec(str(lm.path / "config.json"))
    return spec, model_config_hash(spec)


def measure_model(lm, plan: ModelPlan, *, timer, seed: int = 0, progress=None, sync=lambda: None) -> dict:
    """Raw timings, every round over every prefill setting and swap size: {'prefill':
    {setting: [per-round medians]}, 'swap': {tokens: {'out': [...], 'in': [...]}},
    'sentinel': [...]}."""
    from infersim.executor.runner import build_runner

    runner = build_runner(lm)
    settings = prefill_settings(plan, seed)
    prefills = _Prefills(lm, runner, _prefill_cache(lm, runner, settings), seed)
    scache = _swap_cache(lm, runner, plan, prefills.cache.bytes_per_block)
    out = _empty_timings(plan, settings, prefills.cache.bytes_per_block, runner.num_layers)
    timing = _RoundTiming(timer, plan, progress, sync, np.random.default_rng([seed, 47]))
    for r in range(plan.rounds):
        out["sentinel"].append(prefills.time((SENTINEL_TOKENS,), timer, plan.rep))
        # a new seeded order every round: fitted and held-out settings interleaved, so a slow
        # spell of the machine hits neither group (nor any length range) systematically
        _time_prefill_round(r, prefills, settings, out["prefill"], timing)
        _time_swap_round(r, scache, out["swap"], timing)
    return out


@dataclass(frozen=True)
class _RoundTiming:
    """How measure_model times and reports a round."""

    timer: object  # device.Timer of the model's device
    plan: ModelPlan  # rounds and the prefill and swap repeats
    progress: object  # callable(label) once per measured point, or None
    sync: object  # called before each timed swap (the device's synchronize)
    order_rng: object  # numpy Generator: each round's order of the settings, then of the swaps


def _prefill_cache(lm, runner, settings: list):
    """The prefills' cache: room for the biggest batch of the settings."""
    from infersim.executor.kvcache import KVCacheConfig, runner_cache

    longest = max(sum(q) for _, q in settings) + BLOCK_SIZE * 4
    return runner_cache(
        runner, KVCacheConfig(-(-longest // BLOCK_SIZE) + 4, BLOCK_SIZE, 1, watermark=0.0, dtype=lm.dtype), lm.device
    )


def _swap_cache(lm, runner, plan: ModelPlan, per_block: int):
    """The swaps' cache, its pages committed: a pool of >= 32 MiB per side, so successive
    repeats move different blocks, not cache-warm ones."""
    from infersim.executor.kvcache import KVCacheConfig, runner_cache

    swap_max = max(plan.swap_fit_tokens + plan.swap_held_tokens)
    pool = max(8 * -(-swap_max // BLOCK_SIZE), (32 << 20) // per_block)
    scache = runner_cache(runner, KVCacheConfig(pool, BLOCK_SIZE, pool, watermark=0.0, dtype=lm.dtype), lm.device)
    for t in (scache._k, scache._v, scache._hk, scache._hv):
        t.fill_(0.5)  # commit the pages before timing
    scache.mark_clean()
    return scache


class _Prefills:
    """Prefills of prompt-length settings through the runner over the paged cache; each
    setting's prompts made once, seeded in the order settings are first seen."""

    def __init__(self, lm, runner, cache, seed: int):
        self.lm, self.runner, self.cache, self.seed = lm, runner, cache, seed
        self._prompts: dict = {}

    def _prompt_set(self, q):
        if q not in self._prompts:
            self._prompts[q] = make_prompts(
                list(q), tokenizer=self.lm.tokenizer, vocab_size=self.lm.vocab_size, seed=self.seed + len(self._prompts)
            )
        return self._prompts[q]

    def time(self, q, timer, rep: Repeats) -> float:
        """Median time of one engine iteration prefilling prompts of lengths `q` (their blocks
        freed after)."""
        from infersim.executor.runner import TokenSeq, plan_batch

        cache, runner, device = self.cache, self.runner, self.lm.device
        seqs = [TokenSeq(p) for p in self._prompt_set(q)]
        for s in seqs:
            cache.grow_to(s, s.num_tokens)
        batch = [(s, s.num_tokens) for s in seqs]

        def fn():  # one engine iteration: the plan and the forward pass over the paged cache
            return runner.forward(plan_batch(cache, batch, device), cache)

        t = measure(fn, timer, rep).median_s
        for s in seqs:
            cache.free(s)
        return t


def _empty_timings(plan: ModelPlan, settings: list, per_block: int, layers: int) -> dict:
    return {
        "prefill": {q: [] for _, q in settings},
        "swap": {
            (n, lay): {"out": [], "in": []}
            for n in sorted(set(plan.swap_fit_tokens + plan.swap_held_tokens))
            for lay in LAYOUTS
        },
        "sentinel": [],
        "settings": settings,
        "bytes_per_block": per_block,
        "layers": layers,
    }


def _time_prefill_round(r: int, prefills: _Prefills, settings: list, samples: dict, t: _RoundTiming) -> None:
    """Every prefill setting once, in the round's seeded order."""
    for k in t.order_rng.permutation(len(settings)):
        role, q = settings[k]
        samples[q].append(prefills.time(q, t.timer, t.plan.rep))
        if t.progress:
            t.progress(f"model prefill {role} {'+'.join(map(str, q))} round {r + 1}/{t.plan.rounds}")


def _time_swap_round(r: int, scache, samples: dict, t: _RoundTiming) -> None:
    """Every swap size and layout once, in the round's seeded order."""
    swaps = list(samples.items())
    for k in t.order_rng.permutation(len(swaps)):
        (n, layout), smp = swaps[k]
        t_out, t_in, smp["copies"] = _time_swaps(scache, n, layout, t.timer, t.plan.swap_rep, t.sync)
        smp["out"].append(t_out)
        smp["in"].append(t_in)
        if t.progress:
            t.progress(f"model swap n={n} {layout} round {r + 1}/{t.plan.rounds}")


LAYOUTS = ("contiguous", "fragmented")


def _copies(cache, seq) -> int:
    """Slice copies one swap of `seq` makes: K and V per run of consecutive blocks
    (executor/kvcache.py `_copy` on the CPU; its free lists hand out neighbouring ids)."""
    from infersim.executor.kvcache import contiguous_runs

    blocks = seq.block_table or seq.cpu_block_table
    return 2 * sum(1 for _ in contiguous_runs(blocks, list(range(len(blocks)))))


def _time_swaps(cache, tokens: int, layout: str, timer, rep: Repeats, sync) -> tuple[float, float, int]:
    """Median swap-out and swap-in time of one sequence of `tokens` tokens through the
    executor's cache, and the copies each makes. Sequences fill the pool and the repeats
    rotate over them (each repeat moves blocks not touched since long before).
    layout 'contiguous': each sequence's blocks consecutive (a fresh pool: one run, 2 copies
    per swap); 'fragmented': two sequences grown block by block in turn, so every block is a
    run of its own (2 copies per block), as a long-running server's free lists become."""
    from infersim.executor.runner import TokenSeq

    nblk = -(-tokens // BLOCK_SIZE)
    # fresh free lists (lowest ids first), whatever earlier sizes left behind
    cache.reset_free_lists()
    seqs = []
    while cache.free_gpu >= 2 * nblk and len(seqs) < 64:
        pair = [TokenSeq([0] * tokens), TokenSeq([0] * tokens)]
        if layout == "fragmented":
            for k in range(1, nblk + 1):
                for q in pair:
                    cache.grow_to(q, k * BLOCK_SIZE)
        else:
            for q in pair:
                cache.grow_to(q, tokens)
        seqs += pair
    copies = _copies(cache, seqs[0])
    outs, ins = [], []
    i = 0
    n_warm = rep.warmup
    spent = 0.0
    while len(outs) < rep.min_repeats or (spent < rep.target_s and len(outs) < rep.max_repeats):
        s = seqs[i % len(seqs)]
        i += 1
        sync()
        t_out = timer.time(lambda: cache.swap_out([s]))
        t_in = timer.time(lambda: cache.swap_in([s]))
        if n_warm > 0:
            n_warm -= 1
            continue
        outs.append(t_out)
        ins.append(t_in)
        spent += t_out + t_in
    for s in seqs:
        cache.free(s)
    return float(np.median(outs)), float(np.median(ins)), copies


def fit_swap(rows: list[dict]) -> dict:
    """Per direction, latency + copies x per-copy cost + bytes / bandwidth fitted to the
    executor's swaps (relative error, every term >= 0), as the profile's host link is fitted
    to plain copies."""
    fit = {}
    for d, key in (("d2h", "swap_out_s"), ("h2d", "swap_in_s")):
        s = np.array([r["bytes"] for r in rows], dtype=np.float64)
        c = np.array([r["copies"] for r in rows], dtype=np.float64)
        t = np.array([r[key] for r in rows], dtype=np.float64)
        A = np.column_stack([1.0 / t, c / t, s / t])
        sc = A.max(axis=0)
        x, _ = nnls(A / sc, np.ones_like(t))
        lat, per_copy, inv_bw = x / sc
        if inv_bw <= 0:
            inv_bw = float(np.min(t / s))
        pred = lat + c * per_copy + s * inv_bw
        fit[d] = {
            "latency_us": float(lat * 1e6),
            "per_copy_us": float(per_copy * 1e6),
            "gbps": float(1.0 / inv_bw / 1e9),
            "mape_fitted": float(np.mean(np.abs(pred - t) / t) * 100),
        }
    return fit


def analyze_model(
    raw: dict, plan: ModelPlan, model: ProfiledModel, *, hardware, calibration: dict | None, seed: int = 0
) -> dict:
    """The sidecar entry of one model: the recompute predictor (chosen without the held-out
    set), its held-out errors beside the generic predictor's and the roofline's, and the swap
    check of the executor's swap path."""
    med = {q: _rounds_median(v) for q, v in raw["prefill"].items()}
    entry = _entry_with_predictor(raw["settings"], med, plan, model, seed)
    costs = _RecomputeCostModels.of(model, entry, hardware, calibration)
    rows = _recompute_rows(raw["settings"], med, PortableRegressor(entry["recompute"]["predictor"]), costs)
    best_key = "err_cost_model_pct" if costs is not None else "err_predictor_pct"
    entry["recompute"].update(_recompute_summary(rows, plan.rounds, best_key))
    entry["swap"] = _swap_check(_swap_rows(raw, plan), calibration, raw["bytes_per_block"])
    entry["sentinel"] = _sentinel_summary(raw["sentinel"])
    return entry


def _entry_with_predictor(settings, med: dict, plan: ModelPlan, model: ProfiledModel, seed: int) -> dict:
    """The entry's identity and its recompute predictor, compared and chosen on the fitted
    settings alone and scored on the held-out ones."""
    fit_q = [q for role, q in settings if role == "fit"]
    held_q = [q for role, q in settings if role == "held"]
    Xf = np.array([model_features(q) for q in fit_q])
    yf = np.array([med[q][0] for q in fit_q])
    Xh = np.array([model_features(q) for q in held_q])
    yh = np.array([med[q][0] for q in held_q])
    comp = compare_sets(Xf, yf, Xh, yh, target="prefill", features=MODEL_FEATURES, candidates=Candidates(seed=seed))
    domain = {
        "tokens": [int(min(plan.fit_tokens)), int(max(plan.fit_tokens))],
        "batch": [1, int(max((1,) + plan.batches))],
        "max_batched_tokens": int(plan.max_batched_tokens),
    }
    return {
        "name": model.name,
        "config_hash": model.config_hash,
        "dtype": model.dtype,
        "spec": {k: v for k, v in model.spec.model_dump().items() if k not in ("source", "aliases")},
        "recompute": {"predictor": comp.pop("portable"), "domain": domain, "comparison": comp},
    }


@dataclass(frozen=True)
class _RecomputeCostModels:
    """The cost models a model's prefills are scored with, beside its own predictor."""

    per_model: RegressionCostModel  # the profile with this entry: picks the model's own predictor
    generic: RegressionCostModel  # the profile's step regressor, no per-model entry
    roofline: RooflineCostModel

    @classmethod
    def of(cls, model: ProfiledModel, entry: dict, hardware, calibration: dict | None) -> "_RecomputeCostModels | None":
        """None without a profile to build them on."""
        if hardware is None or calibration is None:
            return None
        spec, dtype = model.spec, model.dtype
        # the entry as it stands: its recompute predictor, before the swap section is added
        cal = {
            **calibration,
            "per_model": {
                "format": MODEL_PREDICTORS_FORMAT,
                "version": MODEL_PREDICTORS_VERSION,
                "models": {model_key(model.name, model.config_hash): entry},
            },
        }
        reg = RegressionCostModel(spec, hardware, dtype=dtype, calibration=cal)
        assert reg.model_predictor_key is not None
        generic = RegressionCostModel(spec, hardware, dtype=dtype, calibration={**calibration, "per_model": None})
        return cls(reg, generic, RooflineCostModel(spec, hardware, dtype=dtype))


# (prediction, its error against the measured time) per row of the recompute check
_RECOMPUTE_ERRORS = (
    ("pred_s", "err_predictor_pct"),
    ("pred_cost_model_s", "err_cost_model_pct"),
    ("pred_generic_s", "err_generic_pct"),
    ("pred_roofline_s", "err_roofline_pct"),
)


def _recompute_rows(settings, med: dict, port: PortableRegressor, costs: _RecomputeCostModels | None) -> list[dict]:
    """One row per prefill setting: measured, predicted by each predictor, and the errors."""
    rows = []
    for role, q in settings:
        m, cv = med[q]
        shape = BatchShape.prefill(list(q))
        row = {
            "role": role,
            "prompts": list(q),
            "tokens": int(sum(q)),
            "batch": len(q),
            "measured_s": m,
            "rounds_cv": cv,
            "pred_s": float(port.predict(model_features(q)[None])[0]),
        }
        if costs is not None:
            row["pred_cost_model_s"] = costs.per_model.iteration_time_s(shape)
            row["pred_generic_s"] = costs.generic.iteration_time_s(shape)
            row["pred_roofline_s"] = costs.roofline.iteration_time_s(shape)
        for k, e in _RECOMPUTE_ERRORS:
            if k in row:
                row[e] = _pct(row[k], m)
        rows.append(row)
    return rows


def _mape_of(rows: list[dict], key: str) -> float | None:
    """Mean of `key` over the rows that have it; None when none does."""
    sel = [r[key] for r in rows if key in r]
    return float(np.mean(sel)) if sel else None


def _recompute_summary(rows: list[dict], rounds: int, best_key: str) -> dict:
    held1 = [r for r in rows if r["role"] == "held" and r["batch"] == 1]
    heldb = [r for r in rows if r["role"] == "held" and r["batch"] > 1]
    fitted = [r for r in rows if r["role"] == "fit"]
    return {
        "rows": rows,
        "rounds": rounds,
        "rounds_cv_median": float(np.median([r["rounds_cv"] for r in rows])),
        "mape_recompute": _mape_of(held1, best_key),  # held-out prompts alone: a preempted sequence's recompute
        "mape_held_out_batched": _mape_of(heldb, best_key),
        "mape_fitted": _mape_of(fitted, best_key),
        "mape_recompute_generic": _mape_of(held1, "err_generic_pct"),
        "mape_recompute_roofline": _mape_of(held1, "err_roofline_pct"),
    }


# ---- swap: the executor's own path ---------------------------------------------------
def _swap_rows(raw: dict, plan: ModelPlan) -> list[dict]:
    """One row per (tokens, layout): the rounds' median swap-out and swap-in times."""
    srows = []
    per_block = raw["bytes_per_block"]
    for (n, layout), smp in raw["swap"].items():
        (t_out, cv_out), (t_in, cv_in) = _rounds_median(smp["out"]), _rounds_median(smp["in"])
        srows.append(
            {
                "tokens": int(n),
                "layout": layout,
                "role": "fit" if n in plan.swap_fit_tokens else "held",
                "bytes": -(-int(n) // BLOCK_SIZE) * per_block,
                "copies": int(smp["copies"]),
                # each slice copy spans the pool's layers: one contiguous memcpy per layer
                "segments": int(smp["copies"]) * int(raw["layers"]),
                "swap_out_s": t_out,
                "swap_in_s": t_in,
                "rounds_cv": 0.5 * (cv_out + cv_in),
            }
        )
    return srows


def _swap_formulas(sfit: dict, link: dict) -> dict:
    """(latency per swap, cost per slice copy, bytes/s) per direction, per prediction."""
    formulas = {
        "model_fit": {
            d: (sfit[d]["latency_us"] * 1e-6, sfit[d]["per_copy_us"] * 1e-6, sfit[d]["gbps"] * 1e9)
            for d in ("d2h", "h2d")
        }
    }
    if link:
        # the profile's link: its fitted latency is that of one contiguous copy, which every
        # segment (a layer's part of a slice copy) pays
        formulas["link"] = {d: (0.0, link[f"{d}_latency_us"] * 1e-6, link[f"{d}_gbps"] * 1e9) for d in ("d2h", "h2d")}
        formulas["bandwidth_only"] = {d: (0.0, 0.0, link[f"{d}_gbps"] * 1e9) for d in ("d2h", "h2d")}
    return formulas


def _score_swaps(srows: list[dict], f: str, par: dict) -> dict:
    """Formula `f`'s predictions and errors into every row; its held-out MAPEs, overall and per layout."""
    count = "copies" if f == "model_fit" else "segments"
    for r in srows:
        po, pi = (par[d][0] + r[count] * par[d][1] + r["bytes"] / par[d][2] for d in ("d2h", "h2d"))
        r[f"pred_out_{f}_s"], r[f"pred_in_{f}_s"] = po, pi
        r[f"err_out_{f}_pct"], r[f"err_in_{f}_pct"] = _pct(po, r["swap_out_s"]), _pct(pi, r["swap_in_s"])
        r[f"err_swap_{f}_pct"] = _pct(po + pi, r["swap_out_s"] + r["swap_in_s"])
    held = [r for r in srows if r["role"] == "held"]
    summary = {k: float(np.mean([r[f"err_{k}_{f}_pct"] for r in held])) for k in ("out", "in", "swap")}
    for lay in LAYOUTS:
        sel = [r for r in held if r["layout"] == lay]
        summary[lay] = {k: float(np.mean([r[f"err_{k}_{f}_pct"] for r in sel])) for k in ("out", "in", "swap")}
    return summary


def _swap_check(srows: list[dict], calibration: dict | None, per_block: int) -> dict:
    """The swap section: a latency + bandwidth fit on the fitted sizes, every prediction scored
    on the held-out ones."""
    sfit = fit_swap([r for r in srows if r["role"] == "fit"])
    formulas = _swap_formulas(sfit, (calibration or {}).get("host_link") or {})
    summary = {f: _score_swaps(srows, f, par) for f, par in formulas.items()}
    return {
        "rows": srows,
        "fit": {d: {k: v[k] for k in ("latency_us", "per_copy_us", "gbps")} for d, v in sfit.items()},
        "fit_mape_fitted_sizes": {d: v["mape_fitted"] for d, v in sfit.items()},
        "held_out_mape": summary,
        "block_size": BLOCK_SIZE,
        "bytes_per_block": per_block,
        "rounds_cv_median": float(np.median([r["rounds_cv"] for r in srows])),
    }


def _sentinel_summary(per_round_s) -> dict:
    s = np.asarray(per_round_s)
    return {
        "prefill_tokens": SENTINEL_TOKENS,
        "per_round_s": [float(x) for x in s],
        "spread": float(s.max() / s.min()) if len(s) else None,
    }


def profile_models(
    names, settings: ModelSettings, *, hardware, calibration: dict | None, progress=None, timer=None
) -> dict:
    """The `per_model` sidecar section for the named models (zoo names, checkpoint folders)."""
    import torch

    from infersim.executor.models import load_model

    device, dtype, quick, seed = settings.device, settings.dtype, settings.quick, settings.seed
    timer = timer or make_timer(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    models = {}
    for name in names:
        la0 = load_average()
        t0 = time.perf_counter()
        lm = load_model(str(name), device=str(device), dtype=dtype)
        if getattr(lm, "family", None) not in ("llama", "mistral", "opt"):
            raise InfersimError(f"--model {name}: no executor runner for family {lm.family!r}")
        spec, h = model_spec_of(lm)
        plan = model_plan(quick, lm.max_positions, settings.rounds)
        raw = measure_model(lm, plan, timer=timer, seed=seed, progress=progress, sync=sync)
        entry = analyze_model(
            raw, plan, ProfiledModel(lm.name, spec, h, dtype), hardware=hardware, calibration=calibration, seed=seed
        )
        la1 = load_average()
        entry.update(
            {
                "path": home_relative(lm.path),
                "device": str(device),
                "threads": torch.get_num_threads(),
                "measured_at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "load_average": {"start": la0[0] if la0 else None, "end": la1[0] if la1 else None},
                "mode": "quick" if quick else "full",
                "time_s": round(time.perf_counter() - t0, 2),
            }
        )
        models[model_key(lm.name, h)] = entry
        del lm
    return {"format": MODEL_PREDICTORS_FORMAT, "version": MODEL_PREDICTORS_VERSION, "models": models}


def progress_total(names, quick: bool, max_positions: int = 2048, rounds: int | None = None) -> int:
    plan = model_plan(quick, max_positions, rounds)
    n = len(prefill_settings(plan)) + len(LAYOUTS) * len(set(plan.swap_fit_tokens + plan.swap_held_tokens))
    return len(list(names)) * n * plan.rounds
