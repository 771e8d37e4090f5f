"""Automatic prefix caching: a pool of KV block ids whose full blocks are found again by the
identity of their tokens, after vLLM v1's `BlockPool` (vllm/v1/core/block_pool.py,
https://docs.vllm.ai/en/latest/design/prefix_caching.html). Pure Python: the simulator's block
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
from itertools import compress, repeat
from operator import add, eq, not_

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
    anonymous block is reused first (last released, first reused)."""

    def __init__(self, num_blocks: int):
        if num_blocks <= 0:
            raise ValueError(f"need at least one KV block, got {num_blocks}")
        self.num_blocks = int(num_blocks)
        self._next_fresh = 0  # ids >= this were never handed out (a huge pool costs nothing)
        self._free: list[int] = []  # released anonymous blocks, reused last-in first-out
        # block id -> references, for ids handed out: > 0 held, 0 released anonymous, and -s
        # for a cached block nobody references, released by the s-th `free` call (the LRU
        # evictor: one table serves both, so a release or an eviction costs one lookup less).
        # The releases of cached blocks in order, each with -s: an entry whose -s no longer
        # matches the block's count (it was taken again since) is skipped when evicting.
        self._refs: dict[int, int] = {}
        self._num_evictable = 0
        self._order_blocks: list[int] = []  # releases of cached blocks, oldest first from _head
        self._order_stamps: list[int] = []
        self._head = 0
        self._releases = 0
        self._key_of: dict[int, BlockKey] = {}
        self._block_of: dict[BlockKey, int] = {}
        self.evictions = 0

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
        return max(self._refs.get(block_id, 0), 0)

    def releasable(self, block_ids: Iterable[int]) -> int:
        """How many of `block_ids` one `free` would return to `num_free` (those referenced
        once): what a preemption can count on; a swap-out moves only these blocks, the shared
        ones stay on the device, referenced."""
        refs = self._refs
        return sum(1 for b in block_ids if refs.get(b, 0) == 1)

    def key_of(self, block_id: int) -> BlockKey | None:
        return self._key_of.get(block_id)

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
        refs = self._refs
        ids = list(block_ids)
        now = list(map(refs.get, ids, repeat(0)))
        if 0 in now:
            b = ids[now.index(0)]
            raise ValueError(f"block {b} is free: only a held or cached block can be touched")
        if len(dict.fromkeys(ids)) < len(ids):  # a block twice: one at a time
            for b in ids:
                self.touch([b])
            return
        # a cached block nobody referenced (-s) leaves the evictor with one reference
        self._num_evictable -= sum(map((0).__gt__, now))
        refs.update(zip(ids, map(add, map(max, now, repeat(0)), repeat(1))))
        if len(self._order_blocks) - self._head > 2 * self._num_evictable + 4096:
            # mostly entries of blocks taken again: keep the live ones, in release order
            h = self._head
            live = [(b, s) for b, s in zip(self._order_blocks[h:], self._order_stamps[h:]) if refs[b] == s]
            self._order_blocks, self._order_stamps = [b for b, _ in live], [s for _, s in live]
            self._head = 0

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
        evict = n - take - fresh
        if evict:
            out.extend(self._evict(evict))
        self._refs.update(dict.fromkeys(out, 1))
        return out

    def _evict(self, n: int) -> list[int]:
        """The n least recently released cached blocks, their keys forgotten. Whole runs of the
        release order at a time (C-level loops): this is the hot path of a full cache."""
        refs, blocks, stamps = self._refs, self._order_blocks, self._order_stamps
        h, got = self._head, []
        while len(got) < n:
            k = n - len(got)
            run, run_stamps = blocks[h : h + k], stamps[h : h + k]
            now = list(map(refs.get, run))
            if now == run_stamps:  # no entry taken again since: the whole run
                got.extend(run)
            else:
                got.extend(compress(run, map(eq, now, run_stamps)))
            h += k
        self._head = h
        self._num_evictable -= n
        deque(map(self._block_of.__delitem__, map(self._key_of.pop, got)), 0)
        self.evictions += n
        if h > 65536 and 2 * h > len(blocks):
            del blocks[:h], stamps[:h]
            self._head = 0
        return got

    def cache(self, block_id: int, key: BlockKey) -> bool:
        """Make the full, referenced block `block_id` findable under `key`; False when the key
        already has a block or this block already has a key (it then stays as it is)."""
        if key in self._block_of or block_id in self._key_of:
            return False
        if self._refs.get(block_id, 0) <= 0:
            raise ValueError(f"block {block_id} is not held: only a held block can be cached")
        self._block_of[key] = block_id
        self._key_of[block_id] = key
        return True

    def cache_run(self, block_ids: Sequence[int], keys: Sequence[BlockKey]) -> None:
        """`cache` for each (block, key) pair in order, whole runs at a time when no key and
        no block is cached yet (the common case)."""
        if self._block_of.keys().isdisjoint(keys) and self._key_of.keys().isdisjoint(block_ids):
            refs = self._refs
            if not all(map(refs.get, block_ids)):  # a missing or zero count: not held
                raise ValueError("only held blocks can be cached")
            self._block_of.update(zip(keys, block_ids))
            self._key_of.update(zip(block_ids, keys))
            return
        for b, k in zip(block_ids, keys):
            self.cache(b, k)

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference from each block, releasing from the tail of `block_ids`."""
        refs = self._refs
        rev = list(reversed(block_ids))
        counts = list(map(refs.__getitem__, rev))
        if counts.count(1) == len(rev):  # nobody else holds any of them (the common case)
            released = rev
        else:
            released = list(compress(rev, map((1).__eq__, counts)))
            for b in block_ids:
                if refs[b] > 1:
                    refs[b] -= 1
        has_key = list(map(self._key_of.__contains__, released))
        n_cached = has_key.count(True)
        if n_cached:
            self._releases += 1
            stamp = -self._releases
            cached = released if n_cached == len(released) else list(compress(released, has_key))
            refs.update(dict.fromkeys(cached, stamp))
            self._num_evictable += n_cached
            self._order_blocks.extend(cached)
            self._order_stamps.extend(repeat(stamp, n_cached))
        if n_cached < len(released):
            anonymous = list(compress(released, map(not_, has_key))) if n_cached else released
            refs.update(dict.fromkeys(anonymous, 0))
            self._free.extend(anonymous)
