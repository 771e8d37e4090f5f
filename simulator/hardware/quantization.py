"""What vLLM runs for quantised weights on each NVIDIA architecture, as data
(simulator/catalog/quantization.yaml): per weight dtype, compute capability and kind of layer
(dense linears or routed experts), the kernel vLLM runs and the share of the card's compute and
memory rates it reaches, or a refusal where vLLM refuses the weights.

A profile names its `compute_capability`; one without it (AMD, CPU, a profile of your own) keeps
the rules the cost model applied before there were rules: FP8 refused without an fp8 or bf16 peak
(HardwareProfile.require_dtype), and priced as the rules price Ampere and later."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Optional

from pydantic import BaseModel, Field, PositiveFloat, model_validator

from ..errors import InfersimError
from ..paths import catalog_dir
from ..validation import STRICT_CONFIG
from ..yamlio import load_mapping, validate

if TYPE_CHECKING:
    from ..models.spec import ModelSpec
    from .profile import HardwareProfile

QUANTISED = ("fp8", "int8", "int4")
# A profile without a compute capability is priced as these architectures: Ada and later where it
# has an FP8 peak, Ampere otherwise (the rules before the table existed).
IMPLIED_CC = {True: 8.9, False: 8.0}


class WeightRule(BaseModel):
    """One row of the table: `dtype` weights on compute capabilities [min_cc, below_cc)."""

    model_config = STRICT_CONFIG

    dtype: Literal["fp8", "int8", "int4"]
    min_cc: PositiveFloat
    below_cc: Optional[PositiveFloat] = Field(None, description="first compute capability it does not cover")
    layers: Literal["dense", "experts", "all"] = Field(description="dense linears, routed experts, or both")
    kernel: Optional[str] = Field(description="what vLLM runs; null: vLLM refuses these weights")
    compute_share: float = Field(1.0, gt=0, le=1, description="share of the tensor-core peak when compute-bound")
    memory_share: float = Field(1.0, gt=0, le=1, description="share of the memory bandwidth when memory-bound")
    certainty: Literal["code", "measured", "thin", "unmeasured"]
    why: str
    source: str

    @model_validator(mode="after")
    def _check(self):
        if self.below_cc is not None and self.below_cc <= self.min_cc:
            raise ValueError(f"below_cc {self.below_cc} must exceed min_cc {self.min_cc}")
        if self.kernel is None and (self.compute_share != 1.0 or self.memory_share != 1.0):
            raise ValueError("a refusal (kernel: null) prices nothing: leave compute_share and memory_share out")
        return self

    def applies_to(self, dtype: str, experts: bool) -> bool:
        """Whether the rule is about `dtype` weights of this kind of layer, at some capability."""
        return self.dtype == dtype and self.layers in ("experts" if experts else "dense", "all")

    def covers(self, dtype: str, cc: float, experts: bool) -> bool:
        return self.applies_to(dtype, experts) and self.min_cc <= cc and (self.below_cc is None or cc < self.below_cc)

    @property
    def refused(self) -> bool:
        return self.kernel is None


def load_weight_rules(path: Path) -> dict[str, WeightRule]:
    """A rules file by rule name; two rules covering the same dtype, layers and capability are
    an error naming the file and both rules."""
    rules = {
        name: validate(WeightRule, entry if isinstance(entry, dict) else {}, f"{path}: {name}")
        for name, entry in load_mapping(path).items()
    }
    for dtype in QUANTISED:
        for experts in (False, True):
            spans = sorted(
                (r.min_cc, r.below_cc or float("inf"), n) for n, r in rules.items() if r.applies_to(dtype, experts)
            )
            for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
                if start < end:
                    kind = "experts" if experts else "dense"
                    raise InfersimError(f"{path}: rules '{a}' and '{b}' overlap for {dtype} {kind} layers")
    return rules


@lru_cache(maxsize=None)
def weight_rules() -> dict[str, WeightRule]:
    """The shipped table (simulator/catalog/quantization.yaml)."""
    return load_weight_rules(catalog_dir() / "quantization.yaml")


def weight_rule(dtype: str, cc: float, experts: bool = False) -> WeightRule | None:
    """The rule for `dtype` weights on compute capability `cc`; None for 16-bit weights and for
    capabilities the table does not reach (below Volta)."""
    for rule in weight_rules().values():
        if rule.covers(dtype, cc, experts):
            return rule
    return None


def pricing_rule(hardware: "HardwareProfile", dtype: str, experts: bool = False) -> WeightRule | None:
    """The rule that prices `dtype` weights on `hardware`: at its compute capability, or for a
    profile without one, at the architecture its peaks imply (IMPLIED_CC)."""
    cc = hardware.compute_capability
    if cc is None:
        cc = IMPLIED_CC["fp8" in hardware.peak_tflops]
    rule = weight_rule(dtype, cc, experts)
    return None if rule is None or rule.refused else rule


def require_weight_dtype(hardware: "HardwareProfile", dtype: str, field: str, model: "ModelSpec | None" = None) -> None:
    """Refuse weights vLLM refuses on this card, in one line naming the field, model, card and
    dtype; weights the table does not cover (16-bit, a profile without a compute capability) go
    through HardwareProfile.require_dtype."""
    cc = hardware.compute_capability
    parts = [False, True] if model is not None and model.moe is not None else [False]
    rules = [weight_rule(dtype, cc, experts) for experts in parts] if cc is not None else []
    if not rules or any(rule is None for rule in rules):
        hardware.require_dtype(dtype, field)
        return
    for experts, rule in zip(parts, rules):
        if rule.refused:
            what = f"model '{model.name}'" if model is not None else "the model"
            experts_text = "'s routed experts" if experts else ""
            raise InfersimError(
                f"{field}: vLLM refuses {dtype} weights for {what}{experts_text} on hardware profile "
                f"'{hardware.name}' (compute capability {cc:.1f}): {rule.why} ({rule.source}); "
                f"use {_alternatives(dtype, cc, experts)}"
            )


def _alternatives(dtype: str, cc: float, experts: bool) -> str:
    """The dtypes that run where `dtype` is refused, for the refusal's advice."""
    runs = [d for d in QUANTISED if d != dtype and (r := weight_rule(d, cc, experts)) is not None and not r.refused]
    return ", ".join(["fp16"] + runs)
