"""The plan file's `disaggregation:` section (analysis/goodput.py compares the deployments it
describes); apart so that the plan file's schema does not import the comparison."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, Field, PositiveInt, field_validator

from infersim.simulator.disaggregation.config import KVLinkSection
from infersim.simulator.validation import STRICT_CONFIG


class GoodputSection(BaseModel):
    """The plan file's `disaggregation:` section."""

    model_config = STRICT_CONFIG

    gpus: PositiveInt = Field(description="GPUs of every deployment compared")
    tensor_parallel: Optional[PositiveInt] = Field(
        None, description="GPUs per replica, colocated and in both pools (default: the workload's tensor_parallel)"
    )
    attainment: float = Field(0.9, gt=0, le=1, description="fraction of requests that must meet every SLO")
    splits: list[str] = Field(
        default_factory=list, description="prefill:decode replica counts, e.g. ['1:3', '2:2']; empty: every split"
    )
    link: KVLinkSection = KVLinkSection()
    layerwise_streaming: bool = False

    @field_validator("splits")
    @classmethod
    def _splits(cls, v: list[str]) -> list[str]:
        for s in v:
            p, _, d = s.partition(":")
            if not (p.isdigit() and d.isdigit() and int(p) > 0 and int(d) > 0):
                raise ValueError(f"split '{s}' is not PREFILL:DECODE replica counts, e.g. 1:3")
        return v
