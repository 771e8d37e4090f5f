"""The executed speculative rounds, rebuilt from a speculative `sim exec` run directory.

speculation_rounds.parquet has one row per round (coupled: draft s steps, then one target pass
that prefills the newly admitted and verifies everyone else; pipelined: one verification pass)
with totals only. The batch of each round follows from the engine's rules (executor/speculative/
decoder.py): admission is FCFS in (arrival, id) order, `prefill_seqs` of them per round; a
sequence retires after the round in which it finished (finish time after the round's start);
its cached context when verified is prompt + generated - 1 (the last committed token is fed
again). So per round the sums the cost is linear in are exact: prefill tokens and score pairs,
verified rows (drafted + one per sequence), the verified sequences' cached contexts; and the
drafts' catch-up (a sequence's first drafting step feeds its whole prompt: drafts prefill
lazily, in the round after the target's prefill)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from infersim.simulator.costmodel.speculative_fit import SHORT_QUERY_MAX
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import read_columns
from infersim.simulator.speculative.config import SpeculationSection

from .measured import engine_periods, load_run


def rebuild_rounds(run_dir: Path) -> dict[str, np.ndarray]:
    """The rounds table plus per-round: prefill_tokens, prefill_pairs, verify_tokens,
    verify_context (sum of cached contexts of verified sequences), catchup_tokens (prompt
    tokens the drafts feed in this round's first step), long_query (the target's pass holds a
    query longer than SHORT_QUERY_MAX: a prompt or a token tree), catchup_long (so does the
    drafts' first step: last round's prompts), period_s (start to the next round's start; NaN
    before an idle wait and for the last), n_drafts."""
    run = load_run(run_dir)
    t = read_columns(Path(run_dir) / "speculation_rounds.parquet")
    req = run.requests
    arrival = np.asarray(req["arrival_s"], dtype=np.float64)
    prompt = np.asarray(req["prompt_tokens"], dtype=np.int64)
    output = np.asarray(req["output_tokens"], dtype=np.int64)
    finish = np.asarray(req["finish_s"], dtype=np.float64)
    order = np.lexsort((np.arange(arrival.size), arrival))
    start = np.asarray(t["t_start_s"], dtype=np.float64)
    n = start.size
    npre = np.asarray(t["prefill_seqs"], dtype=np.int64)
    if int(npre.sum()) != arrival.size:
        raise InfersimError(
            f"{run_dir}: {int(npre.sum())} prefills in speculation_rounds.parquet for " f"{arrival.size} requests"
        )
    # the round in which each request finished: the last one that started before its finish
    done_round = np.searchsorted(start, finish, side="left") - 1
    out_tok = np.asarray(t["tokens_out"], dtype=np.int64)
    cum_out = np.concatenate([[0], np.cumsum(out_tok)])
    cols = {
        k: np.zeros(n, dtype=np.int64) for k in ("prefill_tokens", "prefill_pairs", "verify_context", "catchup_tokens")
    }
    admitted = np.concatenate([[0], np.cumsum(npre)])
    prompt_long = np.zeros(n, dtype=bool)
    prev_pre_tokens = 0
    for r in range(n):
        new = order[admitted[r] : admitted[r + 1]]
        p = prompt[new]
        cols["prefill_tokens"][r] = int(p.sum())
        cols["prefill_pairs"][r] = int((p * p).sum())
        prompt_long[r] = bool((p > SHORT_QUERY_MAX).any())
        # verified now: admitted in earlier rounds and not finished before this round
        old = order[: admitted[r]]
        run_now = old[done_round[old] >= r]
        fin = old[done_round[old] < r]
        generated = int(cum_out[r]) - int(output[fin].sum())  # tokens of the sequences still running
        ctx_all = int(prompt[run_now].sum()) + generated - run_now.size
        # pipelined: a verification takes only the drafted sequences from the pool (their share)
        nv = int(t["verify_seqs"][r])
        cols["verify_context"][r] = ctx_all if nv >= run_now.size else int(round(ctx_all * nv / max(1, run_now.size)))
        cols["catchup_tokens"][r] = prev_pre_tokens
        prev_pre_tokens = int(p.sum())
    t.update(cols)
    t["verify_tokens"] = np.asarray(t["drafted_tokens"], dtype=np.int64) + np.asarray(t["verify_seqs"], dtype=np.int64)
    nv = np.asarray(t["verify_seqs"], dtype=np.int64)
    tree = t["verify_tokens"] > SHORT_QUERY_MAX * np.maximum(nv, 1)  # Medusa's trees: more rows per sequence
    t["long_query"] = prompt_long | tree
    t["catchup_long"] = np.concatenate([[False], prompt_long[:-1]])
    end = np.asarray(t["t_end_s"], dtype=np.float64)
    period, _ = engine_periods({"t_start_s": start, "t_end_s": end, "swap_s": np.zeros(n)}, arrival)
    t["period_s"] = period
    sp = (run.config.get("workload") or {}).get("speculation") or {}
    t["n_drafts"] = np.full(n, drafts_run(sp), dtype=np.int64)
    pipelined = bool((run.summary.get("speculation") or {}).get("pipelined"))
    t["pipelined"] = np.full(n, pipelined)
    if pipelined:
        # the drafting thread prefills and drafts on its own: no draft work in a verification
        t["catchup_tokens"] = np.zeros(n, dtype=np.int64)
    # what the simulator's pass costs: coupled, the whole round (start to the next start, the
    # engine's bookkeeping included); pipelined, the verifying thread's busy time for the pass
    # (from taking the drafted sequences to the end of its bookkeeping; waits for drafts excluded)
    t["fit_y_s"] = (end - start) if pipelined else period
    return t


def drafts_run(sp: dict) -> int:
    """How many draft models the executor runs for a `speculation:` section (as run): every
    draft under the majority vote, else the first alone (executor/speculative/engine.py, as the
    simulator's DraftProposer; `voting.enabled: false` under method minions too); Medusa none
    (its heads run inside the target pass)."""
    if sp.get("method") == "medusa":
        return 0
    section = SpeculationSection.model_validate(sp)
    return len(section.drafts) if section.voting_on else 1


def drafting_rounds(run_dir: Path) -> dict[str, np.ndarray] | None:
    """A pipelined run's drafting rounds (speculation_drafting.parquet, written by the
    validation hook) with n_drafts; None when the run has none."""
    path = Path(run_dir) / "speculation_drafting.parquet"
    if not path.is_file():
        return None
    t = read_columns(path)
    run = load_run(run_dir)
    sp = (run.config.get("workload") or {}).get("speculation") or {}
    t["n_drafts"] = np.full(len(t["t_start_s"]), drafts_run(sp), dtype=np.int64)
    busy = np.asarray(t["t_end_s"], dtype=np.float64) - np.asarray(t["t_start_s"], dtype=np.float64)
    # a group whose sequences all had one token left drafted nothing (microseconds): the table
    # does not say which, so such rounds are left out (the simulator charges them nothing too)
    t["busy_s"] = np.where(busy < 0.2 * np.median(busy), np.nan, busy) if busy.size else busy
    return t


def handoffs_s(rounds: dict, drafting: dict) -> np.ndarray:
    """A pipelined run's hand-overs from verification to drafting: for each drafting round that
    waited for work and began after a verification ended (and after its own previous round), the
    time from that verification's end to its start. The verifying thread's bookkeeping after a
    pass (token commits, releases, `end` is stamped before them) and the drafting thread's
    wake-up, which no pass time prices (the simulator's `pipeline.handoff_s`)."""
    if "waited_s" not in drafting:  # recorded before the drafting table had its waits
        return np.zeros(0)
    te = np.asarray(rounds["t_end_s"], dtype=np.float64)
    ds = np.asarray(drafting["t_start_s"], dtype=np.float64)
    de = np.asarray(drafting["t_end_s"], dtype=np.float64)
    waited = np.asarray(drafting["waited_s"], dtype=np.float64)
    k = np.searchsorted(te, ds, side="right") - 1  # the last verification ended before each round
    prev_end = np.concatenate([[-np.inf], de[:-1]])
    m = (k >= 0) & (waited > 0)
    m[m] &= te[k[m]] > prev_end[m]  # it waited for that verification, not for an earlier one
    return ds[m] - te[k[m]]
