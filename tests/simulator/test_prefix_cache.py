"""The prefix-cache block pool (simulator/engine/prefix_cache.py): keys chain over prefixes,
hits are leading runs, references keep blocks, released cached blocks are evicted oldest first
and only when a block is needed."""

import subprocess
import sys

import pytest

from infersim.simulator.engine.prefix_cache import PrefixCachePool, chain_keys


def test_chain_keys_name_the_whole_prefix_and_only_full_blocks():
    a = chain_keys([1, 2, 3, 4, 5, 6, 7], 2)
    b = chain_keys([1, 2, 3, 4, 9, 9], 2)
    c = chain_keys([0, 2, 3, 4], 2)
    assert len(a) == 3 and len(b) == 3  # 7 tokens: 3 full blocks of 2
    assert a[:2] == b[:2] and a[2] != b[2]
    assert c[1] != a[1]  # same tokens in block 1, different prefix
    assert chain_keys([5, 6], 2, parent=a[1]) == [a[2]]  # a chain continues from its parent
    assert chain_keys([1], 2) == []


def test_chain_keys_are_the_same_in_another_process():
    code = "from infersim.simulator.engine.prefix_cache import chain_keys; print(chain_keys(list(range(8)), 4))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(chain_keys(list(range(8)), 4))


def test_fresh_pool_hands_out_lowest_ids_and_counts():
    pool = PrefixCachePool(4)
    assert pool.allocate(3) == [0, 1, 2]
    assert (pool.num_free, pool.num_used, pool.num_cached) == (1, 3, 0)
    with pytest.raises(RuntimeError, match="overdrawn"):
        pool.allocate(2)


def test_lookup_counts_leading_cached_keys_only():
    pool = PrefixCachePool(8)
    ids = pool.allocate(3)
    for b, k in zip(ids, ["k0", "k1", "k2"]):
        pool.cache(b, k)
    assert pool.lookup(["k0", "k1", "k2", "k3"]) == 3
    assert pool.lookup(["k0", "x", "k2"]) == 1
    assert pool.lookup(["x", "k1"]) == 0
    assert pool.lookup([]) == 0


def test_shared_blocks_are_referenced_and_survive_one_release():
    pool = PrefixCachePool(4)
    a = pool.allocate(2)
    pool.cache(a[0], 10)
    pool.cache(a[1], 11)
    b = pool.take_cached([10, 11])
    assert b == a and pool.ref_count(a[0]) == 2
    assert pool.num_used == 2  # sharing costs no block
    c = pool.allocate(1)
    assert pool.releasable(a + c) == 1  # only the unshared block would come back
    pool.free(a)
    assert pool.ref_count(a[0]) == 1 and pool.num_evictable == 0
    pool.free(c)
    pool.free(b)
    assert pool.num_evictable == 2 and pool.num_cached == 2 and pool.num_free == 4


def test_released_cached_blocks_stay_findable_until_a_block_is_needed():
    pool = PrefixCachePool(3)
    a = pool.allocate(2)
    pool.cache(a[0], "p0")
    pool.cache(a[1], "p1")
    pool.free(a)
    assert pool.lookup(["p0", "p1"]) == 2
    # one never-used block is left: it goes first, nothing is evicted
    assert pool.allocate(1) == [2] and pool.evictions == 0 and pool.lookup(["p0", "p1"]) == 2
    # the next allocation evicts the tail block first (released last-to-first: p1 is oldest)
    pool.allocate(1)
    assert pool.evictions == 1 and pool.lookup(["p0", "p1"]) == 1 and pool.block_of("p1") is None


def test_lru_order_follows_release_time_and_touch_removes_from_evictor():
    pool = PrefixCachePool(3)
    x, y, z = pool.allocate(3)
    for b, k in ((x, "x"), (y, "y"), (z, "z")):
        pool.cache(b, k)
    pool.free([x])
    pool.free([y])
    pool.free([z])
    pool.take_cached(["x"])  # x used again: no longer evictable
    got = pool.allocate(1)
    assert got == [y] and pool.block_of("y") is None and pool.block_of("x") == x and pool.block_of("z") == z
    pool.free([x])  # x released after z: z is now the oldest
    assert pool.allocate(1) == [z]


def test_lru_order_survives_the_queue_compactions():
    # 10,000 take/release cycles of one block leave that many stale queue entries: the queue is
    # compacted (renumbering the live entries) and the release order still decides evictions
    pool = PrefixCachePool(4)
    ids = pool.allocate(4)
    for b, k in zip(ids, "abcd"):
        pool.cache(b, k)
    pool.free([ids[1]])
    pool.free([ids[2]])
    pool.free([ids[0]])
    for _ in range(10_000):
        pool.free(pool.take_cached(["d"]) if pool.ref_count(ids[3]) == 0 else [ids[3]])
    assert pool.num_evictable == 4 and pool._order_len - pool._head < 10_000
    assert pool.allocate(4) == [ids[1], ids[2], ids[0], ids[3]] and pool.num_cached == 0


def test_anonymous_blocks_are_reused_before_cached_ones_are_evicted():
    pool = PrefixCachePool(2)
    a, b = pool.allocate(2)
    pool.cache(a, "a")
    pool.free([a, b])
    assert pool.allocate(1) == [b] and pool.evictions == 0 and pool.lookup(["a"]) == 1


def test_a_key_stays_with_its_first_block():
    pool = PrefixCachePool(4)
    a, b = pool.allocate(2)
    assert pool.cache(a, "k") is True
    assert pool.cache(b, "k") is False  # computed twice concurrently: b stays anonymous
    assert pool.cache(a, "other") is False
    pool.free([b])
    assert pool.num_evictable == 0 and pool.key_of(b) is None


def test_misuse_is_refused():
    pool = PrefixCachePool(2)
    with pytest.raises(ValueError):
        PrefixCachePool(0)
    with pytest.raises(ValueError, match="free"):
        pool.touch([0])
    with pytest.raises(ValueError, match="not held"):
        pool.cache(1, "k")


def test_a_huge_pool_costs_nothing_up_front():
    pool = PrefixCachePool(10**12)
    assert pool.num_free == 10**12
    assert pool.allocate(2) == [0, 1]


class _ReferencePool:
    """The pool's rules written plainly (one OrderedDict as the LRU), to check the real one's
    run-at-a-time bookkeeping against."""

    def __init__(self, n):
        from collections import OrderedDict

        self.n, self.fresh, self.free_list, self.lru = n, 0, [], OrderedDict()
        self.refs, self.key_of, self.block_of, self.evictions = {}, {}, {}, 0

    def allocate(self, k):
        out = []
        for _ in range(k):
            if self.free_list:
                b = self.free_list.pop()
            elif self.fresh < self.n:
                b, self.fresh = self.fresh, self.fresh + 1
            else:
                b, _ = self.lru.popitem(last=False)
                del self.block_of[self.key_of.pop(b)]
                self.evictions += 1
            self.refs[b] = 1
            out.append(b)
        return out

    def free(self, ids):
        for b in reversed(ids):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                if b in self.key_of:
                    self.lru[b] = None
                else:
                    self.free_list.append(b)

    def take(self, keys):
        ids = [self.block_of[k] for k in keys]
        for b in ids:
            if self.refs[b] == 0:
                del self.lru[b]
            self.refs[b] += 1
        return ids

    def cache(self, b, k):
        if k not in self.block_of and b not in self.key_of:
            self.block_of[k], self.key_of[b] = b, k

    def lookup(self, keys):
        n = 0
        while n < len(keys) and keys[n] in self.block_of:
            n += 1
        return n


def test_random_operations_match_the_plain_reference():
    """Seeded random sequences sharing prefixes of 12 possible chains: allocations, caching,
    hits and releases give the same ids, hits and evictions as the plain reference, through
    enough churn to compact the release order (over 65,536 evictions) and rebuild it."""
    import random

    rng = random.Random(7)
    pool, ref = PrefixCachePool(64), _ReferencePool(64)
    live = []  # (block ids, keys) per sequence
    for _ in range(40000):
        if live and (rng.random() < 0.5 or pool.num_free < 12):
            ids, _ = live.pop(rng.randrange(len(live)))
            pool.free(ids)
            ref.free(ids)
            continue
        chain = rng.randrange(12)
        keys = [(chain if j < 4 else rng.randrange(10**6)) * 1000 + j for j in range(rng.randrange(1, 12))]
        hit = pool.lookup(keys)
        assert hit == ref.lookup(keys)
        ids = pool.take_cached(keys[:hit])
        assert ids == ref.take(keys[:hit])
        new = pool.allocate(len(keys) - hit)
        assert new == ref.allocate(len(keys) - hit)
        ids = ids + new
        pool.cache_run(ids[hit:], keys[hit:])
        for b, k in zip(ids[hit:], keys[hit:]):
            ref.cache(b, k)
        live.append((ids, keys))
        assert (pool.evictions, pool.num_cached, pool.num_free) == (
            ref.evictions,
            len(ref.block_of),
            64 - sum(1 for r in ref.refs.values() if r),
        )
    assert pool.evictions > 65536 and pool._head < 65536  # the release order was compacted
