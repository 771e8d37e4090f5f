"""The engine's input: one row per request, as parallel numpy arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Requests:
    """Request i has prompt_tokens[i] prompt tokens, asks for output_tokens[i] output tokens and
    arrives at arrival_s[i] seconds (sorted ascending, from >= 0).

    Closed loop: arrival_s is None; `closed_loop_clients` clients each send the next request
    in order `think_time_s` after their previous one completes. `duration_s`, when set, is the
    time after which no further request is admitted (open or closed loop)."""

    prompt_tokens: np.ndarray  # int64, >= 1
    output_tokens: np.ndarray  # int64, >= 1
    arrival_s: np.ndarray | None  # float64, sorted ascending, >= 0; None for closed loop
    closed_loop_clients: int = 0
    think_time_s: float = 0.0
    duration_s: float | None = None
    # token identity for prefix caching (workload/prefixes.py): keys(i, tokens, block_size) -> the
    # keys of request i's full blocks; None: every request's tokens are its own
    prefix: object | None = None

    def __post_init__(self):
        self.prompt_tokens = np.ascontiguousarray(self.prompt_tokens, dtype=np.int64)
        self.output_tokens = np.ascontiguousarray(self.output_tokens, dtype=np.int64)
        n = len(self.prompt_tokens)
        if len(self.output_tokens) != n:
            raise ValueError("prompt_tokens and output_tokens differ in length")
        if n and (self.prompt_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ValueError("token counts must be >= 1")
        if self.arrival_s is None:
            if self.closed_loop_clients < 1:
                raise ValueError("a closed-loop workload (arrival_s None) needs closed_loop_clients >= 1")
        else:
            self.arrival_s = np.ascontiguousarray(self.arrival_s, dtype=np.float64)
            if len(self.arrival_s) != n:
                raise ValueError("arrival_s differs in length from the token arrays")
            if n and (self.arrival_s[0] < 0 or np.any(np.diff(self.arrival_s) < 0)):
                raise ValueError("arrival_s must be sorted ascending and start at >= 0")

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    @property
    def closed_loop(self) -> bool:
        return self.arrival_s is None
