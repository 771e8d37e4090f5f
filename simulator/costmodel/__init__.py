"""Cost models: one interface (`CostModel`), one file per implementation, all chosen by name
from `COST_MODELS`."""

from __future__ import annotations

from ..errors import InfersimError
from ..registry import Registry
from .base import CostModel, OperatorCost
from .batch import BatchShape, BatchTotals
from .fitted import FittedCostModel
from .measured import MeasuredCostModel
from .regression import RegressionCostModel
from .replay import OffloadReplayCostModel, ReplayCostModel
from .roofline import RooflineCostModel
from .speculative_fit import SpecDraftCost, SpecTargetCost

COST_MODELS: Registry[type[CostModel]] = Registry("cost model")
for _cls in (
    RooflineCostModel,
    RegressionCostModel,
    FittedCostModel,
    SpecTargetCost,
    SpecDraftCost,
    MeasuredCostModel,
    ReplayCostModel,
    OffloadReplayCostModel,
):
    COST_MODELS.register(_cls.name)(_cls)


def workload_cost_model(name: str) -> type[CostModel]:
    """The class a workload's `serving.cost_model` names; one built from measured data is refused."""
    cls = COST_MODELS.get(name)
    if not cls.from_workload:
        usable = " or ".join(n for n in COST_MODELS.names() if COST_MODELS.get(n).from_workload)
        raise InfersimError(
            f"cost model '{cls.name}' is built from measured data (sim validate, sim exec), not "
            f"named in a workload; use {usable}"
        )
    return cls


def build_cost_model(name: str, model, hardware, **options) -> CostModel:
    """The cost model a workload names, for its model and hardware."""
    return workload_cost_model(name)(model, hardware, **options)


__all__ = [
    "CostModel",
    "OperatorCost",
    "BatchShape",
    "BatchTotals",
    "RooflineCostModel",
    "RegressionCostModel",
    "FittedCostModel",
    "SpecTargetCost",
    "SpecDraftCost",
    "MeasuredCostModel",
    "ReplayCostModel",
    "OffloadReplayCostModel",
    "COST_MODELS",
    "build_cost_model",
    "workload_cost_model",
]
