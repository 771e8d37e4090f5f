"""Where a replica's work runs: its layers split over pipeline stages, each stage a
tensor-parallel group, the groups laid on nodes in order.

Layers split as vLLM splits them (`get_pp_indices` in vllm/distributed/utils.py): every stage
gets layers // pp, and the remainder goes one each to the stages before the last, from the
second-to-last backwards (the last stage also holds the final norm and the LM head). A
replica's GPUs fill nodes in order, stage 0's group first, so a tensor-parallel group stays in
one node when it fits in one, and a stage boundary crosses nodes exactly where a node fills."""

from __future__ import annotations

from dataclasses import dataclass

from ..disaggregation.config import POOLS
from ..errors import InfersimError
from ..validation import check_tensor_parallel, positive_int, source_field
from .config import ClusterSection
from .dp_rules import check_dp_attention, fail

COLOCATED = "colocated"  # check_deployment's key of a colocated deployment's one pool


def stage_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per stage, vLLM's default split."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return tuple(parts)


@dataclass(frozen=True)
class Placement:
    tp: int
    pp: int
    layers: tuple[int, ...]  # per stage
    cluster: ClusterSection

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def gpus_per_node(self) -> int:
        return self.cluster.gpus_per_node

    @property
    def nodes(self) -> int:
        """Nodes one replica spans."""
        return -(-self.gpus // self.gpus_per_node)

    @property
    def layer_ranges(self) -> tuple[tuple[int, int], ...]:
        """(first layer, one past the last) of each stage, stage 0 holding the first layers."""
        stops = [sum(self.layers[: s + 1]) for s in range(self.pp)]
        return tuple(zip([0, *stops[:-1]], stops))

    def sparse_layers(self, model) -> tuple[int, ...]:
        """Mixture-of-experts layers on each stage (DeepSeek's leading dense layers sit on stage 0)."""
        return tuple(model.sparse_layers_in(a, b) for a, b in self.layer_ranges)

    @property
    def tp_crosses_nodes(self) -> bool:
        return self.tp > self.gpus_per_node

    @property
    def tp_devices_per_node(self) -> int:
        return min(self.tp, self.gpus_per_node)

    def boundary_crosses_nodes(self, stage: int) -> bool:
        """Whether the hand-off from `stage` to `stage + 1` goes between nodes (rank i of one
        group sends to rank i of the next)."""
        g = self.gpus_per_node
        return any((stage * self.tp + i) // g != ((stage + 1) * self.tp + i) // g for i in range(self.tp))

    @property
    def staged(self) -> bool:
        """Needs the stage-aware cost model: several stages, or a group spanning nodes."""
        return self.pp > 1 or self.tp_crosses_nodes

    def describe(self) -> dict:
        return {
            "tensor_parallel": self.tp,
            "pipeline_parallel": self.pp,
            "layers_per_stage": list(self.layers),
            "gpus_per_replica": self.gpus,
            "gpus_per_node": self.gpus_per_node,
            "nodes_per_replica": self.nodes,
            "tp_group_crosses_nodes": self.tp_crosses_nodes,
            "stage_boundaries_across_nodes": [s for s in range(self.pp - 1) if self.boundary_crosses_nodes(s)],
        }


def tp_across_nodes_note(tp: int, gpus_per_node: int, what: str = "the tensor-parallel group") -> str:
    """A line for a tensor-parallel group larger than a node ('' when it fits one): its
    all-reduces, two per layer, cross the network, which vLLM's distributed-serving guide avoids
    by keeping tensor parallelism inside a node and pipeline parallelism across nodes."""
    if tp <= gpus_per_node:
        return ""
    return (
        f"{what} of {tp} GPUs spans {-(-tp // gpus_per_node)} nodes of {gpus_per_node}: its all-reduces cross the "
        f"inter-node network (tensor parallel inside a node and pipeline parallel across nodes avoids that)"
    )


def cluster_gpus_per_node(hardware_section) -> int:
    return (hardware_section.cluster or ClusterSection()).gpus_per_node


def check_parallel(model, hardware_section, source: str = "") -> Placement:
    """The one rule set for TP x PP on a cluster, each failure one line naming the field."""
    tp = check_tensor_parallel(model, hardware_section.tensor_parallel, source=source)
    pp = positive_int(hardware_section.pipeline_parallel, "hardware.pipeline_parallel", source)
    if pp > model.num_layers:
        raise InfersimError(
            f"{source_field(source, 'hardware.pipeline_parallel')}: {pp} stages exceed {model.name}'s "
            f"{model.num_layers} layers (each stage holds at least one)"
        )
    cluster = hardware_section.cluster or ClusterSection()
    _check_nodes_split(tp, cluster.gpus_per_node, source_field(source, "hardware.tensor_parallel"))
    return Placement(tp, pp, stage_layers(model.num_layers, pp), cluster)


def _check_nodes_split(tp: int, g: int, where: str) -> None:
    if g % tp and tp % g:
        raise InfersimError(
            f"{where}: tensor parallel {tp} neither divides hardware.cluster.gpus_per_node {g} nor is a "
            f"multiple of it (a group would straddle nodes unevenly)"
        )


def check_deployment(model, spec, source: str = "") -> dict[str, Placement]:
    """The placement of every pool of a deployment, checked here once for both kinds (each
    failure one line naming the field): a colocated deployment's one pool (key `COLOCATED`:
    check_parallel, and what a staged replica does not combine with), or a disaggregated
    deployment's prefill and decode pools (one stage each, its own tensor_parallel)."""
    d = spec.hardware.disaggregated
    cluster = spec.hardware.cluster or ClusterSection()
    if spec.hardware.two_batch_overlap and not spec.hardware.data_parallel_attention:
        fail(
            source,
            "hardware.two_batch_overlap",
            "overlaps the expert all-to-alls of data-parallel attention: give hardware.data_parallel_attention: true",
        )
    if spec.hardware.data_parallel_attention:  # every rank one GPU, one stage
        check_dp_attention(model, spec, source)
        return {COLOCATED: Placement(1, 1, stage_layers(model.num_layers, 1), cluster)}
    if d is None:
        return {COLOCATED: _check_colocated(model, spec, source)}
    placements = {}
    for name in POOLS:
        field = f"hardware.disaggregated.{name}.tensor_parallel"
        tp = check_tensor_parallel(model, getattr(d, name).tensor_parallel, field=field, source=source)
        placements[name] = _check_staged(
            model, spec, Placement(tp, 1, stage_layers(model.num_layers, 1), cluster), field, source
        )
    return placements


def _check_colocated(model, spec, source: str) -> Placement:
    """check_parallel, and what a staged replica does not combine with."""
    placement = check_parallel(model, spec.hardware, source)
    field = "hardware.pipeline_parallel" if placement.pp > 1 else "hardware.tensor_parallel"
    return _check_staged(model, spec, placement, field, source)


def _check_staged(model, spec, placement: Placement, field: str, source: str) -> Placement:
    """What a staged replica (stages, or a tensor-parallel group across nodes) does not combine
    with: speculation and offload run their own iteration loops, a prefix cache is not kept by
    its virtual engines, and only the roofline prices stages. A group across nodes must split evenly over them."""
    if not placement.staged:
        return placement
    where = source_field(source, field)
    _check_nodes_split(placement.tp, placement.gpus_per_node, where)
    for section in ("speculation", "offload"):
        if getattr(spec, section) is not None:
            raise InfersimError(f"{where}: {_what(placement)} does not combine with a '{section}' section")
    if spec.serving.prefix_caching:
        raise InfersimError(f"{where}: {_what(placement)} does not combine with serving.prefix_caching")
    if spec.serving.cost_model != "roofline":
        raise InfersimError(
            f"{where}: {_what(placement)} is priced by the roofline cost model only, not "
            f"serving.cost_model '{spec.serving.cost_model}'"
        )
    return placement


def _what(p: Placement) -> str:
    return f"pipeline_parallel {p.pp}" if p.pp > 1 else f"a tensor-parallel group of {p.tp} across nodes"
