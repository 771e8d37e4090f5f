"""The `offload:` section of a workload file."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class OffloadSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str = "full"  # gpu | full | h2o | int4 | infinigen
