"""How well the AdaptiveLLM 3.3 predictors do on held-out measurements of this machine.

swap = KV bytes / measured D2H bandwidth + KV bytes / measured H2D bandwidth (each direction
with its fitted latency, as the cost model's transfer_time_s), checked against real copies of
a sequence's KV cache between a device block pool and a host block pool, K and V per layer,
at sequence lengths whose byte sizes the bandwidth sweep did not measure. The executor's own
swap path (PagedKVCache.swap_out/swap_in: index gathers and scatters) is timed on the same
sizes and reported beside it.

recompute = predicted prefill time (RegressionCostModel.prefill_time_s, i.e. the step-time
regressor carried through the cost model), checked against real prefills of small
transformers at tokens per request (and shapes) the step sweep did not measure."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.costmodel.regression import RegressionCostModel, reference_spec

from .device import measure
from .kernels import Bench, copy_fn, copy_reference_plan, torch_dtype
from .steps import TinyDecoder

# KV shapes of catalog models (layers, kv heads, head dim), fp16 cache, block size 16
SWAP_MODELS_QUICK = {"llama-160m": (12, 12, 64)}
SWAP_MODELS_FULL = {"llama-160m": (12, 12, 64), "opt-1.3b": (24, 32, 64)}
SWAP_TOKENS_QUICK = (45, 300, 900)
SWAP_TOKENS_FULL = (45, 150, 300, 600, 900, 1500)
BLOCK = 16


class _Seq:
    def __init__(self):
        self.block_table, self.cpu_block_table = [], []


def _pct(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas * 100.0


def _rounds_median(samples: list[float]) -> tuple[float, float]:
    """Median over rounds and the rounds' coefficient of variation."""
    a = np.asarray(samples, dtype=np.float64)
    return float(np.median(a)), float(a.std() / a.mean()) if len(a) > 1 else 0.0


def swap_check(
    b: Bench,
    link: dict,
    *,
    quick: bool,
    kv_dtype: str = "fp16",
    rounds: int | None = None,
    copy_reference_s: float | None = None,
) -> dict:
    """Measured vs predicted swap-out, swap-in and their sum per (model, tokens).

    The measured swap is a copy of the sequence's KV between a device and a host block pool
    in block-major layout ([blocks, layers, K/V, block_size, kv_heads, head_dim], as
    FlexGen-style and recent vLLM pools keep it), the sequence's blocks contiguous: one copy
    of exactly the KV bytes per direction. Two other swap paths are timed on the same sizes
    and scored against the same prediction: per-layer K and V copies (a layer-major pool,
    2 x layers copies per direction) and the executor's PagedKVCache.swap_out + swap_in.

    Every size is measured in `rounds` passes over all sizes (each pass a median of repeats)
    and the rounds' median kept: a shared machine's copy bandwidth wanders by several percent
    over tens of seconds, and one short window would measure the wander, not the swap. The
    rounds' spread is recorded as the noise floor."""
    import torch

    models = SWAP_MODELS_QUICK if quick else SWAP_MODELS_FULL
    lengths = SWAP_TOKENS_QUICK if quick else SWAP_TOKENS_FULL
    rounds = rounds or (1 if quick else 5)
    td = torch_dtype(kv_dtype)
    es = torch.empty((), dtype=td).element_size()
    rows = []
    # the copy sweep's reference copies, timed again each round: how far the bandwidth has moved
    copy_sentinel: list[float] = []
    for mname, (L, kvh, d) in models.items():
        block_bytes = 2 * L * BLOCK * kvh * d * es
        sweep = _SwapSweep(mname, (L, kvh, d), td, block_bytes, lengths, rounds, quick)
        samples = _measure_model_swaps(b, sweep, len(rows), copy_sentinel)
        rows += [_swap_row(mname, n, smp, block_bytes) for n, smp in samples.items()]
    for r in rows:
        _score_swap_row(r, link)
    drift_f = float(np.median(copy_sentinel)) / copy_reference_s if copy_reference_s and copy_sentinel else None
    if drift_f:
        for r in rows:
            r["err_swap_drift_corrected_pct"] = _pct(
                (r["pred_out_s"] + r["pred_in_s"]) * drift_f, r["swap_out_s"] + r["swap_in_s"]
            )
    return _swap_summary(rows, rounds, drift_f, kv_dtype)


@dataclass(frozen=True)
class _SwapSweep:
    """One model's pass of the swap check."""

    model: str  # catalog name, for the progress line
    kv_shape: tuple[int, int, int]  # layers, kv heads, head dim
    dtype: object  # torch dtype of the KV cache
    block_bytes: int  # K and V of one block over all layers
    lengths: tuple[int, ...]  # sequence lengths (tokens) swapped
    rounds: int  # passes over all lengths
    quick: bool  # smaller pools


@dataclass
class _SwapPools:
    """A model's KV on the device and the host in the three layouts the check times."""

    blocks: int  # pool size in blocks, each layout alike
    layers: int
    dev: object  # block-major [blocks, layers, K/V, block, kv heads, head dim]
    host: object
    layer_k: object  # layer-major [layers, blocks, block, kv heads, head dim], K and V apart
    layer_hk: object
    layer_v: object
    layer_hv: object
    cache: object  # the executor's PagedKVCache


def _swap_pools(b: Bench, sweep: _SwapSweep) -> _SwapPools:
    import torch

    from infersim.executor.kvcache import KVCacheConfig, PagedKVCache

    (L, kvh, d), td = sweep.kv_shape, sweep.dtype
    max_blocks = -(-max(sweep.lengths) // BLOCK)
    # pools several times the largest sequence and past the caches, so successive repeats
    # copy different blocks (swapped-out KV was written long before, not sitting in cache)
    pool = max(4 * max_blocks, int(np.ceil(((64 if sweep.quick else 256) << 20) / sweep.block_bytes)))
    pinned = b.device.type == "cuda"
    dev = torch.full((pool, L, 2, BLOCK, kvh, d), 0.5, dtype=td, device=b.device)
    host = torch.full((pool, L, 2, BLOCK, kvh, d), 0.5, dtype=td, pin_memory=pinned)
    layer_k = torch.full((L, pool, BLOCK, kvh, d), 0.5, dtype=td, device=b.device)
    layer_hk = torch.full((L, pool, BLOCK, kvh, d), 0.5, dtype=td, pin_memory=pinned)
    layer_v, layer_hv = layer_k.clone(), layer_hk.clone()
    cache = PagedKVCache(L, kvh, d, KVCacheConfig(pool, BLOCK, pool, watermark=0.0, dtype=td), b.device)
    for t in (cache._k, cache._v, cache._hk, cache._hv):
        t.fill_(0.5)  # commit the pages before timing
    cache.mark_clean()
    return _SwapPools(pool, L, dev, host, layer_k, layer_hk, layer_v, layer_hv, cache)


def _measure_model_swaps(
    b: Bench, sweep: _SwapSweep, rows_before: int, copy_sentinel: list[float]
) -> dict[int, dict[str, list[float]]]:
    """Per length, each swap path's median time in every round; lengths past the budget
    (judged in the first round, counting `rows_before` from earlier models) are dropped.
    The pools live only as long as this call: they are freed before the next model's."""
    pools = _swap_pools(b, sweep)
    samples = {n: {"out": [], "in": [], "layers": [], "executor": []} for n in sweep.lengths}
    for r in range(sweep.rounds):
        copy_sentinel.append(_copy_sentinel_s(b))
        for n in sweep.lengths:
            if r == 0 and b.over_budget(rows_before + sum(1 for v in samples.values() if v["out"])):
                samples.pop(n, None)
                continue
            if n not in samples:
                continue
            for path, t in _time_swap_paths(b, pools, n).items():
                samples[n][path].append(t)
            b.progress(f"swap check {sweep.model} n={n} round {r + 1}/{sweep.rounds}")
    return samples


def _copy_sentinel_s(b: Bench) -> float:
    """The copy sweep's reference copies timed now (buffers made per call: on the CPU each copy holds 256 MiB)."""
    plan = copy_reference_plan(b.device.type)
    return float(np.mean([measure(copy_fn(b, d, pinned, n), b.timer, b.rep).median_s for d, _, pinned, n in plan]))


def _copy_fns(pools: _SwapPools, nblk: int) -> tuple:
    """Swap-out, swap-in and per-layer out-and-in copies of `nblk` blocks, their start blocks
    walking through the pool in one walk shared by the three."""
    # locals, not attributes, inside the timed calls: they time the copies, not the lookups
    dev, host = pools.dev, pools.host
    layer_k, layer_hk, layer_v, layer_hv = pools.layer_k, pools.layer_hk, pools.layer_v, pools.layer_hv
    L, pool = pools.layers, pools.blocks
    state = {"s": 0}

    def span():  # each repeat copies blocks the last did not
        s = state["s"]
        state["s"] = (s + nblk) % (pool - nblk)
        return s

    def out_fn():
        s = span()
        host[s : s + nblk].copy_(dev[s : s + nblk])

    def in_fn():
        s = span()
        dev[s : s + nblk].copy_(host[s : s + nblk])

    def layers_pair():
        s = span()
        for l in range(L):
            layer_hk[l, s : s + nblk].copy_(layer_k[l, s : s + nblk])
            layer_hv[l, s : s + nblk].copy_(layer_v[l, s : s + nblk])
        for l in range(L):
            layer_k[l, s : s + nblk].copy_(layer_hk[l, s : s + nblk])
            layer_v[l, s : s + nblk].copy_(layer_hv[l, s : s + nblk])

    return out_fn, in_fn, layers_pair


def _time_swap_paths(b: Bench, pools: _SwapPools, n: int) -> dict[str, float]:
    """Median times of a sequence of `n` tokens swapped out, in, layer by layer (out and in)
    and through the executor's cache (out and in), timed in that order."""
    out_fn, in_fn, layers_pair = _copy_fns(pools, -(-n // BLOCK))
    cache = pools.cache
    seq = _Seq()
    cache.grow_to(seq, n)

    def ex_pair():
        cache.swap_out([seq])
        cache.swap_in([seq])

    times = {
        path: measure(fn, b.timer, b.rep).median_s
        for path, fn in (("out", out_fn), ("in", in_fn), ("layers", layers_pair), ("executor", ex_pair))
    }
    cache.free(seq)
    return times


def _swap_row(model: str, n: int, smp: dict[str, list[float]], block_bytes: int) -> dict:
    (t_out, cv_out), (t_in, cv_in) = _rounds_median(smp["out"]), _rounds_median(smp["in"])
    return {
        "model": model,
        "tokens": n,
        "blocks": -(-n // BLOCK),
        "bytes": -(-n // BLOCK) * block_bytes,
        "rounds": len(smp["out"]),
        "swap_out_s": t_out,
        "swap_in_s": t_in,
        "rounds_cv_out": cv_out,
        "rounds_cv_in": cv_in,
        "per_layer_swap_s": _rounds_median(smp["layers"])[0],
        "executor_swap_s": _rounds_median(smp["executor"])[0],
    }


def _predicted_copy_s(link: dict, nbytes: int, direction: str) -> float:
    """The cost model's transfer time: the direction's fitted latency + bytes / bandwidth."""
    return link[f"{direction}_latency_us"] * 1e-6 + nbytes / (link[f"{direction}_gbps"] * 1e9)


def _score_swap_row(r: dict, link: dict) -> None:
    p_out, p_in = _predicted_copy_s(link, r["bytes"], "d2h"), _predicted_copy_s(link, r["bytes"], "h2d")
    r.update(
        pred_out_s=p_out,
        pred_in_s=p_in,
        err_out_pct=_pct(p_out, r["swap_out_s"]),
        err_in_pct=_pct(p_in, r["swap_in_s"]),
        err_swap_pct=_pct(p_out + p_in, r["swap_out_s"] + r["swap_in_s"]),
        err_per_layer_pct=_pct(p_out + p_in, r["per_layer_swap_s"]),
        err_executor_pct=_pct(p_out + p_in, r["executor_swap_s"]),
    )


def _swap_summary(rows: list[dict], rounds: int, drift_f: float | None, kv_dtype: str) -> dict:
    def mape(key: str) -> float:
        return float(np.mean([r[key] for r in rows]))

    return {
        "rows": rows,
        "rounds": rounds,
        "drift": drift_f,
        "mape_swap_drift_corrected": mape("err_swap_drift_corrected_pct") if drift_f else None,
        "mape_out": mape("err_out_pct"),
        "mape_in": mape("err_in_pct"),
        "mape_swap": mape("err_swap_pct"),
        "mape_per_layer_swap": mape("err_per_layer_pct"),
        "mape_executor_swap": mape("err_executor_pct"),
        "rounds_cv_median": float(np.median([0.5 * (r["rounds_cv_out"] + r["rounds_cv_in"]) for r in rows])),
        "kv_dtype": kv_dtype,
        "block_size": BLOCK,
    }


def recompute_plan(domain: dict, quick: bool) -> list[tuple[int, int, int, int]]:
    """(layers, hidden, tokens, batch) held-out prefills: tokens the sweep's random draws
    almost surely missed, on measured shapes and on one shape between them. Batch 1 is the
    recompute of one preempted sequence; a few batch-4 prefills show the batched case."""
    lo, hi = domain["prefill"]["tokens"]
    toks = [t for t in ((12, 40, 100, 200) if quick else (12, 24, 40, 72, 100, 150, 200, 300, 450)) if lo <= t <= hi]
    Ls, hs = domain["layers"], domain["hidden"]
    shapes = [(Ls[1], hs[1]), (max(1, Ls[1] // 2), hs[1] // 2)]
    if not quick:
        shapes.append((3, 320))  # a shape the sweep did not have (between measured ones)
    plan = [(L, h, t, 1) for L, h in shapes for t in toks]
    if not quick:
        plan += [(Ls[1], hs[1] // 2, t, 4) for t in toks if t * 4 <= domain["prefill"].get("max_batched_tokens", 1e9)]
    return plan


def recompute_check(
    b: Bench, hardware, calibration: dict, *, quick: bool, seed: int = 1234, rounds: int | None = None
) -> dict:
    """Measured vs predicted prefill times, each the median of `rounds` passes over the plan."""
    steps = calibration["step_model"]
    rounds = rounds or (1 if quick else 5)
    plan = recompute_plan(steps["domain"], quick)
    models = _PrefillModels(b, hardware, calibration, seed)
    samples, sent_now = _time_prefills(b, plan, models, rounds)
    swept = [[int(a), int(c)] for a, c in steps.get("shapes", [])]
    rows = [_recompute_row(models.of(L, h), (L, h, t, bsz), smp, swept) for (L, h, t, bsz), smp in samples.items()]
    models.clear()
    ref = steps.get("sentinel_geomean_s")
    drift_f = float(np.median(sent_now)) / ref if ref else None
    if drift_f:
        for r in rows:
            r["err_regression_drift_corrected_pct"] = _pct(r["pred_regression_s"] * drift_f, r["measured_s"])
    return _recompute_summary(rows, rounds, drift_f)


class _PrefillModels:
    """Per shape (layers, hidden): the tiny decoder timed and the regression and roofline cost
    models scored against it, built when the shape is first measured."""

    def __init__(self, b: Bench, hardware, calibration: dict, seed: int):
        self.b, self.hardware, self.calibration, self.seed = b, hardware, calibration, seed
        self._built: dict = {}

    def of(self, L: int, h: int) -> tuple:
        """(TinyDecoder, RegressionCostModel, RooflineCostModel) of the shape."""
        if (L, h) not in self._built:
            steps, b = self.calibration["step_model"], self.b
            spec = reference_spec(L, h, steps["arch"])
            self._built[(L, h)] = (
                TinyDecoder(L, h, device=b.device, dtype=b.dtype, seed=self.seed + L * 1000 + h),
                RegressionCostModel(spec, self.hardware, dtype=steps["dtype"], calibration=self.calibration),
                RooflineCostModel(spec, self.hardware, dtype=steps["dtype"]),
            )
        return self._built[(L, h)]

    def clear(self) -> None:
        self._built.clear()


def _time_prefills(b: Bench, plan: list, models: _PrefillModels, rounds: int) -> tuple[dict, list[float]]:
    """Per (layers, hidden, tokens, batch), the prefill's median time in every round, and the
    prefill sentinel timed at the start of each round. Settings past the budget (judged in the
    first round) are not measured in any round."""
    samples: dict = {}
    sentinel, sent_now = step_sentinel(b), []
    for r in range(rounds):
        sent_now.append(sentinel())
        for L, h, t, bsz in plan:
            key = (L, h, t, bsz)
            if r == 0 and b.over_budget(len(samples)):
                continue
            if key not in samples and r > 0:
                continue
            samples.setdefault(key, []).append(measure(models.of(L, h)[0].prefill_fn(bsz, t), b.timer, b.rep).median_s)
            b.progress(f"recompute check L{L} h{h} t{t} b{bsz} round {r + 1}/{rounds}")
    return samples, sent_now


def _recompute_row(models: tuple, key: tuple, smp: list[float], swept: list[list[int]]) -> dict:
    """One measured prefill against the regression (through the cost model and raw) and the roofline."""
    (L, h, t, bsz), (_, reg, roof) = key, models
    meas, cv = _rounds_median(smp)
    shape = BatchShape.prefill([t] * bsz)
    p_reg = reg.prefill_time_s(t) if bsz == 1 else reg.iteration_time_s(shape)
    p_roof = roof.iteration_time_s(shape)
    p_raw = float(reg.predictors["prefill"].predict([[L, h, t, bsz]])[0])
    return {
        "layers": L,
        "hidden": h,
        "tokens": t,
        "batch": bsz,
        "shape_measured": [L, h] in swept,
        "measured_s": meas,
        "rounds": len(smp),
        "rounds_cv": cv,
        "pred_regression_s": p_reg,
        "err_regression_pct": _pct(p_reg, meas),
        "pred_regressor_raw_s": p_raw,
        "err_regressor_raw_pct": _pct(p_raw, meas),
        "pred_roofline_s": p_roof,
        "err_roofline_pct": _pct(p_roof, meas),
    }


def _mape_or_none(sel: list[dict], key: str = "err_regression_pct") -> float | None:
    return float(np.mean([r[key] for r in sel])) if sel else None


def _recompute_summary(rows: list[dict], rounds: int, drift_f: float | None) -> dict:
    mape = _mape_or_none
    one = [r for r in rows if r["batch"] == 1]
    return {
        "rows": rows,
        "rounds": rounds,
        "drift": drift_f,
        "mape_recompute_drift_corrected": mape(one, "err_regression_drift_corrected_pct") if drift_f else None,
        "mape_recompute": mape(one),  # batch 1: a preempted sequence's recompute
        "mape_recompute_swept_shapes": mape([r for r in one if r["shape_measured"]]),
        "mape_recompute_unswept_shape": mape([r for r in one if not r["shape_measured"]]),
        "mape_batched_prefill": mape([r for r in rows if r["batch"] > 1]),
        "mape_regression": mape(rows),
        "mape_regressor_raw": mape(rows, "err_regressor_raw_pct"),
        "mape_roofline": mape(rows, "err_roofline_pct"),
        "mape_recompute_roofline": mape(one, "err_roofline_pct"),
        "rounds_cv_median": float(np.median([r["rounds_cv"] for r in rows])) if rows else None,
    }


# ---- sentinels: is the machine as fast as when the profile was measured? ------------------------------
SENTINELS = ("gemm 256x1024x1024", "copy 64 MiB", "prefill L2 h256 t64")


SENTINEL_STEP = (2, 256, 64)  # layers, hidden, prompt tokens of the prefill sentinel


def step_sentinel(b: Bench):
    """A callable timing the prefill sentinel (one prompt of 64 tokens, 2 x 256) once."""
    L, h, t = SENTINEL_STEP
    fn = TinyDecoder(L, h, device=b.device, dtype=b.dtype, seed=7).prefill_fn(1, t)
    return lambda: measure(fn, b.timer, b.rep).median_s


def sentinels(b: Bench, rounds: int = 3) -> dict[str, float]:
    """Three fixed benchmarks (compute, memory copy, a whole prefill step), each the median of
    `rounds` measurements. Measured when a profile is taken and again before a check, their
    ratio is how much faster or slower the machine has become in between (a shared VM's
    speed wanders by tens of percent over tens of minutes), which no predictor can know."""
    import torch
    import torch.nn.functional as F

    x = torch.empty(256, 1024, device=b.device).uniform_(-1, 1)
    w = torch.empty(1024, 1024, device=b.device).uniform_(-0.05, 0.05)
    src = torch.ones(64 << 20, dtype=torch.uint8, device=b.device)
    dst = torch.zeros(64 << 20, dtype=torch.uint8, device=b.device)
    model = TinyDecoder(2, 256, device=b.device, dtype=b.dtype, seed=7)
    fns = {
        SENTINELS[0]: lambda: F.linear(x, w),
        SENTINELS[1]: lambda: dst.copy_(src),
        SENTINELS[2]: model.prefill_fn(1, 64),
    }
    out = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            out[k].append(measure(fn, b.timer, b.rep).median_s)
    return {k: float(np.median(v)) for k, v in out.items()}


def drift(reference: dict[str, float], now: dict[str, float]) -> dict[str, float]:
    """now / reference per sentinel (> 1: the machine is slower now)."""
    return {k: now[k] / reference[k] for k in reference if k in now and reference[k] > 0}


def reference_sentinels(calibration: dict) -> dict[str, float] | None:
    """The profile's sentinels: the geometric mean of those at the start and the end of its sweeps."""
    s = calibration.get("sentinels") or {}
    runs = [v for k, v in s.items() if k in ("start", "after_sweeps") and v]
    if not runs:
        return None
    return {k: float(np.exp(np.mean([np.log(r[k]) for r in runs]))) for k in runs[0]}
