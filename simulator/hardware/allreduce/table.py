"""The measured latency of vLLM's custom all-reduce (`hwprofiles/_custom_all_reduce.yaml`): per
card, GPU count and message size, with where every number was measured and which profiles carry
another card's numbers.

A message between two measured sizes takes the time interpolated linearly in bytes (the kernel's
time is a fixed cost plus bytes over a bandwidth on each stretch); below the smallest measured
size, the smallest one's time (the latency floor); above the largest, the last stretch's slope
continued up to the kernel's size limit. A GPU count the card did not measure, between two it
did, interpolates linearly in log2(GPUs), as the NCCL fits do (hardware/collectives.py)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal, Optional

import numpy as np
from pydantic import BaseModel, Field, PositiveFloat, PositiveInt, model_validator

from ...paths import hwprofiles_dir
from ...validation import STRICT_CONFIG
from ...yamlio import load_model_file
from ..collectives import log2_interpolated

TABLE_FILE = "_custom_all_reduce.yaml"


class CardTimes(BaseModel):
    """One card's measured all-reduce times and the profiles they price."""

    model_config = STRICT_CONFIG
    measured_on: str = Field(description="the GPUs, node and engine version the times were measured on")
    confidence: Literal["measured"] = "measured"
    fully_connected: bool = Field(
        description="every GPU of the node reaches every other over NVLink (NVSwitch): the kernel runs at "
        "any supported GPU count; false: PCIe or NVLink pairs, where vLLM runs it at 2 GPUs only"
    )
    profiles: list[str] = Field(min_length=1, description="hardware profiles measured on this card")
    carried_to: dict[str, str] = Field(
        {}, description="profiles that use this card's times though not measured on them, each with why (less certain)"
    )
    notes: str = ""
    symm_mem_from_bytes: dict[int, PositiveInt] = Field(
        {},
        description="GPU count -> message bytes from which the engine ran its symmetric-memory all-reduce "
        "instead of the custom kernel when measured (those rows time what it runs there)",
    )
    workers: dict[int, list[tuple[PositiveInt, PositiveFloat]]] = Field(
        description="GPU count -> [message bytes, time in microseconds], bytes increasing"
    )

    @model_validator(mode="after")
    def _check(self):
        if not self.workers:
            raise ValueError("workers: give at least one GPU count")
        for count, points in self.workers.items():
            if count < 2:
                raise ValueError(f"workers.{count}: an all-reduce runs over at least 2 GPUs")
            if not points:
                raise ValueError(f"workers.{count}: no measured sizes")
            sizes = [b for b, _ in points]
            if any(a >= b for a, b in zip(sizes, sizes[1:])):
                raise ValueError(f"workers.{count}: message bytes must increase")
        return self

    def label(self, profile: str) -> str:
        """How certain this card's times are for `profile`."""
        if profile in self.carried_to:
            return f"carried from {self.measured_on} ({self.carried_to[profile]}; less certain)"
        return f"measured on {self.measured_on}"

    def time_s(self, nbytes, workers: int) -> np.ndarray:
        """Time of one all-reduce of `nbytes` (array) over `workers` GPUs, seconds."""
        if workers in self.workers:
            return _interpolate(self.workers[workers], nbytes)
        below = max((w for w in self.workers if w < workers), default=None)
        above = min((w for w in self.workers if w > workers), default=None)
        if below is None or above is None:
            raise KeyError(workers)
        return log2_interpolated(
            workers, below, above, _interpolate(self.workers[below], nbytes), _interpolate(self.workers[above], nbytes)
        )

    def prices(self, workers: int) -> bool:
        """Whether the card measured `workers` GPUs or two counts around it."""
        return workers in self.workers or (
            any(w < workers for w in self.workers) and any(w > workers for w in self.workers)
        )


def _interpolate(points: list[tuple[int, float]], nbytes) -> np.ndarray:
    sizes = np.array([b for b, _ in points], dtype=np.float64)
    times = np.array([t for _, t in points], dtype=np.float64) * 1e-6
    x = np.asarray(nbytes, dtype=np.float64)
    inside = np.interp(x, sizes, times)
    if sizes.size < 2:
        return inside
    slope = (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
    return np.where(x > sizes[-1], times[-1] + slope * (x - sizes[-1]), inside)


class CustomAllReduceTable(BaseModel):
    """The whole file: the kernel's limits and every measured card."""

    model_config = STRICT_CONFIG
    name: str
    max_bytes: PositiveInt = Field(description="the kernel takes messages below this many bytes; NCCL the rest")
    world_sizes: list[PositiveInt] = Field(min_length=1, description="GPU counts the kernel runs at")
    source: str = Field(description="where the measurements come from, with licence")
    cards: dict[str, CardTimes] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self):
        seen: dict[str, str] = {}
        for name, card in self.cards.items():
            unsupported = sorted(set(card.workers) - set(self.world_sizes))
            if unsupported:
                raise ValueError(
                    f"cards.{name}.workers: {unsupported} GPUs is not a world size of the kernel {self.world_sizes}"
                )
            for profile in [*card.profiles, *card.carried_to]:
                if profile in seen:
                    raise ValueError(f"cards.{name}: profile '{profile}' is already priced by card '{seen[profile]}'")
                seen[profile] = name
        return self

    def card_for(self, profile: str) -> Optional[CardTimes]:
        """The card whose times price `profile` (measured on it or carried to it), or None."""
        for card in self.cards.values():
            if profile in card.profiles or profile in card.carried_to:
                return card
        return None


def load_table(path: str | Path) -> CustomAllReduceTable:
    return load_model_file(CustomAllReduceTable, path)


@functools.lru_cache(maxsize=1)
def shipped_table() -> CustomAllReduceTable:
    """The table shipped beside the hardware profiles."""
    return load_table(hwprofiles_dir() / TABLE_FILE)
