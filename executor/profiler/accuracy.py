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

    from infersim.executor.kvcache import KVCacheConfig, PagedKVCache

    models = SWAP_MODELS_QUICK if quick else SWAP_MODELS_FULL
    lengths = SWAP_TOKENS_QUICK if quick else SWAP_TOKENS_FULL
    rounds = rounds or (1 if quick else 5)
    td = torch_dtype(kv_dtype)
    es = torch.empty((), dtype=td).element_size()
    rows = []
    # the copy sweep's reference copies, timed again each round: how far the bandwidth has moved
    copy_sentinel: list[float] = []

    def copy_sentinel_s() -> float:  # buffers made per call: on the CPU each copy holds 256 MiB
        plan = copy_reference_plan(b.device.type)
        return float(np.mean([measure(copy_fn(b, d, pinned, n), b.timer, b.rep).median_s for d, _, pinned, n in plan]))

    def predict(nbytes, direction):
        return link[f"{direction}_latency_us"] * 1e-6 + nbytes / (link[f"{direction}_gbps"] * 1e9)

    for mname, (L, kvh, d) in models.items():
        block_bytes = 2 * L * BLOCK * kvh * d * es
        max_blocks = -(-max(lengths) // BLOCK)
        # pools several times the largest sequence and past the caches, so successive repeats
        # copy different blocks (swapped-out KV was written long before, not sitting in cache)
        pool = max(4 * max_blocks, int(np.ceil(((64 if quick else 256) << 20) / block_bytes)))
        pinned = b.device.type == "cuda"
        dev = torch.full((pool, L, 2, BLOCK, kvh, d), 0.5, dtype=td, device=b.device)
        host = torch.full((pool, L, 2, BLOCK, kvh, d), 0.5, dtype=td, pin_memory=pinned)
        layer_k = torch.full((L, pool, BLOCK, kvh, d), 0.5, dtype=td, device=b.device)
        layer_hk = torch.full((L, pool, BLOCK, kvh, d), 0.5, dtype=td, pin_memory=pinned)
        layer_v, layer_hv = layer_k.clone(), layer_hk.clone()
        cache = PagedKVCache(L, kvh, d, KVCacheConfig(pool, BLOCK, pool, watermark=0.0, dtype=td), b.device)
        for t in (cache._k, cache._v, cache._hk, cache._hv):
            t.fill_(0.5)  # commit the pages before timing
        cache._clean = [True] * pool
        samples = {n: {"out": [], "in": [], "layers": [], "executor": []} for n in lengths}
        for r in range(rounds):
            copy_sentinel.append(copy_sentinel_s())
            for n in lengths:
                if r == 0 and b.over_budget(len(rows) + sum(1 for v in samples.values() if v["out"])):
                    samples.pop(n, None)
                    continue
                if n not in samples:
                    continue
                nblk = -(-n // BLOCK)
                state = {"s": 0}

                def span(nblk=nblk, state=state):
                    s = state["s"]
                    state["s"] = (s + nblk) % (pool - nblk)
                    return s

                def out_fn(nblk=nblk, span=span):
                    s = span()
                    host[s : s + nblk].copy_(dev[s : s + nblk])

                def in_fn(nblk=nblk, span=span):
                    s = span()
                    dev[s : s + nblk].copy_(host[s : s + nblk])

                def layers_pair(nblk=nblk, span=span):
                    s = span()
                    for l in range(L):
                        layer_hk[l, s : s + nblk].copy_(layer_k[l, s : s + nblk])
                        layer_hv[l, s : s + nblk].copy_(layer_v[l, s : s + nblk])
                    for l in range(L):
                        layer_k[l, s : s + nblk].copy_(layer_hk[l, s : s + nblk])
                        layer_v[l, s : s + nblk].copy_(layer_hv[l, s : s + nblk])

                seq = _Seq()
                cache.grow_to(seq, n)

                def ex_pair(seq=seq):
                    cache.swap_out([seq])
                    cache.swap_in([seq])

                smp = samples[n]
                smp["out"].append(measure(out_fn, b.timer, b.rep).median_s)
                smp["in"].append(measure(in_fn, b.timer, b.rep).median_s)
                smp["layers"].append(measure(layers_pair, b.timer, b.rep).median_s)
                smp["executor"].append(measure(ex_pair, b.timer, b.rep).median_s)
                cache.free(seq)
                b.progress(f"swap check {mname} n={n} round {r + 1}/{rounds}")
        for n, smp in samples.items():
            nbytes = -(-n // BLOCK) * block_bytes
            (t_out, cv_out), (t_in, cv_in) = _rounds_median(smp["out"]), _rounds_median(smp["in"])
            rows.append(
                {
                    "model": mname,
                    "tokens": n,
                    "blocks": -(-n // BLOCK),
                    "bytes": nbytes,
                    "rounds": len(smp["out"]),
                    "swap_out_s": t_out,
                    "swap_in_s": t_in,
                    "rounds_cv_out": cv_out,
                    "rounds_cv_in": cv_in,
                    "per_layer_swap_s": _rounds_median(smp["layers"])[0],
                    "executor_swap_s": _rounds_median(smp["executor"])[0],
                }
            )
        dev = host = layer_k = layer_v = layer_hk = layer_hv = cache = None  # free before the next model
    for r in rows:
        p_out, p_in = predict(r["bytes"], "d2h"), predict(r["bytes"], "h2d")
        r.update(
            pred_out_s=p_out,
            pred_in_s=p_in,
            err_out_pct=_pct(p_out, r["swap_out_s"]),
            err_in_pct=_pct(p_in, r["swap_in_s"]),
            err_swap_pct=_pct(p_out + p_in, r["swap_out_s"] + r["swap_in_s"]),
            err_per_layer_pct=_pct(p_out + p_in, r["per_layer_swap_s"]),
            err_executor_pct=_pct(p_out + p_in, r["executor_swap_s"]),
        )
    drift_f = float(np.median(copy_sentinel)) / copy_reference_s if copy_reference_s and copy_sentinel else None
    if drift_f:
        for r in rows:
            r["err_swap_drift_corrected_pct"] = _pct(
                (r["pred_out_s"] + r["pred_in_s"]) * drift_f, r["swap_out_s"] + r["swap_in_s"]
            )
    return {
        "rows": rows,
        "rounds": rounds,
        "drift": drift_f,
        "mape_swap_drift_corrected": float(np.mean([r["err_swap_drift_corrected_pct"] for r in rows]))
        if drift_f
        else None,
        "mape_out": float(np.mean([r["err_out_pct"] for r in rows])),
        "mape_in": float(np.mean([r["err_in_pct"] for r in rows])),
        "mape_swap": float(np.mean([r["err_swap_pct"] for r in rows])),
        "mape_per_layer_swap": float(np.mean([r["err_per_layer_pct"] for r in rows])),
        "mape_executor_swap": float(np.mean([r["err_executor_pct"] for r in rows])),
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
    arch, dtype = steps["arch"], steps["dtype"]
    rounds = rounds or (1 if quick else 5)
    plan = recompute_plan(steps["domain"], quick)
    models: dict = {}
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
            if (L, h) not in models:
                spec = reference_spec(L, h, arch)
                models[(L, h)] = (
                    TinyDecoder(L, h, device=b.device, dtype=b.dtype, seed=seed + L * 1000 + h),
                    RegressionCostModel(spec, hardware, dtype=dtype, calibration=calibration),
                    RooflineCostModel(spec, hardware, dtype=dtype),
                )
            samples.setdefault(key, []).append(measure(models[(L, h)][0].prefill_fn(bsz, t), b.timer, b.rep).median_s)
            b.progress(f"recompute check L{L} h{h} t{t} b{bsz} round {r + 1}/{rounds}")
    rows = []
    shapes = [[int(a), int(c)] for a, c in steps.get("shapes", [])]
    for (L, h, t, bsz), smp in samples.items():
        _, reg, roof = models[(L, h)]
        meas, cv = _rounds_median(smp)
        shape = BatchShape.prefill([t] * bsz)
        p_reg = reg.prefill_time_s(t) if bsz == 1 else reg.iteration_time_s(shape)
        p_roof = roof.iteration_time_s(shape)
        p_raw = float(reg.predictors["prefill"].predict([[L, h, t, bsz]])[0])
        rows.append(
            {
                "layers": L,
                "hidden": h,
                "tokens": t,
                "batch": bsz,
                "shape_measured": [L, h] in shapes,
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
        )
    models.clear()

    def mape(sel, key="err_regression_pct"):
        return float(np.mean([r[key] for r in sel])) if sel else None

    one = [r for r in rows if r["batch"] == 1]
    ref = steps.get("sentinel_geomean_s")
    drift_f = float(np.median(sent_now)) / ref if ref else None
    if drift_f:
        for r in rows:
            r["err_regression_drift_corrected_pct"] = _pct(r["pred_regression_s"] * drift_f, r["measured_s"])
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
