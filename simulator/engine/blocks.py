"""vLLM-style paged KV block accounting: GPU and CPU pools of fixed-size blocks. Only counts
are kept: no block identities are needed without prefix sharing, and counts are what
admission, preemption and swapping depend on (with prefix caching, engine/prefix_blocks.py
keeps identities). The admission rule itself (OK / LATER / NEVER with the watermark) is
policy: `SchedulerState.admission`."""

from __future__ import annotations

from ..errors import InfersimError


class BlockCounts:
    """The counts a pair of block pools derives from total_*, free_* and block_size: shared by
    this accounting and the executor's paged cache of real blocks (executor/kvcache.py)."""

    def blocks_for_tokens(self, tokens: int) -> int:
        return -(-int(tokens) // self.block_size)

    @property
    def used_gpu(self) -> int:
        return self.total_gpu - self.free_gpu

    @property
    def used_cpu(self) -> int:
        return self.total_cpu - self.free_cpu


class BlockManager(BlockCounts):
    def __init__(self, gpu_blocks: int, cpu_blocks: int, block_size: int, watermark: float = 0.01):
        if gpu_blocks <= 0:
            raise InfersimError(f"no GPU KV blocks left (gpu_blocks={gpu_blocks}): the model does not fit")
        self.total_gpu, self.total_cpu = int(gpu_blocks), int(cpu_blocks)
        self.free_gpu, self.free_cpu = int(gpu_blocks), int(cpu_blocks)
        self.block_size = int(block_size)
        self.watermark_blocks = int(watermark * gpu_blocks)

    def admit(self, seq, query_tokens: int) -> int:
        """A waiting sequence starts: blocks for all its tokens (decision.KVOps.admit)."""
        self.grow_to(seq, seq.num_tokens)
        return query_tokens

    def releasable(self, seq) -> int:
        """GPU blocks preempting `seq` gives back."""
        return seq.num_gpu_blocks

    def commit_stretch(self, seqs, tokens, new_alloc) -> None:
        """A decode stretch ran: sequence i now holds tokens[i] tokens in new_alloc[i] blocks."""
        added = int(sum(new_alloc) - sum(seq.num_gpu_blocks for seq in seqs))
        if added > self.free_gpu:
            raise RuntimeError("decode stretch overdrew the GPU block pool")
        self.free_gpu -= added
        for seq, n in zip(seqs, new_alloc):
            seq.num_gpu_blocks = int(n)

    @property
    def cached_gpu(self) -> int:
        """GPU blocks holding prefix-cache keys (none without prefix caching)."""
        return 0

    def grow_to(self, seq, tokens: int) -> int:
        """Make room on the GPU for `tokens` cached tokens; returns blocks added."""
        add = self.blocks_for_tokens(tokens) - seq.num_gpu_blocks
        if add <= 0:
            return 0
        if add > self.free_gpu:
            raise RuntimeError(f"GPU block pool overdrawn by {seq!r}: need {add}, free {self.free_gpu}")
        self.free_gpu -= add
        seq.num_gpu_blocks += add
        return add

    def free(self, seq) -> None:
        self.free_gpu += seq.num_gpu_blocks
        self.free_cpu += seq.num_cpu_blocks
        seq.num_gpu_blocks = seq.num_cpu_blocks = 0

    def swap_out(self, seqs) -> int:
        """Move the sequences' GPU blocks to the CPU pool; returns the blocks moved."""
        n = sum(seq.num_gpu_blocks for seq in seqs)
        if n > self.free_cpu:
            raise RuntimeError(f"CPU block pool overdrawn by {list(seqs)!r}")
        self.free_cpu -= n
        self.free_gpu += n
        for seq in seqs:
            seq.num_cpu_blocks, seq.num_gpu_blocks = seq.num_gpu_blocks, 0
        return n

    def swap_in(self, seqs) -> int:
        """Move the sequences' CPU blocks back to the GPU pool; returns the blocks moved."""
        n = sum(seq.num_cpu_blocks for seq in seqs)
        if n > self.free_gpu:
            raise RuntimeError(f"GPU block pool overdrawn swapping in {list(seqs)!r}")
        self.free_gpu -= n
        self.free_cpu += n
        for seq in seqs:
            seq.num_gpu_blocks, seq.num_cpu_blocks = seq.num_cpu_blocks, 0
        return n
