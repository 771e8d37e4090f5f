"""Cost models: one interface (`CostModel`), one file per implementation, all chosen by name
from `COST_MODELS`."""
from __future__ import annotations

from ..registry import Registry
from .base import CostModel, OperatorCost
from .batch import BatchShape, BatchTotals
from .fitted import FittedCostModel
from .measured import MeasuredCostModel
from .regression import RegressionCostModel
from .replay import ReplayCostModel
from .roofline import RooflineCostModel
from .speculative_fit import SpecDraftCost, SpecTargetCost

COST_MODELS: Registry[type[CostModel]] = Registry("cost model")
for _cls in (RooflineCostModel, RegressionCostModel, FittedCostModel, SpecTargetCost, SpecDraftCost,
             MeasuredCostModel, ReplayCostModel):
    COST_MODELS.register(_cls.name)(_cls)


def build_cost_model(name: str, model, hardware, **options) -> CostModel:
    """The cost model a workload names, for its model and hardware."""
    return COST_MODELS.get(name).for_workload(model, hardware, **options)


__all__ = ["CostModel", "OperatorCost", "BatchShape", "BatchTotals", "RooflineCostModel", "RegressionCostModel",
           "FittedCostModel", "SpecTargetCost", "SpecDraftCost", "MeasuredCostModel", "ReplayCostModel",
           "COST_MODELS", "build_cost_model"]
