"""The cost model of a checked layout (parallel/placement.py `check_deployment`): the base
cost model of one GPU group, priced as data-parallel attention (parallel/dp_attention.py), as
pipeline stages or a tensor-parallel group across nodes (parallel/cost.py), or as it is. `sim run`
and `sim roofline` both price a layout through it."""

from __future__ import annotations

from .cost import PipelineCostModel
from .dp_attention import DataParallelAttentionCostModel
from .placement import Placement


def layout_cost_model(base, placement: Placement, hardware_section, source: str = ""):
    """`base` (tensor parallel `placement.tp`) wrapped for the layout `hardware_section` asks for."""
    if hardware_section.data_parallel_attention:
        return DataParallelAttentionCostModel(
            base,
            placement,
            hardware_section.expert_parallel,
            source,
            two_batch_overlap=hardware_section.two_batch_overlap,
        )
    if placement.staged:
        return PipelineCostModel(base, placement, source)
    return base
