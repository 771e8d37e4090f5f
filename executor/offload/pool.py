"""InfiniGen's KV cache pool in host memory under a size limit (paper section 4.4).

One pool per layer holds, per sequence, at most `capacity` token entries (a token's K and V
of every head of that layer). When a new token's KV must be written into a full pool, a
victim entry is evicted and overwritten:

  fifo     the entry resident longest
  lru      the entry fetched least recently (a new entry counts as used when written)
  counter  the entry fetched least often: every prefetch increments the entry's counter; when
           a counter saturates (2^bits - 1) all counters of that sequence are halved

Ties go to the oldest entry. An evicted token is gone for good: no later query of that layer
can attend to it. All state is torch tensors [batch, max_tokens] so a batch of sequences
evicts in one vectorised step; the names match the simulator's `victim` parameter."""

from __future__ import annotations

import torch

from infersim.simulator.errors import InfersimError

VICTIMS = ("fifo", "lru", "counter")


class KVPool:
    def __init__(self, victim: str, batch: int, max_tokens: int, capacity: int, *, counter_bits: int = 8, device="cpu"):
        if victim not in VICTIMS:
            raise InfersimError(f"unknown pool victim policy '{victim}'; known: {', '.join(VICTIMS)}")
        if capacity < 1:
            raise InfersimError(f"KV pool capacity must be at least 1 token (got {capacity})")
        self.victim, self.capacity, self.max_tokens = victim, int(capacity), int(max_tokens)
        self.saturate = 2**counter_bits - 1
        z = dict(dtype=torch.long, device=device)
        self.resident = torch.zeros(batch, max_tokens, dtype=torch.bool, device=device)
        self.inserted = torch.zeros(batch, max_tokens, **z)  # insertion order (the token's position)
        self.last = torch.zeros(batch, max_tokens, **z)  # clock of the last fetch (or of the write)
        self.count = torch.zeros(batch, max_tokens, **z)  # fetch counter
        self.clock = 0
        self.evictions = 0
        self.evicted_previous = 0

    def _key(self) -> torch.Tensor:
        """Smaller = evicted first; the insertion order breaks ties (oldest first)."""
        if self.victim == "fifo":
            primary = torch.zeros_like(self.inserted)
        elif self.victim == "lru":
            primary = self.last
        else:
            primary = self.count
        key = primary * (self.max_tokens + 1) + self.inserted
        return key.masked_fill(~self.resident, torch.iinfo(torch.long).max)

    def insert(self, pos: int) -> torch.Tensor:
        """Write token `pos` of every sequence, evicting a victim where the pool is full;
        returns the evicted position per sequence (-1 where none)."""
        self.clock += 1
        full = self.resident.sum(dim=1) >= self.capacity
        evicted = torch.full((self.resident.shape[0],), -1, dtype=torch.long, device=self.resident.device)
        if bool(full.any()):
            victim = torch.argmin(self._key(), dim=1)
            rows = torch.nonzero(full).squeeze(1)
            self.resident[rows, victim[rows]] = False
            evicted[rows] = victim[rows]
            self.evictions += int(rows.numel())
            # how often the victim is the token written just before: a diagnostic of LFU's
            # bias against new entries (they have had no time to be fetched)
            self.evicted_previous += int((victim[rows] == pos - 1).sum())
        self.resident[:, pos] = True
        self.inserted[:, pos] = pos
        self.last[:, pos] = self.clock
        self.count[:, pos] = 0
        return evicted

    def access(self, fetched: torch.Tensor) -> None:
        """Record a prefetch of the entries in `fetched` [batch, n <= max_tokens] (bool)."""
        self.clock += 1
        n = fetched.shape[1]
        hit = fetched & self.resident[:, :n]
        self.last[:, :n] = torch.where(hit, torch.full_like(self.last[:, :n], self.clock), self.last[:, :n])
        self.count[:, :n] += hit.long()
        sat = (self.count >= self.saturate).any(dim=1)
        if bool(sat.any()):
            self.count[sat] //= 2

    def held(self, n: int) -> torch.Tensor:
        """Residency of the first n positions [batch, n]."""
        return self.resident[:, :n]


__all__ = ["KVPool", "VICTIMS"]
