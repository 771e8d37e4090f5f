"""What a data-parallel-attention deployment must be (parallel/dp_attention.py): a mixture of
experts, one GPU per rank, groups of expert_parallel replicas that split the experts and the
nodes evenly, and the plain engine priced by the roofline."""

from __future__ import annotations

from ..errors import InfersimError
from ..validation import positive_int, source_field
from .config import ClusterSection

FIELD = "hardware.data_parallel_attention"


def fail(source: str, field: str, message: str):
    raise InfersimError(f"{source_field(source, field)}: {message}")


def check_dp_attention(model, spec, source: str = "") -> None:
    """Every rule of a data-parallel-attention deployment, each failure one line naming its
    field."""
    hw, sv = spec.hardware, spec.serving
    if model.moe is None:
        fail(source, FIELD, f"needs a mixture-of-experts model; '{model.name}' has no experts")
    for field, value in (
        ("hardware.tensor_parallel", hw.tensor_parallel),
        ("hardware.pipeline_parallel", hw.pipeline_parallel),
    ):
        if value != 1:
            fail(source, field, f"{value} with data_parallel_attention: each rank is one GPU (give 1)")
    if hw.disaggregated is not None:
        fail(source, FIELD, "does not combine with hardware.disaggregated")
    ep = positive_int(hw.expert_parallel, "hardware.expert_parallel", source)
    if ep < 2:
        fail(source, "hardware.expert_parallel", "data_parallel_attention needs at least 2 ranks sharing the experts")
    if model.moe.num_experts % ep:
        fail(
            source,
            "hardware.expert_parallel",
            f"{ep} does not divide the {model.moe.num_experts} experts of '{model.name}'",
        )
    if hw.replicas % ep:
        fail(
            source,
            "hardware.replicas",
            f"{hw.replicas} is not a multiple of hardware.expert_parallel {ep} (each rank is a replica)",
        )
    cluster = hw.cluster or ClusterSection()
    g = cluster.gpus_per_node
    if g % ep and ep % g:
        fail(
            source,
            "hardware.expert_parallel",
            f"{ep} neither divides hardware.cluster.gpus_per_node {g} nor is a multiple of it",
        )
    for section in ("speculation", "offload"):
        if getattr(spec, section) is not None:
            fail(source, FIELD, f"does not combine with a '{section}' section")
    if sv.cost_model != "roofline":
        fail(source, FIELD, f"is priced by the roofline cost model only, not serving.cost_model '{sv.cost_model}'")
