"""A request under speculative decoding and each model's view of it.

The committed tokens (prompt + accepted output) live on the `SpecSequence`, which is also the
target model's cache view: `tokens`, `computed` (tokens whose K/V the target holds) and
`block_table` are what `executor.runner.plan_batch` reads. Between rounds the target has
cached every committed token but the last one (the token the last verification produced,
whose K/V comes with the next verification). Each draft model has its own `Track` (its own
tokens, cached count and blocks in its own cache): a draft's cache may hold tokens it drafted
that the target rejected; it rolls them back itself before drafting again (`Track.base`)."""

from __future__ import annotations


class Track:
    """One model's cache view of a sequence (the attributes plan_batch reads)."""

    __slots__ = ("tokens", "computed", "block_table", "cpu_block_table", "base")

    def __init__(self):
        self.tokens: list[int] = []
        self.computed = 0
        self.block_table: list[int] = []
        self.cpu_block_table: list[int] = []
        # tokens[:base] were committed when the track last drafted; past it, its own drafts
        self.base = 0

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


class SpecSequence:
    """A request: prompt + output so far (committed), the target's cache view, one Track per draft."""

    def __init__(self, rid: int, prompt_ids, output_len: int, n_drafts: int = 1, arrival_s: float = 0.0):
        if output_len < 1:
            raise ValueError(f"request {rid}: output_len must be >= 1, got {output_len}")
        self.rid = int(rid)
        self.tokens: list[int] = [int(t) for t in prompt_ids]
        self.prompt_len = len(self.tokens)
        self.output_len = int(output_len)
        self.arrival_s = float(arrival_s)
        self.computed = 0
        self.block_table: list[int] = []
        self.cpu_block_table: list[int] = []
        self.drafts = [Track() for _ in range(n_drafts)]
        self.rounds = 0
        # timestamps on the engine clock (the speculative engine fills them in)
        self.first_enqueue_s = float(arrival_s)
        self.first_scheduled_s = -1.0
        self.first_token_s = -1.0
        self.last_token_s = float(arrival_s)
        self.finish_s = -1.0
        self.aborted = False
        self.replica = 0
        self.client = -1

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def remaining(self) -> int:
        return self.output_len - self.generated

    @property
    def done(self) -> bool:
        return self.generated >= self.output_len

    @property
    def prefilled(self) -> bool:
        return self.generated > 0

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    def __repr__(self) -> str:
        return f"SpecSequence(rid={self.rid}, prompt={self.prompt_len}, gen={self.generated}/{self.output_len})"
