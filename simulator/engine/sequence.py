"""A request inside the engine. Policies read it (see policies/state.py); only the engine
writes it."""

from __future__ import annotations


class Sequence:
    __slots__ = (
        "rid",
        "prompt_len",
        "output_len",
        "arrival_s",
        "first_enqueue_s",
        "generated",
        "computed",
        "num_gpu_blocks",
        "num_cpu_blocks",
        "replica",
        "last_token_s",
        "first_scheduled_s",
        "first_token_s",
        "client",
        "block_keys",
        "block_ids",
        "keys_cached",
        "cached_tokens",
    )

    def __init__(self, rid: int, prompt_len: int, output_len: int, arrival_s: float, client: int = -1):
        self.rid = rid
        self.prompt_len = int(prompt_len)
        self.output_len = int(output_len)
        self.arrival_s = arrival_s
        self.first_enqueue_s = arrival_s
        self.generated = 0
        self.computed = 0  # tokens whose KV is in the cache
        self.num_gpu_blocks = 0
        self.num_cpu_blocks = 0
        self.replica = -1
        self.last_token_s = arrival_s
        self.first_scheduled_s = -1.0
        self.first_token_s = -1.0
        self.client = client
        # prefix caching (engine/prefix_blocks.py): keys of the full blocks of the token stream
        # (None: tokens of its own), GPU block ids by position (None: the block is on the host),
        # how many leading blocks are registered in the cache, prompt tokens found cached at
        # the first admission (-1: not admitted yet)
        self.block_keys = None
        self.block_ids = None
        self.keys_cached = 0
        self.cached_tokens = -1

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.generated

    @property
    def remaining_output(self) -> int:
        return self.output_len - self.generated

    def __repr__(self) -> str:
        return (
            f"Sequence(rid={self.rid}, prompt={self.prompt_len}, gen={self.generated}/{self.output_len}, "
            f"computed={self.computed}, gpu_blocks={self.num_gpu_blocks}, cpu_blocks={self.num_cpu_blocks})"
        )


def emit_token(seq, now: float, itl: list) -> bool:
    """`seq` produced its next token at `now`: the first sets its TTFT, later ones add an
    inter-token gap to `itl`. Returns True when the sequence has all its output tokens.
    Shared by the simulator's engines and the real executor so both count alike."""
    seq.generated += 1
    if seq.first_token_s < 0:
        seq.first_token_s = now
    else:
        itl.append(now - seq.last_token_s)
    seq.last_token_s = now
    return seq.generated >= seq.output_len


def without(queue: list, seqs) -> list:
    """`queue` less `seqs` (by identity), order kept; cheap when `seqs` is the queue's head,
    as FCFS admissions are."""
    n = len(seqs)
    if n <= len(queue) and all(a is b for a, b in zip(queue, seqs)):
        return queue[n:]
    gone = {id(s) for s in seqs}
    return [s for s in queue if id(s) not in gone]
