"""A cost model for speculative rounds, fitted to the speculative executor on this machine.

The fitting, from held-out pipelined and coupled runs, is analysis/validate/spec_costmodel.py;
this is what prices a round from the fitted coefficients and reads and writes them.

A coupled round is the drafts' s autoregressive steps, then one target pass that prefills the
newly admitted sequences and verifies s_i + 1 rows per running sequence; the engine's own work
around it (voting, acceptance, bookkeeping, admission) sits between one round's start and the
next's. The round period is fitted (non-negative least squares in relative error, as
the executor fit) as a linear combination of

- target terms (`TARGET_FEATURES`): a constant, per verified sequence, verified rows,
  verified keys (cached context + rows), per prefilled sequence, prefill tokens, prefill score
  pairs, and the sequences of a pass that runs attention one sequence at a time;
- draft terms (`DRAFT_FEATURES`, summed over the drafts that run): per drafting step (each
  draft's batched forward pass), per sequence-step, keys read per sequence-step, the prompt
  tokens a draft feeds when it first drafts a sequence (its lazy prefill), and the sequences of
  that catch-up step, which runs attention one sequence at a time.

One sequence at a time: the executor batches the attention of short queries (up to
`SHORT_QUERY_MAX` tokens per sequence: verifications, decode steps) into one call per layer,
but a pass that holds a longer query (a prompt, a Medusa token tree) makes one attention call
per sequence per layer, for every sequence in it. On a GPU, where a small model's step is bound
by kernel launches, those calls are a per-sequence cost of their own: without these terms the
rounds that admit a prompt (the target's prefilling pass, the drafts' catch-up in the next
round) ran 1.2-1.6x their fitted time on H200 Minions runs, and the fit under-priced them.

The fitted coefficients become the simulator's cost objects: `SpecTargetCost` (what the
speculative replica asks for the verification pass: BatchShape rows with no cached context are
prefills, the others verifications) and one `SpecDraftCost` per draft (a decode step: step +
sequences + keys; a prefill shape: its tokens) — separate instances, because the simulator
sums the step times of distinct draft cost objects and counts a shared one once."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InfersimError
from ..metrics.rundir import write_json
from .base import CostModel, Direction
from .batch import BatchShape
from .calibration_file import SPEC_FIT_FORMAT, read_fit_json

TARGET_FEATURES = (
    "round",
    "verify_sequences",
    "verify_rows",
    "verify_keys",
    "prefill_sequences",
    "prefill_tokens",
    "prefill_pairs",
    "split_sequences",
)
DRAFT_FEATURES = ("draft_steps", "draft_sequence_steps", "draft_keys", "draft_prompt_tokens", "draft_split_sequences")
FEATURES = TARGET_FEATURES + DRAFT_FEATURES
# the longest query per sequence the executor's attention batches across sequences
# (executor/speculative/attention.py); a pass with a longer one runs attention per sequence
SHORT_QUERY_MAX = 16


def split_sequences(query_tokens: np.ndarray, alongside: int = 0) -> int:
    """Sequences whose attention runs one call each in a pass of these queries: all of them
    (with `alongside`, the pass's other rows) when one query is longer than SHORT_QUERY_MAX."""
    q = np.asarray(query_tokens)
    return int(q.size + alongside) if q.size and int(q.max()) > SHORT_QUERY_MAX else 0


def round_features(t: dict[str, np.ndarray]) -> np.ndarray:
    """FEATURES per executed round, from spec_rounds.rebuild_rounds."""
    nv = np.asarray(t["verify_seqs"], dtype=np.float64)
    rows = np.asarray(t["verify_tokens"], dtype=np.float64)
    ctx = np.asarray(t["verify_context"], dtype=np.float64)
    nd = np.asarray(t["n_drafts"], dtype=np.float64)
    drafted = np.asarray(t["drafted_tokens"], dtype=np.float64)
    mean_ctx = np.divide(ctx, nv, out=np.zeros_like(ctx), where=nv > 0)
    # keys a draft step reads: about the mean context (+ the step's own tokens) per sequence-step
    draft_keys = nd * drafted * (mean_ctx + 1.0)
    zero = np.zeros(nv.size, dtype=bool)
    npre = np.asarray(t["prefill_seqs"], dtype=np.float64)
    # a long query in the pass: every sequence's attention one call at a time; the drafts' catch-up
    # step (this round's first) carries the prompts the target prefilled last round
    split = (nv + npre) * np.asarray(t.get("long_query", zero), dtype=bool)
    draft_split = nd * nv * np.asarray(t.get("catchup_long", zero), dtype=bool)
    # pipelined: a verification pass has no draft work (the drafting thread's rounds are priced apart)
    on = ~np.asarray(t.get("pipelined", zero), dtype=bool)
    nd = nd * on
    draft_keys = draft_keys * on
    draft_split = draft_split * on
    return np.column_stack(
        [
            np.ones_like(nv),
            nv,
            rows,
            ctx + rows,
            npre,
            np.asarray(t["prefill_tokens"], dtype=np.float64),
            np.asarray(t["prefill_pairs"], dtype=np.float64),
            split,
            np.asarray(t["draft_steps"], dtype=np.float64),
            nd * drafted,
            draft_keys,
            nd * np.asarray(t["catchup_tokens"], dtype=np.float64),
            draft_split,
        ]
    )


class _SpecCost(CostModel):
    """A part of the round fit: its slice of the coefficients; no host copies."""

    def __init__(self, coef: np.ndarray):
        self.c = np.asarray(coef, dtype=np.float64)

    def transfer_time_s(self, nbytes: float, direction: Direction) -> float:
        return 0.0  # the speculative executor never swaps


class SpecTargetCost(_SpecCost):
    """The target's pass (verification + prefills + the engine's per-round work)."""

    name = "executor_spec_fit_target"

    def iteration_time_s(self, batch: BatchShape) -> float:
        q = np.asarray(batch.query_tokens, dtype=np.float64)
        ctx = np.asarray(batch.context_tokens, dtype=np.float64)
        pre = ctx == 0  # the executor prefills whole prompts: a row with no cached context is a prefill
        ver = ~pre
        x = np.array(
            [
                1.0,
                ver.sum(),
                q[ver].sum(),
                (ctx[ver] + q[ver]).sum(),
                pre.sum(),
                q[pre].sum(),
                (q[pre] ** 2).sum(),
                split_sequences(q),
            ]
        )
        return float(x @ self.c)


class SpecDraftCost(_SpecCost):
    """One draft's steps: a decode step (step + sequences + keys) or its lazy prefill (tokens,
    and with a prompt longer than SHORT_QUERY_MAX the sequences of that catch-up step: the
    prompts' and the `alongside` sequences the draft decodes in the same pass)."""

    name = "executor_spec_fit_draft"

    def iteration_time_s(self, batch: BatchShape) -> float:
        q = np.asarray(batch.query_tokens, dtype=np.float64)
        if q.size == 0:
            return 0.0
        if np.all(q == 1):
            ctx = np.asarray(batch.context_tokens, dtype=np.float64)
            return float(self.c[0] + self.c[1] * q.size + self.c[2] * (ctx + 1.0).sum())
        return float(self.c[3] * q.sum() + self.c[4] * split_sequences(q, batch.alongside))


class SpecFit:
    """The fitted coefficients with what they were fitted on."""

    def __init__(self, coef, meta: dict | None = None):
        self.coef = np.asarray(coef, dtype=np.float64)
        if self.coef.shape != (len(FEATURES),):
            raise InfersimError(f"speculative fit: expected {len(FEATURES)} coefficients, got {self.coef.shape}")
        self.meta = dict(meta or {})

    @property
    def target(self) -> SpecTargetCost:
        return SpecTargetCost(self.coef[: len(TARGET_FEATURES)])

    def drafts(self, n: int) -> list[SpecDraftCost]:
        return [SpecDraftCost(self.coef[len(TARGET_FEATURES) :]) for _ in range(max(1, n))]

    def predict_rounds(self, t: dict) -> np.ndarray:
        return round_features(t) @ self.coef

    def scaled(self, factor: float, why: str = "", draft_factor: float | None = None) -> "SpecFit":
        """Every time multiplied by factor (the machine's speed changed by 1/factor); with
        draft_factor, the draft terms by that instead (a pipelined run's drafting process runs
        on the other core, whose speed moves on its own). A pipelined fit's hand-over is the
        verifying engine's host time: scaled with the target terms."""
        coef = self.coef * float(factor)
        meta = {**self.meta, "scaled_by": float(factor), "scaled_because": why}
        if draft_factor is not None:
            coef[len(TARGET_FEATURES) :] = self.coef[len(TARGET_FEATURES) :] * float(draft_factor)
            meta["draft_scaled_by"] = float(draft_factor)
        if meta.get("pipeline_handoff_s"):
            meta["pipeline_handoff_s"] = float(meta["pipeline_handoff_s"]) * float(factor)
        return SpecFit(coef, meta)

    def predict_parts(self, t: dict) -> tuple[np.ndarray, np.ndarray]:
        """(draft, target) seconds per executed round."""
        X = round_features(t)
        k = len(TARGET_FEATURES)
        return X[:, k:] @ self.coef[k:], X[:, :k] @ self.coef[:k]

    def to_json(self) -> dict:
        return {
            "format": SPEC_FIT_FORMAT,
            "features": list(FEATURES),
            "coefficients": {f: float(c) for f, c in zip(FEATURES, self.coef)},
            "meta": self.meta,
        }

    def save(self, path: Path) -> None:
        write_json(Path(path), self.to_json())

    @classmethod
    def load(cls, path: Path) -> "SpecFit":
        d = read_fit_json(path, "speculative fit")
        if d.get("format") != SPEC_FIT_FORMAT:
            raise InfersimError(f"{path}: not a speculative executor fit (format {d.get('format')!r})")
        # a fit saved before a term existed did without it: zero
        return cls([d["coefficients"].get(f, 0.0) for f in FEATURES], d.get("meta"))
