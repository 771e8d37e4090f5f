"""Block accounting with automatic prefix caching (serving.prefix_caching): the GPU pool's
blocks have identities (engine/prefix_cache.py), the host pool is still counted.

- Admission looks the sequence's block keys up: the leading cached blocks are shared (their
  tokens count as computed, so the prefill skips them), at most (tokens - 1) // block_size of
  them, since the last prompt token is always computed again to produce the first output token
  (vLLM does the same). The rest of the prompt gets new blocks.
- A block is registered under its key when the iteration that writes its last token is
  scheduled (vLLM v1 caches blocks at scheduling: the step writes the KV before attention reads
  it, so a request scheduled in the same step may already share it).
- Finishing, aborting or a recompute preemption drops the sequence's references; blocks nobody
  references stay cached until a new block is needed (LRU).
- A swap-out moves to the host only the blocks no other sequence references; shared blocks
  stay on the GPU, referenced by the swapped-out sequence, so they are never evicted while it
  waits. A swap-in takes back, without a copy, those of its moved blocks that are still cached,
  and copies the rest into new blocks.

Counters for the run summary: prompt tokens and blocks looked up and found (every admission,
first admissions separately per request in `seq.cached_tokens`), evictions."""

from __future__ import annotations

import numpy as np

from ..errors import InfersimError
from .blocks import BlockManager
from .prefix_cache import PrefixCachePool


class PrefixCachingBlockManager(BlockManager):
    def __init__(self, gpu_blocks: int, cpu_blocks: int, block_size: int, watermark: float = 0.01):
        if gpu_blocks <= 0:
            raise InfersimError(f"no GPU KV blocks left (gpu_blocks={gpu_blocks}): the model does not fit")
        self.pool = PrefixCachePool(int(gpu_blocks))
        self.total_gpu, self.total_cpu = int(gpu_blocks), int(cpu_blocks)
        self.free_cpu = int(cpu_blocks)
        self.block_size = int(block_size)
        self.watermark_blocks = int(watermark * gpu_blocks)
        self.stats = {"admissions": 0, "hit_tokens": 0, "hit_blocks": 0, "swap_in_cache_hits": 0}

    @property
    def free_gpu(self) -> int:
        return self.pool.num_free

    @property
    def cached_gpu(self) -> int:
        return self.pool.num_cached

    @property
    def evictions(self) -> int:
        return self.pool.evictions

    # ---- admission and growth ------------------------------------------------------------
    def admit(self, seq, query_tokens: int) -> int:
        bs = self.block_size
        keys = seq.block_keys
        hits = 0
        if keys:
            limit = min(len(keys), (seq.num_tokens - 1) // bs)
            hits = self.pool.lookup(keys[:limit])
        seq.block_ids = self.pool.take_cached(keys[:hits]) if hits else []
        seq.num_gpu_blocks = hits
        seq.keys_cached = hits
        seq.computed = hits * bs
        if seq.cached_tokens < 0:
            seq.cached_tokens = hits * bs
        st = self.stats
        st["admissions"] += 1
        st["hit_tokens"] += hits * bs
        st["hit_blocks"] += hits
        self.grow_to(seq, seq.num_tokens, register=False)
        query_tokens = min(query_tokens, seq.num_tokens - seq.computed)
        if seq.block_keys:
            self._register(seq, min(len(seq.block_keys), (seq.computed + query_tokens) // bs))
        return query_tokens

    def grow_to(self, seq, tokens: int, register: bool = True) -> int:
        """Blocks for `tokens` tokens; with `register`, the blocks those tokens fill are cached
        under their keys (the iteration writing them is being scheduled)."""
        if seq.block_ids is None:
            seq.block_ids = []
        add = self.blocks_for_tokens(tokens) - len(seq.block_ids)
        if add > 0:
            if add > self.pool.num_free:
                raise RuntimeError(f"GPU block pool overdrawn by {seq!r}: need {add}, free {self.free_gpu}")
            seq.block_ids.extend(self.pool.allocate(add))
            seq.num_gpu_blocks += add
        if register and seq.block_keys:
            self._register(seq, min(len(seq.block_keys), tokens // self.block_size))
        return max(add, 0)

    def _register(self, seq, upto: int) -> None:
        done = seq.keys_cached
        if upto > done:
            self.pool.cache_run(seq.block_ids[done:upto], seq.block_keys[done:upto])
            seq.keys_cached = upto

    def commit_stretch(self, seqs, tokens, new_alloc) -> None:
        pool = self.pool
        tokens, new_alloc = (
            np.asarray(tokens).tolist(),
            np.asarray(new_alloc).tolist(),
        )  # Python ints: cheaper per sequence
        adds = [n - len(seq.block_ids) for seq, n in zip(seqs, new_alloc)]
        need = sum(a for a in adds if a > 0)
        if need > pool.num_free:
            raise RuntimeError("decode stretch overdrew the GPU block pool")
        # the sequences with keys still to register: the only ones the stretch can cache blocks of
        pending = [(seq, t) for seq, t in zip(seqs, tokens) if seq.block_keys and seq.keys_cached < len(seq.block_keys)]
        if need > pool.num_free - pool.num_evictable and self._order_matters(pending):
            # the stretch evicts and fills blocks whose keys are cached already (or twice):
            # whether a key is still held when its block fills depends on when each block was
            # taken, so replay the steps that take or fill a block in the order stepping one by
            # one does (step by step, batch order within a step)
            for _, i, t in self._block_steps(seqs, tokens):
                self.grow_to(seqs[i], t)
        elif need:
            # one allocation for the whole stretch, handed out in batch order: the same blocks
            # as one allocation per sequence
            ids, at = pool.allocate(need), 0
            for seq, a in zip(seqs, adds):
                if a > 0:
                    seq.block_ids.extend(ids[at : at + a])
                    seq.num_gpu_blocks += a
                    at += a
        # every sequence has its blocks now (allocated above for the last token of the
        # stretch); those the stretch filled get registered
        for seq, t in pending:
            self.grow_to(seq, t)

    def _order_matters(self, pending) -> bool:
        """Could the order of a stretch's allocations and registrations change what gets
        cached? Only if a key it registers is cached already or registered twice: else every
        registration succeeds and the evictions take the same oldest blocks in any order."""
        bs = self.block_size
        keys = [k for seq, t in pending for k in seq.block_keys[seq.keys_cached : min(len(seq.block_keys), t // bs)]]
        return bool(keys) and (self.pool.holds_any(keys) or len(set(keys)) < len(keys))

    def _block_steps(self, seqs, tokens) -> list[tuple[int, int, int]]:
        """(step, sequence index, tokens after the step) of every decode step in a stretch that
        starts a block (t % bs == 1) or fills one (t % bs == 0), in stepping order."""
        bs = self.block_size
        out = []
        for i, (seq, end) in enumerate(zip(seqs, tokens)):
            start = seq.computed
            for first in (1, 0) if bs > 1 else (0,):
                t0 = start + 1 + (first - (start + 1)) % bs  # first t > start with t % bs == first
                out.extend((t - start - 1, i, t) for t in range(t0, int(end) + 1, bs))
        out.sort()
        return out

    # ---- release -----------------------------------------------------------------------------
    def releasable(self, seq) -> int:
        if not seq.block_ids:
            return 0
        return self.pool.releasable(b for b in seq.block_ids if b is not None)

    def free(self, seq) -> None:
        if seq.block_ids:
            ids = seq.block_ids  # positions moved to the host (None) hold no GPU block
            self.pool.free(ids if not seq.num_cpu_blocks else [b for b in ids if b is not None])
        self.free_cpu += seq.num_cpu_blocks
        seq.block_ids = None
        seq.num_gpu_blocks = seq.num_cpu_blocks = 0
        seq.keys_cached = 0

    # ---- swapping ------------------------------------------------------------------------------
    def swap_out(self, seqs) -> int:
        moved = 0
        refs = self.pool.ref_count
        for seq in seqs:
            ids = seq.block_ids or []
            out = [j for j, b in enumerate(ids) if b is not None and refs(b) == 1]
            if len(out) > self.free_cpu:
                raise RuntimeError(f"CPU block pool overdrawn by {seq!r}")
            self.pool.free([ids[j] for j in out])
            for j in out:
                ids[j] = None
            self.free_cpu -= len(out)
            seq.num_cpu_blocks += len(out)
            seq.num_gpu_blocks -= len(out)
            moved += len(out)
        return moved

    def swap_in(self, seqs) -> int:
        copied = 0
        pool, keys_of = self.pool, None
        for seq in seqs:
            ids, keys_of = seq.block_ids, seq.block_keys or []
            gone = [j for j, b in enumerate(ids) if b is None]
            # a moved block still cached on the GPU (a full block registered under its key)
            # comes back without a copy
            kept = [j for j in gone if j < seq.keys_cached and pool.block_of(keys_of[j]) is not None]
            if len(gone) - len(kept) > pool.num_free:
                raise RuntimeError(f"GPU block pool overdrawn swapping in {seq!r}")
            for j in kept:
                ids[j] = pool.take_cached([keys_of[j]])[0]
            copy = [j for j in gone if ids[j] is None]
            for j, b in zip(copy, pool.allocate(len(copy))):
                ids[j] = b
                if j < seq.keys_cached:
                    pool.cache(b, keys_of[j])
            self.free_cpu += len(gone)
            seq.num_cpu_blocks -= len(gone)
            seq.num_gpu_blocks += len(gone)
            self.stats["swap_in_cache_hits"] += len(kept)
            copied += len(copy)
        return copied

    def report(self) -> dict:
        return {**self.stats, "evictions": self.pool.evictions, "cached_blocks_at_end": self.pool.num_cached}


def block_manager(prefix_caching: bool, gpu_blocks: int, cpu_blocks: int, block_size: int, watermark: float):
    """The block accounting a replica uses: counts only, or identities with prefix caching."""
    cls = PrefixCachingBlockManager if prefix_caching else BlockManager
    return cls(gpu_blocks, cpu_blocks, block_size, watermark)


def prefix_cache_counters(managers) -> dict:
    """The prefix-cache counters of a run's replicas, summed (engines without caching add none)."""
    out: dict = {}
    for m in managers:
        for k, v in (m.report() if isinstance(m, PrefixCachingBlockManager) else {}).items():
            out[k] = out.get(k, 0) + v
    return out
