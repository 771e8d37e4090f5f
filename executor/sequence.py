"""A request inside the real engine (executor/engine.py): the attributes a policy reads, its
token ids and its block tables; with prefix caching, the block ids and keys the accounting
keeps (executor/prefix_kv.py)."""

from __future__ import annotations

from infersim.simulator.engine.prefix_cache import chain_keys


class ExecSequence:
    """A request inside the executor: the attributes a policy reads (rid, arrival_s,
    first_enqueue_s, prompt_len, generated, computed, num_tokens, num_gpu_blocks,
    num_cpu_blocks) plus its tokens and block tables."""

    def __init__(self, rid: int, prompt_ids, output_len: int, arrival_s: float, client: int = -1):
        self.rid = rid
        self.tokens: list[int] = [int(t) for t in prompt_ids]
        self.prompt_len = len(self.tokens)
        self.output_len = int(output_len)
        self.arrival_s = float(arrival_s)
        self.first_enqueue_s = float(arrival_s)
        self.generated = 0
        self.computed = 0
        self.block_table: list[int] = []
        self.cpu_block_table: list[int] = []
        self.replica = 0
        self.client = client
        self.last_token_s = float(arrival_s)
        self.first_scheduled_s = -1.0
        self.first_token_s = -1.0
        self.finish_s = -1.0
        self.aborted = False

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.generated

    @property
    def num_gpu_blocks(self) -> int:
        return len(self.block_table)

    @property
    def num_cpu_blocks(self) -> int:
        return len(self.cpu_block_table)

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    def __repr__(self) -> str:
        return (
            f"ExecSequence(rid={self.rid}, prompt={self.prompt_len}, gen={self.generated}/{self.output_len}, "
            f"computed={self.computed}, gpu_blocks={self.num_gpu_blocks}, cpu_blocks={self.num_cpu_blocks})"
        )


class CachedSequence(ExecSequence):
    """An ExecSequence whose blocks the prefix-caching accounting keeps: block ids by position
    (`block_ids`, None where the block is on the host), host block ids of moved positions
    (`host_blocks`), and the keys of its full blocks (`block_keys`)."""

    # plain attributes here (ExecSequence derives them from its own tables): the accounting sets them
    num_gpu_blocks = 0
    num_cpu_blocks = 0

    def __init__(self, *args, **kwargs):
        self.block_ids: list | None = []
        super().__init__(*args, **kwargs)
        self.block_keys: list = []
        self.keys_cached = 0
        self.cached_tokens = -1  # prompt tokens found cached at the first admission (-1: not admitted)
        self.host_blocks: dict[int, int] = {}

    @property
    def block_table(self) -> list[int]:
        return self.block_ids or []

    @block_table.setter
    def block_table(self, ids) -> None:
        self.block_ids = list(ids)

    def extend_keys(self, block_size: int, tokens: int) -> None:
        """Keys for the full blocks of the first `tokens` tokens (all known by then)."""
        n = min(int(tokens), len(self.tokens)) // block_size
        have = len(self.block_keys)
        if n > have:
            parent = self.block_keys[-1] if have else None
            self.block_keys.extend(chain_keys(self.tokens[have * block_size : n * block_size], block_size, parent))
