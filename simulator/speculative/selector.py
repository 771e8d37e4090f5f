"""Minions section 3.3: the adaptive speculation length selector, as a policy object.

s_optimal = argmin_s t_LLM(b, s) / vl(s) (Equation 4). An online monitor records t / vl at
every verification (t: the LLM's verification time; vl: the average verified length of the
batch). Adjustments wait until `decision_threshold` samples have come in since the last change
(requests drafted with the old s are still in the pool, so the new s needs time to show); then
a line is fitted through the samples of the previous setting and the new ones (the transition
from 1 to 3 in the paper's Figure 6) and its slope decides:

  rule "paper":        slope > 0 -> s -= s_punish;   slope <= 0 -> s += s_reward
  rule "directional":  slope > 0 -> step back against the last change (by s_punish);
                       slope <= 0 -> keep going the way of the last change (by s_reward)

The paper's rule, read literally, assumes the last change was an increase: after a decrease
that made t/vl worse it decreases again, and noise near the optimum can start a slide down
to s_min (docs/findings/minions.md measures it). `directional` (the default) reads "punish"
as "undo the last change", which is the same rule whenever the last change was an increase.
vl here counts the tokens a verification yields per request (accepted + the target's own
token), so it is never zero."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def fitted_slope(y) -> float:
    """Least-squares slope of y against its index."""
    y = np.asarray(y, dtype=np.float64)
    if y.size < 2:
        return 0.0
    x = np.arange(y.size, dtype=np.float64)
    x -= x.mean()
    return float((x * (y - y.mean())).sum() / (x * x).sum())


@dataclass
class AdaptiveLengthSelector:
    s: int = 4
    decision_threshold: int = 20
    s_reward: int = 1
    s_punish: int = 1
    s_min: int = 1
    s_max: int = 12
    rule: str = "directional"
    previous: list = field(default_factory=list)  # samples of the setting before the last change
    current: list = field(default_factory=list)  # samples since the last change
    last_move: int = 1  # +1: the last change raised s; -1: lowered it
    decisions: int = 0
    last_slope: float = 0.0

    @classmethod
    def from_section(cls, sec) -> "AdaptiveLengthSelector":
        """The selector a workload's `speculation` section describes (its starting length and
        its `selector` settings); simulator, executor and validation build it here alike."""
        c = sec.selector
        return cls(
            s=sec.speculation_length,
            decision_threshold=c.decision_threshold,
            s_reward=c.s_reward,
            s_punish=c.s_punish,
            s_min=c.s_min,
            s_max=c.s_max,
            rule=c.rule,
        )

    def __post_init__(self):
        if self.rule not in ("paper", "directional"):
            raise ValueError(f"unknown selector rule '{self.rule}'")
        self.s = int(min(max(self.s, self.s_min), self.s_max))

    def observe(self, t: float, vl: float) -> bool:
        """Record one verification (its time t and verified length vl); True when s changed."""
        self.current.append(float(t) / max(float(vl), 1e-12))
        if len(self.current) < self.decision_threshold:
            return False
        return self.decide()

    def decide(self) -> bool:
        window = self.previous[-self.decision_threshold :] + self.current
        slope = fitted_slope(window)
        self.last_slope = slope
        old = self.s
        if self.rule == "paper":
            step = -self.s_punish if slope > 0 else self.s_reward
        else:
            direction = -self.last_move if slope > 0 else self.last_move
            step = direction * (self.s_punish if slope > 0 else self.s_reward)
        self.s = int(min(max(self.s + step, self.s_min), self.s_max))
        if self.s != old:
            self.last_move = 1 if self.s > old else -1
        elif self.rule == "directional":
            self.last_move = -self.last_move  # pinned at a bound: try the other way next time
        self.previous, self.current = self.current, []
        self.decisions += 1
        return self.s != old
