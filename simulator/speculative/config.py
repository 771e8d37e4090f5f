"""The `speculation:` section of a workload file."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SpeculationSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    method: str = "draft"  # draft | minions | medusa
