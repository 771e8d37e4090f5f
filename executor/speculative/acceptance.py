"""Acceptance by position, recorded from real verification rounds and written as the
simulator's acceptance data (simulator/catalog/acceptance/<target>.yaml, the `empirical` /
`positional` AcceptanceSpec of simulator/speculative/config.py), so `sim run` can model the
pairs the executor measured.

Per round and sequence: s (tokens drafted) and k (tokens accepted). Position i (1-based) was
tried when s >= i and k >= i - 1, accepted when k >= i: the positional probability is
accepted_i / tried_i. At one fixed s the histogram of k is the `empirical` spec itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from infersim.simulator.speculative.acceptance import AcceptanceTable
from infersim.simulator.yamlio import write_atomic


class AcceptanceRecorder:
    def __init__(self):
        self.hist: dict[int, np.ndarray] = {}  # s -> counts of k = 0..s

    def add(self, s: int, k: int) -> None:
        s, k = int(s), int(k)
        if s <= 0:
            return
        if not 0 <= k <= s:
            raise ValueError(f"accepted {k} of {s} drafted tokens")
        h = self.hist.get(s)
        if h is None:
            h = self.hist[s] = np.zeros(s + 1, dtype=np.int64)
        h[k] += 1

    def merge(self, other: "AcceptanceRecorder") -> None:
        for s, h in other.hist.items():
            self.hist[s] = self.hist.get(s, np.zeros(s + 1, dtype=np.int64)) + h

    def at(self, s: int) -> "AcceptanceRecorder":
        """Only the rounds that drafted exactly s (the rounds cut short by a request's end are
        left out of a table recorded at s)."""
        r = AcceptanceRecorder()
        if s in self.hist:
            r.hist = {s: self.hist[s].copy()}
        return r

    @property
    def rounds(self) -> int:
        return int(sum(h.sum() for h in self.hist.values()))

    def by_position(self) -> tuple[np.ndarray, np.ndarray]:
        """(tried_i, accepted_i) for positions i = 1..max s."""
        smax = max(self.hist, default=0)
        tried, acc = np.zeros(smax, dtype=np.int64), np.zeros(smax, dtype=np.int64)
        for s, h in self.hist.items():
            for k, c in enumerate(h):
                # positions 1..min(k+1, s) were tried, 1..k accepted
                tried[: min(k + 1, s)] += c
                acc[:k] += c
        return tried, acc

    def positional_probs(self) -> list[float]:
        tried, acc = self.by_position()
        keep = tried > 0
        return (acc[keep] / tried[keep]).tolist()

    def mean_acceptance(self) -> float:
        """Accepted / drafted over all rounds (pooled: a round weighs by its s)."""
        num = sum(float((np.arange(s + 1) * h).sum()) for s, h in self.hist.items())
        den = sum(float(s * h.sum()) for s, h in self.hist.items())
        return num / den if den else float("nan")

    def mean_round_acceptance(self) -> float:
        """Minions' acceptance rate as the simulator reports it (simulator/speculative/report.py):
        accepted / drafted of each (round, sequence) that drafted, averaged over them. Differs
        from the pooled mean_acceptance when s varies (rounds cut short by a request's end, an
        adaptive s): a short round's ratio is its first positions', which accept more often."""
        num = sum(float((np.arange(s + 1) / s * h).sum()) for s, h in self.hist.items())
        n = self.rounds
        return num / n if n else float("nan")

    def tokens_per_step(self) -> float:
        """Mean tokens a verification yields (accepted + the target's own): the acceleration rate."""
        n = self.rounds
        return sum(float(((np.arange(s + 1) + 1) * h).sum()) for s, h in self.hist.items()) / n if n else float("nan")

    def entry(
        self, draft: str, dataset: str, *, mode: str = "greedy", temperature: float = 0.0, source: str = ""
    ) -> dict:
        """A table entry: `empirical` when every round drafted the same s, else `positional`."""
        if not self.hist:
            raise ValueError("nothing recorded")
        e = {
            "draft": draft,
            "dataset": dataset,
            "measured_mode": mode,
            "measured_temperature": float(temperature),
            "source": source,
        }
        if len(self.hist) == 1:
            ((s, h),) = self.hist.items()
            e.update(kind="empirical", recorded_s=int(s), counts=[int(c) for c in h])
        else:
            e.update(kind="positional", probs=[round(p, 6) for p in self.positional_probs()])
        return e


def write_acceptance_table(
    path: str | Path, *, target: str, entries: list[dict], source: str, notes: str = "", drafts: dict | None = None
) -> Path:
    """Write (atomically) an acceptance table the simulator loads with
    simulator.speculative.acceptance.load_table; validated before it is written."""
    data = {
        "name": Path(path).stem,
        "target": target,
        "source": source,
        "notes": notes,
        "drafts": dict(drafts or {}),
        "entries": entries,
    }
    AcceptanceTable.model_validate(data)  # never write a table the simulator would refuse
    header = (
        f"# Acceptance of draft tokens by {target}, recorded by the real executor (executor/speculative).\n"
        f"# In a workload: acceptance: {{table: <this file, or its name when it lies in "
        f"simulator/catalog/acceptance>, draft: <draft>, dataset: <dataset>}}\n"
    )
    text = header + yaml.safe_dump(data, sort_keys=False, width=100)
    write_atomic(path, text)
    return Path(path)


# ---- recording the zoo's table ---------------------------------------------------------------------
