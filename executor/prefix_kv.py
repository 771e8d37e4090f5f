"""Automatic prefix caching on the real paged KV cache (serving.prefix_caching).

The block accounting is the simulator's own (`PrefixCachingBlockManager`,
simulator/engine/prefix_blocks.py, on the block pool of simulator/engine/prefix_cache.py): the
pool's block ids are the device block indices of the `PagedKVCache` tensors, so a shared block
is one physical block every sharing sequence's block table points at. This class adds only what
a real cache needs on top of the accounting:

- **keys from real token ids**: a sequence's block keys are `chain_keys` over its tokens (the
  prompt, then each generated token as it is sampled), extended before every lookup and every
  registration, so two requests share a block exactly when their tokens up to its end are equal;
- **the copies**: a swap-out copies to host blocks exactly the blocks the accounting moves (those
  no other sequence references; shared blocks stay on the device, referenced by the swapped-out
  sequence, so they are neither copied from under another sequence nor evicted while it waits);
  a swap-in copies back only the blocks the accounting could not take again from the cache;
- **clean memory**: a block handed out for the first time is zeroed (PagedKVCache.ensure_clean).

The prefill of an admitted sequence then starts at `seq.computed` (the cached blocks' tokens):
attention reads the cached blocks' K/V and computes only the rest (executor/runner.py)."""

from __future__ import annotations

from infersim.simulator.engine.prefix_blocks import PrefixCachingBlockManager


class PrefixCachedKV(PrefixCachingBlockManager):
    """The simulator's prefix-caching accounting over a PagedKVCache's device blocks, carrying
    out its moves as real copies (the engine's KVOps)."""

    def __init__(self, cache, watermark: float = 0.01):
        super().__init__(cache.total_gpu, cache.total_cpu, cache.block_size, watermark)
        self.cache = cache

    @property
    def copy_calls(self) -> int:
        return self.cache.copy_calls

    @property
    def bytes_per_block(self) -> int:
        return self.cache.bytes_per_block

    # ---- admission and growth ------------------------------------------------------------
    def admit(self, seq, query_tokens: int) -> int:
        seq.extend_keys(self.block_size, seq.num_tokens)
        left = super().admit(seq, query_tokens)
        self.cache.ensure_clean(seq.block_ids)
        return left

    def grow_to(self, seq, tokens: int, register: bool = True) -> int:
        seq.extend_keys(self.block_size, tokens)
        had = len(seq.block_ids or [])
        add = super().grow_to(seq, tokens, register)
        if add:
            self.cache.ensure_clean(seq.block_ids[had:])
        return add

    def free(self, seq) -> None:
        self.cache.release_host(seq.host_blocks.values())
        seq.host_blocks.clear()
        super().free(seq)

    # ---- swapping: the accounting decides which blocks move, the cache copies them -------------
    def swap_out(self, seqs) -> int:
        gpu, host = [], []
        for seq in seqs:
            before = list(seq.block_ids or [])
            super().swap_out([seq])
            moved = [j for j, (b, a) in enumerate(zip(before, seq.block_ids)) if b is not None and a is None]
            ids = self.cache.take_host(len(moved))
            seq.host_blocks.update(zip(moved, ids))
            gpu.extend(before[j] for j in moved)
            host.extend(ids)
        # the released device blocks are not handed out before this copy reads them
        self.cache.copy_blocks(gpu, host, to_host=True)
        return len(gpu)

    def swap_in(self, seqs) -> int:
        gpu, host, released = [], [], []
        for seq in seqs:
            gone = [j for j, b in enumerate(seq.block_ids) if b is None]
            # what the accounting takes back without a copy: a registered block still cached
            cached = {j: self.pool.block_of(seq.block_keys[j]) for j in gone if j < seq.keys_cached}
            super().swap_in([seq])
            for j in gone:
                h = seq.host_blocks.pop(j)
                released.append(h)
                if seq.block_ids[j] != cached.get(j):
                    gpu.append(seq.block_ids[j])
                    host.append(h)
        self.cache.copy_blocks(gpu, host, to_host=False)
        self.cache.release_host(released)
        return len(gpu)
