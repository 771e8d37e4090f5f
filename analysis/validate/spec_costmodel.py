"""Fits the speculative round cost model (simulator/costmodel/speculative_fit.py) to the
speculative executor on this machine.

A coupled round is the drafts' s autoregressive steps, then one target pass that prefills the
newly admitted sequences and verifies s_i + 1 rows per running sequence; the engine's own work
around it (voting, acceptance, bookkeeping, admission) sits between one round's start and the
next's. The round period is fitted (non-negative least squares in relative error, as
calibrate.py) as a linear combination of the target and draft terms listed there
(`TARGET_FEATURES`, `DRAFT_FEATURES`); the coefficients become its `SpecTargetCost` and
`SpecDraftCost`."""

from __future__ import annotations

import numpy as np

from infersim.simulator.costmodel.speculative_fit import FEATURES, TARGET_FEATURES, SpecFit, round_features
from infersim.simulator.errors import InfersimError

from .calibrate import nnls_relative
from .spec_rounds import handoffs_s


def drafting_features(d: dict) -> np.ndarray:
    """DRAFT_FEATURES per drafting round of a pipelined run (speculation_drafting.parquet): each
    draft runs s steps over the group and, in its first, prefills the sequences it drafts for the
    first time (`prompt_tokens`, as the simulator's lazy draft prefill; absent from older tables,
    then zero and absorbed by the other terms); contexts are not recorded there (absorbed by the
    per-step terms), nor which groups caught up on a prompt (draft_split_sequences: zero)."""
    nd = np.asarray(d["n_drafts"], dtype=np.float64)
    s = np.asarray(d["s"], dtype=np.float64)
    n = np.asarray(d["sequences"], dtype=np.float64)
    z = np.zeros_like(s)
    prompts = np.asarray(d["prompt_tokens"], dtype=np.float64) if "prompt_tokens" in d else z
    return np.column_stack([nd * s, nd * n * s, z, nd * prompts, z])


def _fit(X, y) -> tuple[np.ndarray, dict]:
    coef, kept = nnls_relative(X, y)
    ok = np.isfinite(y) & (y > 0)
    rel = np.abs(X[ok] @ coef - y[ok]) / y[ok]
    return coef, {
        "points": int(ok.sum()),
        "kept": int(kept.sum()),
        "mape_in_sample": float(rel.mean()),
        "median_ape_in_sample": float(np.median(rel)),
    }


def overlap_fraction(starts, ends, other_starts, other_ends) -> np.ndarray:
    """Per interval [start, end): the fraction of it during which an interval of the other
    thread ran too."""
    a, b = np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
    c, d = np.asarray(other_starts, dtype=np.float64), np.asarray(other_ends, dtype=np.float64)
    out = np.zeros(a.size)
    for i in range(a.size):
        both = np.clip(np.minimum(d, b[i]) - np.maximum(c, a[i]), 0.0, None).sum()
        out[i] = both / (b[i] - a[i]) if b[i] > a[i] else 0.0
    return out


SOLO = 0.1  # a pass overlapped by the other thread for less than this fraction ran alone
SHARED = 0.9  # ... for more than this fraction ran alongside it all the time


def fit_rounds(tables: list[dict], meta: dict | None = None, drafting: list[dict] | None = None) -> SpecFit:
    """Fit the rounds of held-out runs. Coupled: the round period on every term. Pipelined
    (`drafting`: each run's drafting rounds, in the order of `tables`): the executor's drafting
    and verifying threads are two threads of one process, and a pass that runs while the other
    thread is busy takes about twice as long (measured: 1.7-2.0x the solo fit) — they share the
    GIL and the cores. So the target terms are fitted on the verifying passes that ran alone,
    the draft terms on the drafting rounds that ran alone, and the slowdown while both run
    becomes the simulator's shared-device model (`pipeline.placement: shared`): each engine's
    share of its solo speed, from the passes that ran alongside the other thread throughout
    (meta["pipeline_shares"])."""
    if not tables:
        raise InfersimError("speculative calibration: no runs to fit")
    X = np.vstack([round_features(t) for t in tables])
    y = np.concatenate([np.asarray(t["fit_y_s"], dtype=np.float64) for t in tables])
    info = dict(meta or {})
    pipelined = bool(np.concatenate([np.asarray(t["pipelined"]) for t in tables]).any())
    if not pipelined:
        coef, info["round_fit"] = _fit(X, y)
        return SpecFit(coef, info)
    if not drafting or len(drafting) != len(tables):
        raise InfersimError(
            "speculative calibration: a pipelined run without speculation_drafting.parquet (run it "
            "through executor.speculative.validate_hooks.execute)"
        )
    k = len(TARGET_FEATURES)
    ov_v = np.concatenate(
        [overlap_fraction(t["t_start_s"], t["t_end_s"], d["t_start_s"], d["t_end_s"]) for t, d in zip(tables, drafting)]
    )
    ov_d = np.concatenate(
        [overlap_fraction(d["t_start_s"], d["t_end_s"], t["t_start_s"], t["t_end_s"]) for t, d in zip(tables, drafting)]
    )
    coef = np.zeros(len(FEATURES))
    solo = ov_v < SOLO
    if solo.sum() < 2 * k:  # too few passes ran alone: fit on all (the shares then come out near 1)
        solo = np.ones_like(solo)
    coef[:k], info["round_fit"] = _fit(X[solo][:, :k], y[solo])
    info["round_fit"]["solo_only"] = True
    Xd = np.vstack([drafting_features(d) for d in drafting])
    yd = np.concatenate([np.asarray(d["busy_s"], dtype=np.float64) for d in drafting])
    # steps and sequence-steps, and the prompts the drafts prefill where the table records them
    # (no contexts: those are absorbed by the per-step terms)
    cols = [0, 1, 3] if all("prompt_tokens" in d for d in drafting) else [0, 1]
    dsolo = ov_d < SOLO
    # the two draft terms (per step, per sequence-step) need the solo rounds to span group sizes:
    # a calibration whose solo drafting rounds were all single sequences (plus a stalled one of 8)
    # fitted 5x the per-sequence cost and doubled the simulated drafting time; then fit on every
    # drafting round (the contention is then inside the fit, and the ssm share comes out near 1)
    sizes = np.concatenate([np.asarray(d["sequences"], dtype=np.int64) for d in drafting])
    spread = sum(1 for v in np.unique(sizes[dsolo]) if np.count_nonzero(sizes[dsolo] == v) >= 5)
    solo_only = bool(dsolo.sum() >= 8 and spread >= 3)
    if not solo_only:
        dsolo = np.ones_like(dsolo)
    c, info["drafting_fit"] = _fit(Xd[dsolo][:, cols], yd[dsolo])
    info["drafting_fit"]["solo_only"] = solo_only
    coef[k + np.array(cols)] = c
    fit = SpecFit(coef, info)
    # whole-pass contention (simulator/speculative/device.py): share = solo time / measured time
    # over the passes the other thread overlapped at all (>= SOLO of the pass). Measured on the
    # held-out runs: verifying passes overlapped 10-50% of their time took 1.7-1.8x their solo
    # time, as those overlapped throughout (1.6-1.7x) — the slowdown is not proportional to the
    # overlap, so processor sharing at the shares of the fully overlapped passes (kept below as
    # `pipeline_shares_sharing`) under-priced the partly overlapped ones (-18% on the verifying
    # passes of a validated run)
    # Verifying passes that prefill get their own share: their work is mostly in kernels that run
    # on their own core, a decode pass of a small model mostly interpreter work the other thread
    # holds up (held-out runs: overlapped prefilling passes 1.04-1.14x their solo time, decode-only
    # 1.2-1.75x; one share for both over-priced the prefills by 11-19% and so TTFT by 30-50%)
    prefills = np.concatenate([np.asarray(t["prefill_seqs"]) for t in tables]) > 0
    shares, sharing = {}, {}
    for name, pred, meas, ov, sel in (
        ("llm", X[:, :k] @ coef[:k], y, ov_v, ~prefills),
        ("llm_prefill", X[:, :k] @ coef[:k], y, ov_v, prefills),
        ("ssm", Xd @ coef[k:], yd, ov_d, np.ones(yd.size, dtype=bool)),
    ):
        ok = np.isfinite(meas) & (meas > 0) & sel
        for out, m in ((shares, ok & (ov >= SOLO)), (sharing, ok & (ov > SHARED))):
            fallback = out.get("llm", 1.0) if name == "llm_prefill" else 1.0  # too few prefilling passes: as decode
            out[name] = float(np.clip(np.median(pred[m] / meas[m]), 0.05, 1.0)) if m.sum() >= 5 else fallback
            out[name + "_points"] = int(m.sum())
    # No contention (the drafts in their own process, executor/speculative/remote.py): overlapped
    # verifying passes ran no slower than the solo fit, in fact 6-14% faster than the passes that
    # ran alone, which are few and follow a wait for drafts. Then the target terms come from every
    # pass (per-pass MAPE 5.7% against 9.9-15.6% for the solo fit, two validations) and the
    # simulator gets no slowdown (shares 1)
    m = np.isfinite(y) & (y > 0) & (ov_v >= SOLO)
    if m.sum() >= 5 and np.median((X[m, :k] @ coef[:k]) / y[m]) >= 1.0:
        coef[:k], info["round_fit"] = _fit(X[:, :k], y)
        info["round_fit"]["solo_only"] = False
        fit = SpecFit(coef, info)
        shares = {name: 1.0 for name in ("llm", "llm_prefill", "ssm")}
        fit.meta["pipeline_contention_absent"] = True
    fit.meta["pipeline_shares"] = shares
    fit.meta["pipeline_contention"] = "whole_pass"
    # the verifying thread's bookkeeping and the hand-over after each pass, which no pass time
    # holds: held-out runs' median (0.14-0.25 ms, 15-28 ms over a matrix case's ~180 passes,
    # most of what the simulated run finished early by when the passes were priced right)
    hand = np.concatenate([handoffs_s(t, d) for t, d in zip(tables, drafting)])
    fit.meta["pipeline_handoff_s"] = float(np.median(hand)) if hand.size >= 5 else 0.0
    fit.meta["pipeline_handoff_points"] = int(hand.size)
    fit.meta["pipeline_shares_sharing"] = sharing
    return fit


def contended(solo, overlap, share, contention: str = "sharing") -> np.ndarray:
    """A pass's time given its solo time and the fraction of it the other thread ran alongside
    (as executed), as simulator/speculative/device.py prices it: processor sharing slows the
    overlapped part only; whole_pass slows the whole pass once the overlap reaches SOLO."""
    solo, overlap = np.asarray(solo, dtype=np.float64), np.asarray(overlap, dtype=np.float64)
    if contention == "whole_pass":
        return np.where(overlap >= SOLO, solo / share, solo)
    return solo * ((1.0 - overlap) + overlap / share)


def predict_rounds_as_run(fit: SpecFit, t: dict, drafting: dict | None = None) -> np.ndarray:
    """Each executed round's time as the simulator prices it: the fit's solo time, and for a
    pipelined run whose fit has shares, the contention of the drafting thread's rounds that
    overlapped it (as executed), at its own share (prefilling passes at `llm_prefill`)."""
    pred = fit.predict_rounds(t)
    shares = (fit.meta or {}).get("pipeline_shares")
    if drafting is None or not shares:
        return pred
    share = np.where(np.asarray(t["prefill_seqs"]) > 0, shares.get("llm_prefill", shares["llm"]), shares["llm"])
    return contended(
        pred,
        overlap_fraction(t["t_start_s"], t["t_end_s"], drafting["t_start_s"], drafting["t_end_s"]),
        share,
        fit.meta.get("pipeline_contention", "sharing"),
    )


def predict_drafting(fit: SpecFit, d: dict) -> np.ndarray:
    return drafting_features(d) @ fit.coef[len(TARGET_FEATURES) :]
