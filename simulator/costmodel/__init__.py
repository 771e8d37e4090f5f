"""Cost models: one interface (`CostModel`), several implementations, chosen by name."""
from __future__ import annotations

from ..registry import Registry
from .base import CostModel, OperatorCost
from .batch import BatchShape, BatchTotals
from .roofline import RooflineCostModel

COST_MODELS: Registry = Registry("cost model")
COST_MODELS.register("roofline")(RooflineCostModel)
from .regression import RegressionCostModel  # noqa: E402
COST_MODELS.register("regression")(RegressionCostModel)


def build_cost_model(name: str, model, hardware, **kwargs) -> CostModel:
    return COST_MODELS.get(name)(model, hardware, **kwargs)


__all__ = ["CostModel", "OperatorCost", "BatchShape", "BatchTotals", "RooflineCostModel", "COST_MODELS", "build_cost_model"]
