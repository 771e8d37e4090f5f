"""Communication of a placed replica: the tensor-parallel all-reduces of a group that spans
nodes, and the activations one stage hands to the next.

Measured first: a profile's `collectives:` section (NCCL times from vidur's profiling data)
prices an all-reduce of exactly this many workers spread this way over nodes (the a100_dgx setup
measured 16 workers on two 8-GPU nodes) and a send/recv between two nodes (both DGX setups
measured it); within a node the roofline's chosen all-reduce kernel applies
(`hardware.all_reduce`: NCCL's measured fits, else the interconnect, or vLLM's custom kernel).
Otherwise the cluster's inter-node link prices them. A hand-off takes the link's latency plus
its bytes at the link's bandwidth. An all-reduce across nodes takes the NCCL all-reduce of the
node's GPUs inside the node (no engine runs its custom kernel across nodes), two network hops
(the measured send/recv between nodes at zero bytes where the profile has it, else the link's
latency) and 2(w-1)/w of the message through every GPU's network adapter, the ring's slowest
hop: it is never cheaper than the part inside one node. Against the a100_dgx measurement of 16
workers on two nodes (which that profile uses as is) this rule is within -37% to +44% by message
size; a ring priced on the network's latency alone is -75% to -90% below 2 MB."""

from __future__ import annotations

import numpy as np

from ..errors import InfersimError
from ..hardware.collectives import ring_traffic
from .placement import Placement


def _measured(fits, workers: int, devices_per_node: int):
    """A fit of exactly this placement, or None (no borrowing across placements)."""
    for fit in fits:
        if fit.workers == workers and fit.devices_per_node == devices_per_node:
            return fit
    return None


class Links:
    def __init__(self, base, placement: Placement, source: str = ""):
        self.base, self.placement = base, placement
        hw = base.hardware
        coll = hw.collectives
        self._link = placement.cluster.inter_node
        self._ar_fit = (
            _measured(coll.all_reduce, placement.tp, placement.gpus_per_node)
            if coll is not None and placement.tp_crosses_nodes
            else None
        )
        self._sr_fit = _measured(coll.send_recv, 2, 1) if coll is not None else None
        within = any(not placement.boundary_crosses_nodes(s) for s in range(placement.pp - 1))
        if within and hw.interconnect is None and (coll is None or not coll.send_recv):
            raise InfersimError(
                f"{source}: field 'hardware.pipeline_parallel': hardware profile '{hw.name}' has no "
                f"interconnect (nor measured send/recv) to hand activations between stages in a node"
            )
        self.sources = {
            "tp_all_reduce": (
                f"within a node ({base.all_reduce.describe(placement.tp)})"
                if not placement.tp_crosses_nodes
                else (f"measured ({self._ar_fit.fitted_on})" if self._ar_fit else "inter-node link (datasheet ring)")
            ),
            "stage_handoff_across_nodes": (
                f"measured ({self._sr_fit.fitted_on})" if self._sr_fit else "inter-node link (datasheet)"
            ),
        }

    def allreduce_pair_time_s(self, tokens) -> np.ndarray:
        """The two all-reduces of one layer (after attention, after the MLP) for `tokens`."""
        tokens = np.asarray(tokens, dtype=np.float64)
        if not self.placement.tp_crosses_nodes:
            return self.base.allreduce_time_s(tokens)
        nbytes = (self.base._ar_bytes_per_token / 2.0) * tokens
        if self._ar_fit is not None:
            return 2.0 * self._ar_fit.time_s(nbytes)
        within = self.base.nccl_allreduce_time_s(nbytes, self.placement.tp_devices_per_node)
        network = ring_traffic(self.placement.tp) * nbytes / (self._link.bandwidth_gbps * 1e9)
        return 2.0 * (within + 2.0 * self.network_hop_latency_s() + network)

    def network_hop_latency_s(self) -> float:
        """One message between nodes at zero bytes: measured where the profile has it."""
        if self._sr_fit is not None:
            return float(self._sr_fit.time_s(0.0))
        return self._link.latency_us * 1e-6

    def handoff_time_s(self, stage: int, nbytes) -> np.ndarray:
        """Activations from `stage` to `stage + 1`: every rank pair sends at once on its own link."""
        nbytes = np.asarray(nbytes, dtype=np.float64)
        if not self.placement.boundary_crosses_nodes(stage):
            return np.asarray(self.base.send_recv_time_s(nbytes), dtype=np.float64)
        if self._sr_fit is not None:
            return self._sr_fit.time_s(nbytes)
        link = self._link
        return link.latency_us * 1e-6 + nbytes / (link.bandwidth_gbps * 1e9)
