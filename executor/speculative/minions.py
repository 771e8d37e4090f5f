"""Minions (Wang et al. 2024) on real models: several drafts (SSMs) each draft s tokens for every
sequence; the simulator's `MajorityVoter` merges a sequence's drafts into a token tree and
picks the heaviest path (one SSM's draft, the voted SSM); the target verifies that draft; the
simulator's `SSMWeights` then updates the SSMs' weights from their acceptance rates (ACR).

The objects are the simulator's own (simulator/speculative/minions.py), so the executor and
the simulator vote and reweight identically; ties are broken by a random priority per
request, as the simulator does. What verification reveals of an SSM's draft: the target's
tokens up to the first rejection and its correction, so SSM j's agreement for a sequence is
the prefix of its draft equal to those tokens (min(L_j, accepted + 1), Minions' rate divides
by s). Greedy only: the voted draft is chosen by looking at the drafted tokens, so it is not
a sample from any one draft's distribution and rejection sampling would not be exact."""

from __future__ import annotations

import contextlib

import numpy as np

from infersim.simulator.errors import InfersimError
from infersim.simulator.speculative.minions import MajorityVoter, SSMWeights

from .proposers import Proposal


def _agreement(draft: list[int], revealed: list[int]) -> int:
    n = 0
    for a, b in zip(draft, revealed):
        if a != b:
            break
        n += 1
    return n


class MinionsProposer:
    samples_with_rejection = False

    def __init__(self, drafts, weights: SSMWeights | None = None, *, acr_scope: str = "all", seed: int = 0):
        if not drafts:
            raise InfersimError("Minions needs at least one draft model")
        if acr_scope not in ("all", "voted"):
            raise InfersimError(f"voting.acr_scope must be 'all' or 'voted', got {acr_scope!r}")
        self.drafts = list(drafts)
        self.names = [d.name for d in self.drafts]
        m = len(self.drafts)
        self.weights = weights if weights is not None else SSMWeights(np.ones(m))
        if self.weights.weights.size != m:
            raise InfersimError(f"{self.weights.weights.size} voting weights for {m} drafts")
        self.acr_scope = acr_scope
        self.seed = int(seed)
        # the pipeline swaps in a lock: its verifying thread reweights while the drafting thread votes
        self.lock = contextlib.nullcontext()
        self.rng = np.random.default_rng([int(seed), 11])
        # history for reports: one entry per verification
        self.voted_counts = np.zeros(m, dtype=np.int64)
        self.agree_tokens = np.zeros(m)  # sum over outputs of each SSM's revealed agreement
        self.voted_accepted = np.zeros(m)  # accepted / s summed over the outputs each SSM was voted for
        self.drafted_outputs = 0
        self.drafted_tokens = 0
        self.history: list[dict] = []

    def propose(self, seqs, s_list, temperature=0.0, generator=None) -> Proposal:
        if temperature > 0:
            raise InfersimError(
                "Minions voting is implemented for greedy verification only " "(speculation.sampling.mode: greedy)"
            )
        steps = 0
        outs = []
        for d in self.drafts:
            before = d.steps
            outs.append(d.propose(seqs, s_list)[0])
            steps += d.steps - before
        with self.lock:
            voter = MajorityVoter(self.weights.weights.copy())
        tokens, voted = [], []
        for i, s in enumerate(s_list):
            if s <= 0:
                tokens.append([])
                voted.append(-1)
                continue
            pr = self.rng.random(len(self.drafts))
            v = voter.vote([outs[j][i] for j in range(len(self.drafts))], priority=pr)
            tokens.append(list(v.tokens))
            voted.append(int(v.voted))
        return Proposal(tokens, None, outs, voted, draft_steps=steps)

    def feedback(self, seqs, proposal, results, s_list) -> dict:
        m = len(self.drafts)
        rows, voted, vrates = [], [], []
        for i, ((k, t), s) in enumerate(zip(results, s_list)):
            if s <= 0:
                continue
            revealed = proposal.tokens[i][:k] + [t]
            agree = [_agreement(proposal.outputs[j][i], revealed) for j in range(m)]
            rows.append([a / s for a in agree])
            self.agree_tokens += agree
            v = proposal.voted[i]
            voted.append(v)
            vrates.append(k / s)
            self.voted_counts[v] += 1
            self.voted_accepted[v] += k / s
            self.drafted_outputs += 1
            self.drafted_tokens += s
        if not rows:
            return {}
        rates = np.asarray(rows)
        acrs = self.weights.update_all(rates) if self.acr_scope == "all" else self.weights.update(voted, vrates)
        self.history.append(
            {
                "acr": {int(j): float(a) for j, a in acrs.items()},
                "agreement": rates.mean(axis=0).tolist(),
                "weights": self.weights.weights.tolist(),
                "voted": np.bincount(np.asarray(voted), minlength=m).tolist(),
            }
        )
        return acrs

    def release(self, seq) -> None:
        for d in self.drafts:
            d.release(seq)

    def summary(self) -> dict:
        """Per SSM: times voted, mean acceptance when voted (Minions' ACR), and its agreement rate
        (tokens of its own drafts the verification confirmed / tokens it drafted)."""
        out = {}
        for j, name in enumerate(self.names):
            n = int(self.voted_counts[j])
            out[name] = {
                "voted": n,
                "voted_share": n / max(1, self.drafted_outputs),
                "acr_when_voted": float(self.voted_accepted[j] / n) if n else None,
                "agreement_rate": float(self.agree_tokens[j] / max(1, self.drafted_tokens)),
                "weight": float(self.weights.weights[j]),
            }
        return out
