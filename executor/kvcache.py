"""Paged KV cache with real tensors: fixed-size blocks in a device pool and a host pool.

Device pool: for each layer a K and a V tensor of shape [blocks, block_size, kv_heads,
head_dim] (views of one [layers, ...] tensor each). Host pool: the same per layer, in pageable
memory on both devices (every copy to a GPU gathers blocks into a pinned staging buffer first,
so a pinned pool would buy nothing). A pool's accounting has its planned size (gpu_blocks, cpu_blocks: admission, watermark
and preemption see those), its tensors only the blocks a run can touch: the free lists hand
out released ids first and then never-used ids lowest first, so a run touches no more
distinct ids than it held at once (KVCacheConfig.committed_blocks, the workload's bound);
a pool asked for an id past its tensors grows them, doubling, up to the planned size. A sequence owns a block table (device block ids, position
p lives in block table[p // block_size], row p % block_size); a swapped-out sequence owns a
host block table instead. Swap-out and swap-in are real copies of the sequence's blocks: on
CUDA through pinned staging buffers on a side stream, which the compute stream waits for
before the next iteration; on CPU plain index copies.

Block accounting follows simulator/engine/blocks.py (free counts, watermark, overdraw
errors); here the blocks also have identities, kept in free lists."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from infersim.simulator.engine.blocks import BlockCounts

from .kv_memory import allocated_blocks

COMMIT_SLICE_BYTES = 64 << 20  # zero-filled per C call when a pageable pool is committed


@dataclass(frozen=True)
class KVCacheConfig:
    """How a paged KV cache is laid out (vLLM's CacheConfig): its blocks, pools and dtype."""

    gpu_blocks: int = field(metadata={"help": "blocks in the device pool"})
    block_size: int = field(default=16, metadata={"help": "tokens per block"})
    cpu_blocks: int = field(default=0, metadata={"help": "blocks in the host pool (swap space)"})
    watermark: float = field(
        default=0.01, metadata={"help": "share of the device blocks admission keeps free (simulator/engine/blocks.py)"}
    )
    dtype: torch.dtype | None = field(default=None, metadata={"help": "K/V element type; None: the model's dtype"})
    prefix_caching: bool = field(
        default=False, metadata={"help": "share blocks of common prompt prefixes (executor/prefix_kv.py; the Engine)"}
    )
    committed_blocks: int | None = field(
        default=None,
        metadata={
            "help": "blocks of each pool allocated up front (zero-filled in pageable memory): the most the "
            "workload can hold at once; a pool grows past them only if a run needs it; None: every block"
        },
    )

    @classmethod
    def from_serving(
        cls,
        serving,
        gpu_blocks: int,
        cpu_blocks: int,
        dtype: torch.dtype | None = None,
        committed_blocks: int | None = None,
    ):
        """The cache a workload's `serving:` section asks for, with the pools as planned."""
        return cls(
            gpu_blocks,
            serving.block_size,
            cpu_blocks,
            serving.watermark,
            dtype=dtype,
            prefix_caching=serving.prefix_caching,
            committed_blocks=committed_blocks,
        )


class PagedKVCache(BlockCounts):
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        config: KVCacheConfig,
        device: torch.device | str = "cpu",
    ):
        gpu_blocks, cpu_blocks, block_size, dtype = (
            config.gpu_blocks,
            config.cpu_blocks,
            config.block_size,
            config.dtype,
        )
        if gpu_blocks <= 0:
            raise ValueError(f"need at least one device KV block, got {gpu_blocks}")
        if dtype is None:
            raise ValueError("a paged KV cache needs its dtype (KVCacheConfig.dtype)")
        self.device = torch.device(device)
        self.dtype = dtype
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.block_size = int(block_size)
        self.total_gpu, self.total_cpu = int(gpu_blocks), int(cpu_blocks)
        self.watermark_blocks = int(config.watermark * gpu_blocks)
        cuda = self.device.type == "cuda"
        committed = config.committed_blocks
        self._k = self._v = self._hk = self._hv = None
        self._clean = bytearray()
        self._resize_device(allocated_blocks(self.total_gpu, committed))
        self._resize_host(allocated_blocks(self.total_cpu, committed))
        self.stream = torch.cuda.Stream(device=self.device) if cuda else None
        self.copy_calls = 0  # host-link copy calls made by swaps so far (see _copy)
        self._pending = None  # CUDA event the compute stream must wait for
        self._free_gpu = FreeIds(self.total_gpu)
        self._free_cpu = FreeIds(self.total_cpu)
        # Attention reads whole blocks and masks the rows past a sequence's end (and pads
        # ragged batches with block 0); a masked row still enters softmax(scores) @ V with
        # weight 0, and 0 x NaN is NaN. Uninitialised memory may hold NaN bit patterns, so a
        # device block is zeroed the first time it is handed out (block 0 at once); after
        # that it only ever holds finite KV values.
        self._zero([0])

    # ---- storage: the tensors behind the pools, sized to the blocks a run touches ----------
    def _new_pool(self, blocks: int, on_device: bool) -> torch.Tensor:
        """One [layers, blocks, ...] tensor: on the device, or in host memory, committed."""
        shape = (self.num_layers, blocks, self.block_size, self.num_kv_heads, self.head_dim)
        device = self.device if on_device else torch.device("cpu")
        t = torch.empty(shape, dtype=self.dtype, device=device)
        if device.type == "cpu":
            self._commit(t)
        return t

    def _commit(self, pool: torch.Tensor) -> None:
        """Commit (zero-fill) a host pool, as cudaMalloc commits every page up front on a GPU: an uncommitted page is faulted in and zeroed by the kernel when
        a block is first written, which made a swap-out into a fresh host block 2-3x slower than
        into a used one (a 4 KiB block chunk: 13-22 us against 7 us per block). In slices, so
        that a signal (Ctrl-C, SIGTERM) is handled between them: one zero_() of gigabytes is a
        single C call the interpreter cannot interrupt."""
        step = max(1, COMMIT_SLICE_BYTES // max(1, pool[:, :1].nbytes))
        for b in range(0, pool.shape[1], step):
            pool[:, b : b + step].zero_()

    def _resized(self, old: torch.Tensor | None, blocks: int, on_device: bool) -> torch.Tensor:
        new = self._new_pool(blocks, on_device)
        if old is not None and old.shape[1]:
            new[:, : old.shape[1]].copy_(old)
        return new

    def _resize_device(self, blocks: int) -> None:
        self._k = self._resized(self._k, blocks, True)
        self._v = self._resized(self._v, blocks, True)
        self.k = list(self._k.unbind(0))  # per-layer pools
        self.v = list(self._v.unbind(0))
        self._clean.extend(bytes(blocks - len(self._clean)))

    def _resize_host(self, blocks: int) -> None:
        self._hk = self._resized(self._hk, blocks, False)
        self._hv = self._resized(self._hv, blocks, False)

    @property
    def allocated_gpu(self) -> int:
        """Blocks the device pool's tensors hold (at most total_gpu)."""
        return self._k.shape[1]

    @property
    def allocated_cpu(self) -> int:
        return self._hk.shape[1]

    def _reach(self, gpu_ids=(), cpu_ids=()) -> None:
        """Grow the tensors, doubling up to the planned pools, to hold the ids about to be used."""
        need = max(gpu_ids, default=-1) + 1
        if need > self.allocated_gpu:
            self._resize_device(min(self.total_gpu, max(need, 2 * self.allocated_gpu)))
        need = max(cpu_ids, default=-1) + 1
        if need > self.allocated_cpu:
            self._resize_host(min(self.total_cpu, max(need, 2 * self.allocated_cpu)))

    def reset_free_lists(self) -> None:
        """Every block free again, lowest ids first (a profiler reusing one cache)."""
        self._free_gpu = FreeIds(self.total_gpu)
        self._free_cpu = FreeIds(self.total_cpu)

    def mark_clean(self) -> None:
        """Every allocated device block holds finite values already (a profiler filled them)."""
        self._clean = bytearray(b"\x01" * self.allocated_gpu)

    # ---- accounting (the same numbers as simulator/engine/blocks.py; BlockCounts adds used_*) --
    @property
    def free_gpu(self) -> int:
        return len(self._free_gpu)

    @property
    def free_cpu(self) -> int:
        return len(self._free_cpu)

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block over all layers."""
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * self._k.element_size()

    def grow_to(self, seq, tokens: int) -> int:
        """Give `seq` device blocks for `tokens` cached tokens; returns the blocks added."""
        add = self.blocks_for_tokens(tokens) - len(seq.block_table)
        if add <= 0:
            return 0
        if add > len(self._free_gpu):
            raise RuntimeError(f"GPU block pool overdrawn by {seq!r}: need {add}, free {self.free_gpu}")
        new = self._free_gpu.take(add)
        self.ensure_clean(new)
        seq.block_table.extend(new)
        return add

    def ensure_clean(self, blocks) -> None:
        """Zero those of `blocks` never handed out before (see __init__: no NaN bit patterns)."""
        self._reach(gpu_ids=blocks)
        fresh = [b for b in blocks if not self._clean[b]]
        if fresh:
            self._zero(fresh)

    def _zero(self, blocks: list[int]) -> None:
        idx = torch.tensor(blocks, dtype=torch.long, device=self.device)
        self._k[:, idx] = 0
        self._v[:, idx] = 0
        for b in blocks:
            self._clean[b] = True

    def free(self, seq) -> None:
        self._free_gpu.give_back(seq.block_table)
        self._free_cpu.give_back(seq.cpu_block_table)
        seq.block_table = []
        seq.cpu_block_table = []

    # ---- speculation: rollback and tree paths ----------------------------------------------
    def truncate(self, seq, tokens: int) -> int:
        """Keep device blocks for the first `tokens` cached tokens only (rejected speculative
        tokens roll back); the rows past `tokens` in the last kept block are simply overwritten
        later. Returns the blocks released."""
        keep = self.blocks_for_tokens(tokens)
        extra = seq.block_table[keep:]
        if extra:
            self._free_gpu.give_back(extra)
            del seq.block_table[keep:]
        return len(extra)

    def keep_path(self, seq, start: int, path: list[int]) -> None:
        """After verifying a token tree written at cache positions start.. start+q-1, move the
        K/V of the accepted nodes (indices into the tree, in order) to positions start,
        start+1, ... so the cache holds one linear sequence again (Medusa's KV update)."""
        if not path or list(path) == list(range(len(path))):
            return
        src = torch.tensor(self.slots(seq.block_table, start, start + max(path) + 1), device=self.device)
        src = src[torch.tensor(path, device=self.device)]
        dst = torch.tensor(self.slots(seq.block_table, start, start + len(path)), device=self.device)
        for layer in range(self.num_layers):
            for pool in self.flat(layer):
                pool[dst] = pool[src]  # advanced indexing reads src first: overlaps are safe

    # ---- swapping: real copies ---------------------------------------------------------
    def swap_out(self, seqs) -> int:
        """Copy each sequence's device blocks to free host blocks and release the device
        blocks. Returns the number of blocks moved."""
        pairs_g, pairs_c = [], []
        for seq in seqs:
            n = len(seq.block_table)
            if n > len(self._free_cpu):
                raise RuntimeError(f"CPU block pool overdrawn by {seq!r}")
            cpu = self._free_cpu.take(n)
            pairs_g.extend(seq.block_table)
            pairs_c.extend(cpu)
            self._free_gpu.give_back(seq.block_table)
            seq.block_table = []
            seq.cpu_block_table = cpu
        if pairs_g:
            self._copy(pairs_g, pairs_c, to_host=True)
        return len(pairs_g)

    def swap_in(self, seqs) -> int:
        pairs_g, pairs_c = [], []
        for seq in seqs:
            n = len(seq.cpu_block_table)
            if n > len(self._free_gpu):
                raise RuntimeError(f"GPU block pool overdrawn swapping in {seq!r}")
            gpu = self._free_gpu.take(n)
            self._reach(gpu_ids=gpu)
            for b in gpu:
                self._clean[b] = True  # overwritten whole by the copy
            pairs_g.extend(gpu)
            pairs_c.extend(seq.cpu_block_table)
            self._free_cpu.give_back(seq.cpu_block_table)
            seq.cpu_block_table = []
            seq.block_table = gpu
        if pairs_g:
            self._copy(pairs_g, pairs_c, to_host=False)
        return len(pairs_g)

    # ---- host blocks by id, for callers that choose which device blocks move (prefix caching) --
    def take_host(self, n: int) -> list[int]:
        if n > len(self._free_cpu):
            raise RuntimeError(f"CPU block pool overdrawn: need {n}, free {self.free_cpu}")
        return self._free_cpu.take(n)

    def release_host(self, ids) -> None:
        self._free_cpu.give_back(list(ids))

    def copy_blocks(self, gpu_ids: list[int], cpu_ids: list[int], to_host: bool) -> None:
        """Copy device blocks gpu_ids[i] to host blocks cpu_ids[i] (or back, with to_host=False)."""
        if not gpu_ids:
            return
        self._reach(gpu_ids, cpu_ids)
        if not to_host:
            for b in gpu_ids:
                self._clean[b] = True  # overwritten whole by the copy
        self._copy(gpu_ids, cpu_ids, to_host)

    def _copy(self, gpu_ids: list[int], cpu_ids: list[int], to_host: bool) -> None:
        # copy calls made, for whoever times the swaps: on the CPU a call's fixed cost is most of
        # a small block's copy time, and the calls per block depend on how fragmented the free
        # lists are (validation prices each swap with its bytes and its calls)
        self._reach(gpu_ids, cpu_ids)
        if self.stream is None:
            # CPU: one slice copy per run of blocks consecutive on both sides (the free lists
            # hand out neighbouring ids, so runs are long); an index gather + scatter would
            # go through a temporary and take several times the bytes' memcpy time
            for g0, c0, n in contiguous_runs(gpu_ids, cpu_ids):
                self.copy_calls += 2
                for dev, host in ((self._k, self._hk), (self._v, self._hv)):
                    if to_host:
                        host[:, c0 : c0 + n].copy_(dev[:, g0 : g0 + n])
                    else:
                        dev[:, g0 : g0 + n].copy_(host[:, c0 : c0 + n])
            return
        self.copy_calls += 2  # K and V: one staged copy each
        g = torch.tensor(gpu_ids, dtype=torch.long, device=self.device)
        c = torch.tensor(cpu_ids, dtype=torch.long)
        # CUDA: gather into one contiguous staging tensor per direction, one async copy
        # through pinned memory on the side stream, scatter on the far side
        cur = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(cur)  # the blocks were written by earlier iterations
        with torch.cuda.stream(self.stream):
            for dev, host in ((self._k, self._hk), (self._v, self._hv)):
                if to_host:
                    staged = dev[:, g]  # on the side stream
                    pinned = torch.empty(staged.shape, dtype=staged.dtype, pin_memory=True)
                    pinned.copy_(staged, non_blocking=True)
                    torch.cuda.current_stream(self.device).synchronize()
                    host[:, c] = pinned
                else:
                    pinned = host[:, c].pin_memory()
                    staged = pinned.to(self.device, non_blocking=True)
                    dev[:, g] = staged
                    staged.record_stream(cur)
            ev = torch.cuda.Event()
            ev.record(self.stream)
        cur.wait_event(ev)  # the next iteration (or a reuse of freed blocks) waits for the copies

    # ---- addressing ----------------------------------------------------------------------
    def slots(self, block_table: list[int], start: int, stop: int) -> list[int]:
        """Flat slot indices (block * block_size + row) of positions start..stop-1."""
        bs = self.block_size
        return [block_table[p // bs] * bs + p % bs for p in range(start, stop)]

    def flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer pools viewed as [blocks * block_size, kv_heads, head_dim]."""
        k, v = self.k[layer], self.v[layer]
        return (k.view(-1, self.num_kv_heads, self.head_dim), v.view(-1, self.num_kv_heads, self.head_dim))


class FreeIds:
    """A pool's free block ids: the released ones last in first out, then the never-used ones
    lowest first, so the distinct ids a run touches are as many as it held at once. The
    never-used ids are a counter, not a list: a planned pool of millions of blocks (a GPU's
    memory over small blocks) costs nothing until used."""

    def __init__(self, total: int):
        self.total = int(total)
        self._next = 0  # the lowest never-used id
        self._released: list[int] = []

    def __len__(self) -> int:
        return len(self._released) + self.total - self._next

    def take(self, n: int) -> list[int]:
        """n free ids: the last released first, then fresh ones (lowest first)."""
        if n > len(self):
            raise RuntimeError(f"block pool overdrawn: need {n}, free {len(self)}")
        k = min(n, len(self._released))
        out = self._released[: -k - 1 : -1] if k else []
        if k:
            del self._released[-k:]
        fresh = n - k
        out.extend(range(self._next, self._next + fresh))
        self._next += fresh
        return out

    def give_back(self, ids) -> None:
        """Release ids; the first of them is taken again first."""
        self._released.extend(reversed(ids))


def contiguous_runs(a: list[int], b: list[int]):
    """(a0, b0, n) for maximal runs where a and b both step by +1."""
    i = 0
    while i < len(a):
        n = 1
        while i + n < len(a) and a[i + n] == a[i] + n and b[i + n] == b[i] + n:
            n += 1
        yield a[i], b[i], n
        i += n


def runner_cache(runner, config: KVCacheConfig, device: torch.device | str = "cpu") -> PagedKVCache:
    """A paged cache shaped for a model runner's layers and KV heads."""
    return PagedKVCache(runner.num_layers, runner.num_kv_heads, runner.head_dim, config, device)
