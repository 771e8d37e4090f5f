"""The coupled speculative loop with continuous batching: every round the proposer drafts for
every running sequence (each draft's steps batched across sequences), then one target forward
pass prefills newly admitted sequences and verifies everyone else's drafts.

s per round: fixed, or the simulator's `AdaptiveLengthSelector` (fed t = the round's time,
drafting + verification, and vl = mean tokens the round gave a sequence). A sequence never
drafts past its output length: s_i = min(s, remaining - 1), so a round commits at most the
tokens the request still wants. Admission reserves a sequence's whole KV (prompt + output +
s_max) in both the target's and the drafts' pools, so nothing is ever preempted."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from infersim.simulator.errors import InfersimError

from ..clock import Clock
from .acceptance import AcceptanceRecorder

ROUND_COLUMNS = (
    "round",
    "t_start_s",
    "t_end_s",
    "draft_s",
    "verify_s",
    "batch_size",
    "prefill_seqs",
    "verify_seqs",
    "s",
    "drafted_tokens",
    "accepted_tokens",
    "tokens_out",
    "draft_steps",
    "target_blocks_used",
    "target_blocks_released",
)
_FLOAT = {"t_start_s", "t_end_s", "draft_s", "verify_s"}


def round_row(number: int, times_s: tuple, seqs: tuple[int, int], counts: tuple, target, released: int) -> tuple:
    """One row in ROUND_COLUMNS order: times_s = (start, end, draft, verify); seqs = (prefilled,
    verified) sequences; counts = (s, drafted, accepted, tokens out, draft steps); then the
    target's blocks in use and those it released since it had released `released`."""
    n_prefill, n_verify = seqs
    return (
        number,
        *times_s,
        n_prefill + n_verify,
        n_prefill,
        n_verify,
        *counts,
        target.cache.used_gpu,
        target.released_blocks - released,
    )


@dataclass
class DecodeStats:
    rounds: list = field(default_factory=list)  # tuples in ROUND_COLUMNS order
    recorder: AcceptanceRecorder = field(default_factory=AcceptanceRecorder)

    def table(self) -> dict[str, np.ndarray]:
        a = np.array(self.rounds, dtype=np.float64).reshape(-1, len(ROUND_COLUMNS))
        return {c: (a[:, i] if c in _FLOAT else a[:, i].astype(np.int64)) for i, c in enumerate(ROUND_COLUMNS)}

    @property
    def verify_rounds(self) -> int:
        """Sequence-rounds that verified (one target step for one sequence)."""
        return int(sum(r[7] for r in self.rounds))

    def acceleration_rate(self) -> float:
        """Tokens per target step per sequence (verifying rounds only; 1.0 = plain decoding)."""
        n = self.verify_rounds
        out = sum(r[11] for r in self.rounds) - sum(r[6] for r in self.rounds)  # minus prefill tokens
        return out / n if n else float("nan")


def verified_length(results, s_list, s: int) -> float:
    """The selector's vl, as the simulator computes it: mean tokens per sequence over the
    sequences that drafted the full s (one cut short by its remaining output says nothing
    about s); over all of them if none did."""
    full = [k + 1 for (k, _), si in zip(results, s_list) if si == s]
    pool = full or [k + 1 for k, _ in results]
    return sum(pool) / len(pool)


def kv_blocks_for(seqs, s_max: int, block_size: int) -> int:
    """Blocks for every sequence's worst case at once (prompt + output + s_max drafted)."""
    return sum(-(-(s.prompt_len + s.output_len + s_max + 1) // block_size) for s in seqs) + 1


class SpeculativeDecoder:
    def __init__(
        self,
        target,
        proposer,
        *,
        s: int = 4,
        temperature: float = 0.0,
        seed: int = 0,
        selector=None,
        max_batch_size: int = 256,
        s_max: int | None = None,
    ):
        if temperature > 0 and not proposer.samples_with_rejection:
            raise InfersimError(
                f"{type(proposer).__name__}: sampling (temperature > 0) is not supported; " f"use greedy verification"
            )
        self.target = target
        self.proposer = proposer
        self.fixed_s = int(s)
        self.selector = selector
        self.s_max = int(s_max if s_max is not None else (selector.s_max if selector is not None else s))
        self.temperature = float(temperature)
        self.generator = torch.Generator(device=target.device)
        self.generator.manual_seed(int(seed))
        self.max_batch_size = int(max_batch_size)
        self.stats = DecodeStats()
        self.s_series: list[tuple[int, int]] = []  # (round, s) whenever s changes
        self._round = 0
        self._reserved = 0
        self._sync = (lambda: torch.cuda.synchronize(target.device)) if target.device.type == "cuda" else (lambda: None)

    @property
    def s(self) -> int:
        return self.selector.s if self.selector is not None else self.fixed_s

    # ---- admission: reserve a sequence's whole KV so nothing needs preemption --------------
    def _need(self, seq) -> int:
        return self.target.cache.blocks_for_tokens(seq.prompt_len + seq.output_len + self.s_max + 1)

    def can_admit(self, seq) -> bool:
        pools = [self.target.cache] + [d.cache for d in getattr(self.proposer, "drafts", [])]
        need = self._need(seq)
        return all(self._reserved + need <= p.total_gpu for p in pools)

    def admit(self, seq) -> None:
        self._reserved += self._need(seq)

    def retire(self, seq) -> None:
        self._reserved -= self._need(seq)
        self.target.release(seq)
        self.proposer.release(seq)

    # ---- one round -------------------------------------------------------------------------
    def round(self, prefill, ready, t_start: float = 0.0):
        """Draft for `ready` (prefilled sequences), then one target pass: prefill `prefill`,
        verify `ready`. Returns (k, token) per ready sequence."""
        s = self.s
        if not self.s_series or self.s_series[-1][1] != s:
            self.s_series.append((self._round, s))
        s_list = [max(0, min(s, seq.remaining - 1)) for seq in ready]
        t0 = time.perf_counter()
        prop = self.proposer.propose(ready, s_list, self.temperature, self.generator)
        self._sync()
        t1 = time.perf_counter()
        items = [
            (seq, prop.tokens[i], prop.probs[i] if prop.probs is not None else None) for i, seq in enumerate(ready)
        ]
        released = self.target.released_blocks
        results = self.target.step(prefill, items, self.temperature, self.generator)
        self._sync()
        t2 = time.perf_counter()
        self.proposer.feedback(ready, prop, results, s_list)
        acc = 0
        for (k, _), si in zip(results, s_list):
            self.stats.recorder.add(si, k)
            acc += k
        drafted = sum(s_list)
        out = len(prefill) + acc + len(results)
        if self.selector is not None and drafted:
            self.selector.observe(t2 - t0, verified_length(results, s_list, s))
        times_s = (t_start, t_start + (t2 - t0), t1 - t0, t2 - t1)
        counts = (s, drafted, acc, out, prop.draft_steps)
        self._close_round(
            prefill, ready, round_row(self._round, times_s, (len(prefill), len(ready)), counts, self.target, released)
        )
        return results

    def _close_round(self, prefill, ready, row: tuple) -> None:
        """Record the round's row and count the round for each of its sequences."""
        self.stats.rounds.append(row)
        self._round += 1
        for seq in prefill:
            seq.rounds += 1
        for seq in ready:
            seq.rounds += 1

    # ---- a whole batch -------------------------------------------------------------------------
    def generate(self, seqs, progress=None, clock=None, observer=None) -> list[list[int]]:
        """Serve every sequence with continuous batching up to max_batch_size; returns each
        one's output tokens. clock (a `Clock`): sequences are admitted from their arrival_s on
        (default: all present at once); observer: gets on_admit / on_round / on_finish calls."""
        clock = clock or Clock(realtime=False)
        waiting = sorted(seqs, key=lambda s: (s.arrival_s, s.rid))
        running = []
        while waiting or running:
            prefill = admit_arrived(self, waiting, len(running), clock, observer)
            if not prefill and not running:
                if waiting and waiting[0].arrival_s > clock.now():
                    clock.wait_until(waiting[0].arrival_s)
                    continue
                raise InfersimError(
                    f"request {waiting[0].rid} ({waiting[0].prompt_len} + {waiting[0].output_len} "
                    f"tokens) does not fit the KV pool"
                )
            clock.step()
            start = clock.now()
            released = self.target.released_blocks
            results = self.round(prefill, running, start)
            end = clock.now()
            if observer is not None:
                observer.on_round(prefill, running, results, start, end, self.target.released_blocks - released)
            running = running + prefill
            still = []
            for seq in running:
                if seq.done:
                    self.retire(seq)
                    if observer is not None:
                        observer.on_finish(seq, end)
                    if progress is not None:
                        progress(seq)
                else:
                    still.append(seq)
            running = still
        return [s.output_ids for s in seqs]


def admit_arrived(dec, waiting: list, n_running: int, clock, observer) -> list:
    """Pop from `waiting` (in arrival order) the sequences that have arrived and fit: the batch
    limit and the KV reservation (FCFS: the head blocks the rest)."""
    out = []
    now = clock.now()
    while (
        waiting
        and waiting[0].arrival_s <= now
        and n_running + len(out) < dec.max_batch_size
        and dec.can_admit(waiting[0])
    ):
        seq = waiting.pop(0)
        dec.admit(seq)
        seq.first_scheduled_s = now
        if observer is not None:
            observer.on_admit(seq, now)
        out.append(seq)
    return out
