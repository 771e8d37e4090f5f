"""The machine's speed at a moment: a fixed pair of real iterations of the validated model.

On a shared machine the speed wanders (other processes take the cores) by tens of percent
over minutes, so a fit measured a minute before the validated run can be off for reasons that
have nothing to do with the cost model. As `sim profile` does with its sentinels, the
validation times the same fixed work — a 128-token prefill and a decode step of 8 sequences
over 128 cached tokens, through the executor's own runner and paged cache — around the
calibration runs and around the validated run, and scales the fit by the ratio. This uses no
measurement of the validated run itself; the report states the factor."""

from __future__ import annotations

import time

import numpy as np

_LOADED: dict = {}


def sentinel_s(
    model: str, *, device: str = "cpu", dtype: str | None = None, threads: int = 1, rounds: int = 12
) -> float:
    """Median over rounds of (prefill + decode) time of the fixed work, in seconds."""
    import torch

    from infersim.executor.engine import ExecSequence
    from infersim.executor.kvcache import KVCacheConfig, runner_cache
    from infersim.executor.models import load_model
    from infersim.executor.runner import build_runner, plan_batch

    prev = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    try:
        key = (model, device, dtype)
        if key not in _LOADED:  # loading costs seconds; the sentinel runs several times per case
            lm = load_model(model, device=device, dtype=dtype)
            _LOADED.clear()
            _LOADED[key] = (lm, build_runner(lm))
        lm, runner = _LOADED[key]
        bs, prompt, batch = 16, 128, 8
        cache = runner_cache(runner, KVCacheConfig((batch + 1) * (prompt // bs + 2), bs, dtype=lm.dtype), lm.device)
        rng = np.random.default_rng(0)
        seqs = [
            ExecSequence(-1 - i, rng.integers(1, lm.vocab_size, prompt + 1).tolist(), 1, 0.0) for i in range(batch + 1)
        ]
        for s in seqs:
            cache.grow_to(s, prompt + 1)
            s.computed = prompt
        pre, dec = seqs[0], seqs[1:]

        def sync():
            if lm.device.type == "cuda":
                torch.cuda.synchronize(lm.device)

        times = []
        with torch.inference_mode():
            for r in range(rounds + 2):  # two warm-up rounds
                pre.computed = 0
                sync()
                t = time.perf_counter()
                runner.forward(plan_batch(cache, [(pre, prompt)], lm.device), cache)
                runner.forward(plan_batch(cache, [(s, 1) for s in dec], lm.device), cache)
                sync()
                if r >= 2:
                    times.append(time.perf_counter() - t)
        return float(np.median(times))
    finally:
        torch.set_num_threads(prev)
