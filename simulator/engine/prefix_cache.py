"""Automatic prefix caching: a pool of KV block ids whose full blocks are found again by the
identity of their tokens, after vLLM v1's `BlockPool` (vllm/v1/core/block_pool.py,
https://docs.vllm.ai/en/latest/design/prefix_caching.html). Python and numpy, no torch: the simulator's block
accounting and the real executor's paged KV cache both keep their block ids here.

Interface (every count is in blocks, every id an int in [0, num_blocks)):

- A block's key names its tokens *and every token before them*: `chain_keys` builds
  key_i = H(key_{i-1}, tokens of block i) from token ids; any other deterministic hashable
  (an int, a tuple of ints) that has that property serves as well, e.g. a trace's prefix-block
  hash ids. Only full blocks get a key.
- `lookup(keys)`: how many leading keys have a cached block (the length of the cache hit).
- `take_cached(keys)`: the block ids of those keys, each with one more reference.
- `allocate(n)`: n blocks with one reference each, never-cached free blocks first, then the
  least recently released cached blocks, evicted (their keys forgotten).
- `cache(block_id, key)`: a block just filled becomes findable under `key`; a key already held
  by another block (two requests computed the same prefix at once) stays with that block, and
  this one stays anonymous, going back to the free blocks when released (vLLM v1 keeps both
  under the key; the hits are the same). `cache_run(block_ids, keys)` does it for a run of
  blocks; `holds_any(keys)` tells whether any of them is cached.
- `free(block_ids)`: one reference less each; a block that reaches zero goes back to the pool,
  and if it holds a key it stays cached and enters the LRU evictor. A sequence's blocks are
  released tail first, so its last blocks are evicted before its prefix, which more requests
  share.
- `touch(block_ids)`: one more reference each (a block shared by id, e.g. on a fork).
- `releasable(block_ids)`: how many of them a `free` would give back (referenced once).

`num_free` counts what `allocate` can hand out: free blocks plus evictable cached ones. A block
referenced by anyone (a running, a waiting-to-resume or a swapped-out sequence) is never
evicted. The pool never calls Python's `hash()` on strings (salted per process): keys are
compared as given, and `chain_keys` hashes with BLAKE2b, so runs are reproducible."""

from __future__ import annotations

import hashlib
import struct
from collections import deque
from collections.abc import Hashable, Iterable, Sequence

import numpy as np

BlockKey = Hashable


def chain_keys(token_ids: Sequence[int], block_size: int, parent: int | None = None) -> list[int]:
    """Keys of the full blocks of `token_ids` (a partial last block gets none): each a 64-bit
    BLAKE2b digest of the previous block's key and this block's token ids, so equal keys mean
    equal prefixes. `parent` continues a chain (the key of the block before token_ids[0])."""
    keys = []
    prev = -1 if parent is None else int(parent)
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[start : start + block_size]
        data = struct.pack(f"<q{block_size}q", prev, *(int(t) for t in block))
        prev = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)
        keys.append(prev)
    return keys


class PrefixCachePool:
    """Block ids with reference counts, a key -> block table and an LRU of cached blocks that
    nobody references. Ids are handed out lowest first while the pool is fresh; a released
    anonymous block is reused first (last released, first reused).

    Per-block state lives in numpy arrays indexed by block id (grown as ids are handed out), so
    a sequence's hundreds of blocks are read and written in one vectorized pass: with a full
    cache every block is allocated, registered, released and evicted, and per-block dict
    lookups scattered over a pool of 10^5 blocks would dominate the simulation's time."""

    def __init__(self, num_blocks: int):
        if num_blocks <= 0:
            raise ValueError(f"need at least one KV block, got {num_blocks}")
        self.num_blocks = int(num_blocks)
        self._next_fresh = 0  # ids >= this were never handed out (a huge pool costs nothing)
        self._free: list[int] = []  # released anonymous blocks, reused last-in first-out
        # references per block id handed out: > 0 held, 0 released anonymous, and -(p + 1) for a
        # cached block nobody references whose release is entry p of the LRU queue (the
        # evictor): an entry whose block no longer carries its -(p + 1) was taken again since
        # and is skipped when evicting
        self._refs = np.zeros(0, dtype=np.int64)
        self._keyed = np.zeros(0, dtype=bool)  # the block holds a key
        self._keys = np.empty(0, dtype=object)  # its key, where _keyed
        self._num_evictable = 0
        self._order = np.zeros(1024, dtype=np.int64)  # releases of cached blocks, oldest first
        self._order_len = 0  # entries in use: _order[_head:_order_len] are still queued
        self._head = 0
        self._base = 0  # queue position of _order[0] (entries before it were dropped)
        self._block_of: dict[BlockKey, int] = {}
        self.evictions = 0

    def _ids(self, block_ids) -> np.ndarray:
        """Block ids as an index array, each checked to have been handed out."""
        ids = np.fromiter(block_ids, dtype=np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= self._next_fresh):
            bad = ids[(ids < 0) | (ids >= self._next_fresh)][0]
            raise ValueError(f"block {bad} is free: it was never handed out")
        return ids

    # ---- counts ----------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks `allocate` can hand out: never used, released anonymous, or evictable."""
        return self.num_blocks - self._next_fresh + len(self._free) + self._num_evictable

    @property
    def num_used(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks holding a key (referenced or evictable)."""
        return len(self._block_of)

    @property
    def num_evictable(self) -> int:
        return self._num_evictable

    def ref_count(self, block_id: int) -> int:
        if not 0 <= block_id < self._next_fresh:
            return 0
        return max(int(self._refs[block_id]), 0)

    def releasable(self, block_ids: Iterable[int]) -> int:
        """How many of `block_ids` one `free` would return to `num_free` (those referenced
        once): what a preemption can count on; a swap-out moves only these blocks, the shared
        ones stay on the device, referenced."""
        return int(np.count_nonzero(self._refs[self._ids(block_ids)] == 1))

    def key_of(self, block_id: int) -> BlockKey | None:
        if not 0 <= block_id < self._next_fresh or not self._keyed[block_id]:
            return None
        return self._keys[block_id]

    def block_of(self, key: BlockKey) -> int | None:
        return self._block_of.get(key)

    # ---- lookups -----------------------------------------------------------------------
    def lookup(self, keys: Iterable[BlockKey]) -> int:
        """Number of leading `keys` with a cached block."""
        n = 0
        table = self._block_of
        for key in keys:
            if key not in table:
                break
            n += 1
        return n

    def holds_any(self, keys: Iterable[BlockKey]) -> bool:
        """Is any of `keys` cached?"""
        return not self._block_of.keys().isdisjoint(keys)

    def take_cached(self, keys: Iterable[BlockKey]) -> list[int]:
        """Block ids of `keys` (all cached: call `lookup` first), each referenced once more."""
        ids = [self._block_of[key] for key in keys]
        self.touch(ids)
        return ids

    # ---- references ------------------------------------------------------------------
    def touch(self, block_ids: Iterable[int]) -> None:
        ids = self._ids(block_ids)
        refs = self._refs
        now = refs[ids]
        if not now.all():
            raise ValueError(f"block {ids[now == 0][0]} is free: only a held or cached block can be touched")
        if len(np.unique(ids)) < len(ids):  # a block twice: one at a time
            for b in ids.tolist():
                self.touch([b])
            return
        # a cached block nobody referenced leaves the evictor with one reference
        self._num_evictable -= int(np.count_nonzero(now < 0))
        refs[ids] = np.maximum(now, 0) + 1
        if self._order_len - self._head > 2 * self._num_evictable + 4096:
            self._compact()

    def _compact(self) -> None:
        """Drop the queue entries of blocks taken again since (keeping the live ones in release
        order) and renumber the live ones."""
        h = self._head
        queue = self._order[h : self._order_len]
        live = queue[self._refs[queue] == -(self._base + h + 1 + np.arange(len(queue)))]
        self._order, self._order_len, self._head, self._base = live, len(live), 0, 0
        self._refs[live] = -np.arange(1, len(live) + 1)

    def _grow(self, upto: int) -> None:
        """Room in the per-block arrays for ids below `upto`."""
        if upto > len(self._refs):
            size = min(self.num_blocks, max(upto, 2 * len(self._refs), 1024))
            self._refs = np.concatenate([self._refs, np.zeros(size - len(self._refs), dtype=np.int64)])
            self._keyed = np.concatenate([self._keyed, np.zeros(size - len(self._keyed), dtype=bool)])
            self._keys = np.concatenate([self._keys, np.empty(size - len(self._keys), dtype=object)])

    def allocate(self, n: int) -> list[int]:
        """`n` blocks, each with one reference; raises when fewer than n are free."""
        if n > self.num_free:
            raise RuntimeError(f"KV block pool overdrawn: need {n}, free {self.num_free}")
        # whole runs at a time: released anonymous blocks (last released first), then never-used
        # ids (lowest first), then evictions (oldest first)
        take = min(n, len(self._free))
        out = self._free[: -take - 1 : -1] if take else []
        if take:
            del self._free[-take:]
        fresh = min(n - take, self.num_blocks - self._next_fresh)
        if fresh:
            out.extend(range(self._next_fresh, self._next_fresh + fresh))
            self._next_fresh += fresh
            self._grow(self._next_fresh)
        if out:
            self._refs[out] = 1
        evict = n - take - fresh
        if evict:
            evicted = self._evict(evict)
            self._refs[evicted] = 1
            out.extend(evicted.tolist())
        return out

    def _evict(self, n: int) -> np.ndarray:
        """The n least recently released cached blocks, their keys forgotten. Whole runs of the
        queue at a time: this is the hot path of a full cache."""
        refs, order = self._refs, self._order
        h, got, count = self._head, [], 0
        while count < n:
            run = order[h : h + n - count]
            live = refs[run] == -(self._base + h + 1 + np.arange(len(run)))
            run = run if live.all() else run[live]
            got.append(run)
            count += len(run)
            h += len(live)
        self._head = h
        self._num_evictable -= n
        ids = np.concatenate(got) if len(got) > 1 else got[0]
        self._keyed[ids] = False
        deque(map(self._block_of.__delitem__, self._keys[ids].tolist()), 0)
        self.evictions += n
        if h > 65536 and 2 * h > self._order_len:
            self._order = order[h : self._order_len].copy()
            self._order_len -= h
            self._base += h
            self._head = 0
        return ids

    def _queue(self, ids: np.ndarray) -> None:
        """Append released cached blocks to the LRU queue."""
        end = self._order_len + len(ids)
        if end > len(self._order):
            self._order = np.concatenate(
                [self._order, np.zeros(max(end, 2 * len(self._order)) - len(self._order), dtype=np.int64)]
            )
        self._order[self._order_len : end] = ids
        self._order_len = end

    def cache(self, block_id: int, key: BlockKey) -> bool:
        """Make the full, referenced block `block_id` findable under `key`; False when the key
        already has a block or this block already has a key (it then stays as it is)."""
        if key in self._block_of or self.key_of(block_id) is not None:
            return False
        if self.ref_count(block_id) <= 0:
            raise ValueError(f"block {block_id} is not held: only a held block can be cached")
        self._block_of[key] = block_id
        self._keys[block_id] = key
        self._keyed[block_id] = True
        return True

    def cache_run(self, block_ids: Sequence[int], keys: Sequence[BlockKey]) -> None:
        """`cache` for each (block, key) pair in order, whole runs at a time when no key and
        no block is cached yet (the common case)."""
        ids = self._ids(block_ids)
        if self._block_of.keys().isdisjoint(keys) and not self._keyed[ids].any():
            if not (self._refs[ids] > 0).all():
                raise ValueError("only held blocks can be cached")
            self._block_of.update(zip(keys, block_ids))
            self._keys[ids] = np.fromiter(keys, dtype=object, count=len(ids))  # tuples stay whole
            self._keyed[ids] = True
            return
        for b, k in zip(block_ids, keys):
            self.cache(b, k)

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference from each block, releasing from the tail of `block_ids`."""
        ids = self._ids(reversed(block_ids))
        refs = self._refs
        now = refs[ids]
        one = now == 1
        released = ids if one.all() else ids[one]
        if len(released) < len(ids):
            shared = ids[now > 1]
            refs[shared] -= 1
        keyed = self._keyed[released]
        cached = released[keyed]
        if len(cached):
            pos = self._base + self._order_len
            refs[cached] = -(pos + 1 + np.arange(len(cached)))
            self._num_evictable += len(cached)
            self._queue(cached)
        if len(cached) < len(released):
            anonymous = released[~keyed]
            refs[anonymous] = 0
            self._free.extend(anonymous.tolist())
