"""What drafts a round: no draft (plain decoding), one draft model, or Minions (minions.py).
A proposer drafts for a batch (`propose`) and hears the verification's outcome (`feedback`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Proposal:
    tokens: list  # per sequence, the drafted tokens to verify
    probs: list | None = None  # per sequence [s_i, V] draft probabilities (sampling) or None
    outputs: list | None = None  # Minions: per SSM, per sequence, its own draft
    voted: list | None = None  # Minions: per sequence, the voted SSM
    draft_steps: int = 0


@dataclass
class NoDraft:
    """Plain decoding through the same loop: nothing drafted, every round one token."""

    names: list = field(default_factory=list)
    samples_with_rejection = True

    def propose(self, seqs, s_list, temperature=0.0, generator=None) -> Proposal:
        return Proposal([[] for _ in seqs])

    def feedback(self, seqs, proposal, results, s_list) -> None:
        pass

    def release(self, seq) -> None:
        pass


class SingleDraft:
    """One draft model (`DraftModel`)."""

    samples_with_rejection = True

    def __init__(self, draft):
        self.draft = draft
        self.names = [draft.name]

    def propose(self, seqs, s_list, temperature=0.0, generator: torch.Generator | None = None) -> Proposal:
        before = self.draft.steps
        tokens, probs = self.draft.propose(seqs, s_list, temperature, generator)
        return Proposal(tokens, probs, draft_steps=self.draft.steps - before)

    def feedback(self, seqs, proposal, results, s_list) -> None:
        pass

    def release(self, seq) -> None:
        self.draft.release(seq)

    @property
    def drafts(self):
        return [self.draft]
