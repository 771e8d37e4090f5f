"""Speculation metrics in the papers' terms, accumulated by a replica as it runs.

- acceleration rate (Medusa): tokens per decoding step per sequence, i.e. per verification;
- overhead (Medusa): time of a speculative step relative to a plain decode step of the same
  batch (coupled: SSM steps + verification; pipelined: the LLM's verification pass alone);
- speedup (model) = acceleration rate / overhead; the wall-time speedup needs a plain run of
  the same workload (analysis/reproduce/* compute it);
- acceptance rate (Minions): accepted / speculated, averaged over rounds that speculated;
- tokens per step per request; SSM and LLM busy and idle time; the pool depth, the chosen s and
  the SSM weights over time (thinned to `series_max_points` in summary.json; `series_frames`
  gives the full series as tables)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd


def thin_rows(rows: list, limit: int) -> list:
    if len(rows) <= limit:
        return rows
    idx = np.unique(np.linspace(0, len(rows) - 1, limit).round().astype(int))
    return [rows[i] for i in idx]


def _pct(x: np.ndarray) -> dict:
    if x.size == 0:
        return {"mean": float("nan"), "p10": float("nan"), "p50": float("nan"), "p90": float("nan")}
    p10, p50, p90 = np.percentile(x, [10, 50, 90])
    return {"mean": float(x.mean()), "p10": float(p10), "p50": float(p50), "p90": float(p90)}


@dataclass(frozen=True)
class VerifiedRound:
    """One verification pass over the decoding sequences of a batch: what `SpecStats.round`
    records and what the replica's proposer learns from."""

    end_s: float  # when the verification ended
    seqs: list  # the decoding sequences verified
    drafted: np.ndarray  # k: tokens drafted per sequence
    accepted: np.ndarray  # drafted tokens accepted per sequence
    tokens: np.ndarray  # tokens each sequence gained: accepted + 1, cut at its remaining output
    voted: np.ndarray  # the SSM whose draft each sequence took (-1: none)
    rates: np.ndarray  # accepted / drafted per sequence (0 where nothing was drafted)
    step_s: float  # the speculative step: coupled, drafting + verification; pipelined, the LLM pass
    plain_s: float  # a plain decode step of the same batch
    s_drafted: int | np.ndarray  # the speculation length each sequence drafted under (one for all when coupled)
    lengths: Optional[np.ndarray] = None  # every SSM's agreement length per sequence (voting)

    @property
    def s(self) -> int:
        """The round's speculation length: the mean over its sequences, rounded."""
        return int(round(np.mean(self.s_drafted)))


class SpecStats:
    def __init__(self, names: list[str]):
        self.names = list(names)
        self.rounds = 0  # verification passes with at least one decoding sequence
        self.seq_rounds = 0  # (sequence, verification) pairs
        self.spec_seq_rounds = 0  # ... that speculated (k > 0)
        self.tokens = 0
        self.accepted = 0
        self.drafted = 0
        self.rate_sum = 0.0  # sum of accepted / k over speculating pairs
        self.step_time_s = 0.0  # sum over rounds of the speculative step time
        self.plain_time_s = 0.0  # sum over rounds of a plain decode of the same batch
        self.verify_time_s = 0.0
        self.draft_time_s = 0.0
        self.kv_released_blocks = 0
        self.kv_fit_shrinks = 0
        self.per_request: dict[int, list] = {}  # rid -> [tokens, rounds]
        self.voted_counts = np.zeros(len(names), dtype=np.int64)
        self.s_series: list[tuple] = []
        self.pool_series: list[tuple] = []
        self.weight_series: list[tuple] = []
        self.round_series: list[tuple] = []  # (t_end, batch, mean tokens, step time, s)

    def round(self, r: VerifiedRound) -> None:
        n = len(r.seqs)
        if n == 0:
            return
        k, tokens = r.drafted, r.tokens
        self.rounds += 1
        self.seq_rounds += n
        spec = k > 0
        self.spec_seq_rounds += int(spec.sum())
        self.tokens += int(tokens.sum())
        self.accepted += int(r.accepted.sum())
        self.drafted += int(k.sum())
        self.rate_sum += float(r.rates[spec].sum())
        self.step_time_s += r.step_s
        self.plain_time_s += r.plain_s
        for seq, t in zip(r.seqs, tokens.tolist()):
            rec = self.per_request.get(seq.rid)
            if rec is None:
                self.per_request[seq.rid] = [t, 1]
            else:
                rec[0] += t
                rec[1] += 1
        voted = r.voted
        if voted.size and self.voted_counts.size:
            v = voted[voted >= 0]
            if v.size:
                self.voted_counts += np.bincount(v, minlength=self.voted_counts.size)
        self.round_series.append((r.end_s, n, float(tokens.mean()), r.step_s, r.s))

    def summary(self, now: float, busy: dict[str, float], proposer, limit: int, extra: dict | None = None) -> dict:
        acc_rate = self.tokens / self.seq_rounds if self.seq_rounds else float("nan")
        overhead = self.step_time_s / self.plain_time_s if self.plain_time_s else float("nan")
        per_req = np.array([t / r for t, r in self.per_request.values()]) if self.per_request else np.zeros(0)
        out = {
            "rounds": self.rounds,
            "sequence_rounds": self.seq_rounds,
            "acceleration_rate": acc_rate,
            "overhead": overhead,
            "speedup_model": acc_rate / overhead if self.plain_time_s else float("nan"),
            "acceptance_rate": self.rate_sum / self.spec_seq_rounds if self.spec_seq_rounds else float("nan"),
            "accepted_tokens": self.accepted,
            "drafted_tokens": self.drafted,
            "tokens": self.tokens,
            "tokens_per_step_per_request": _pct(per_req),
            "mean_batch": self.seq_rounds / self.rounds if self.rounds else float("nan"),
            "kv_blocks_released_on_rejection": self.kv_released_blocks,
            "kv_lookahead_shrinks": self.kv_fit_shrinks,
            "s": self._s_summary(proposer),
            "engines": {
                name: {"busy_s": b, "idle_s": max(0.0, now - b), "busy_fraction": b / now if now else 0.0}
                for name, b in busy.items()
            },
            "series": {
                "s": {"columns": ["t_s", "s"], "rows": thin_rows(self.s_series, limit)},
                "pool_depth": {"columns": ["t_s", "depth"], "rows": thin_rows(self.pool_series, limit)},
                "weights": {"columns": ["t_s"] + self.names, "rows": thin_rows(self.weight_series, limit)},
                "rounds": {
                    "columns": ["t_s", "batch", "tokens_per_seq", "step_s", "s"],
                    "rows": thin_rows(self.round_series, limit),
                },
            },
        }
        if self.names and proposer.voting:
            out["voting"] = {
                "ssms": self.names,
                "voted_outputs": self.voted_counts.tolist(),
                "final_weights": [float(w) for w in proposer.weights.weights],
                "weight_updates": proposer.weights.updates,
            }
        if self.pool_series:
            depth = np.array([d for _, d in self.pool_series], dtype=np.float64)
            t = np.array([t for t, _ in self.pool_series] + [now])
            dt = np.diff(t)
            out["pool"] = {
                "mean_depth_time_weighted": float((depth * dt).sum() / dt.sum()) if dt.sum() > 0 else 0.0,
                "max_depth": int(depth.max()),
            }
        if extra:
            out.update(extra)
        return out

    def _s_summary(self, proposer) -> dict:
        rows = self.round_series
        if not rows:
            return {"final": proposer.s}
        s = np.array([r[4] for r in rows], dtype=np.float64)
        w = np.array([r[1] for r in rows], dtype=np.float64)
        vals, counts = np.unique(s, return_counts=True)
        return {
            "final": int(proposer.s),
            "mean_per_round": float(s.mean()),
            "mean_per_sequence": float((s * w).sum() / w.sum()),
            "mode": int(vals[counts.argmax()]),
            "changes": max(0, len(self.s_series) - 1),
        }


def series_frames(replica) -> dict:
    """The full time series of one speculative replica as pandas DataFrames."""
    st = replica.stats
    return {
        "s": pd.DataFrame(st.s_series, columns=["t_s", "s"]),
        "pool_depth": pd.DataFrame(st.pool_series, columns=["t_s", "depth"]),
        "weights": pd.DataFrame(st.weight_series, columns=["t_s"] + st.names),
        "rounds": pd.DataFrame(st.round_series, columns=["t_s", "batch", "tokens_per_seq", "step_s", "s"]),
    }


def write_series(sim, folder) -> list:
    """CSV files speculation_<series>[_r<replica>].csv of every speculative replica of a run."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rep in sim.replicas:
        if not hasattr(rep, "stats"):
            continue
        suffix = f"_r{rep.index}" if len(sim.replicas) > 1 else ""
        for name, df in series_frames(rep).items():
            p = folder / f"speculation_{name}{suffix}.csv"
            df.to_csv(p, index=False)
            paths.append(p)
    return paths
