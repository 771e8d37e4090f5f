"""Building a disaggregated deployment on a `Simulation`: a prefill pool and a decode pool, each
with its own hardware profile, tensor parallelism, cost model, memory plan and router, and the
KV transfers between them; and its entries in the run's results."""

from __future__ import annotations

from ..engine.router import ROUTERS
from ..errors import InfersimError
from ..hardware.catalog import load_hardware
from ..metrics.summary import _stats
from ..validation import in_field
from .config import POOLS
from .decode import DecodeReplica
from .link import bytes_kv_sent_per_token, resolve_kv_link
from .phases import PHASES, PhaseTimes
from .prefill import PrefillReplica
from .transfers import KVTransfers


def check_disaggregated(spec, source: str) -> None:
    """What the schema cannot see: features that change the iteration loop do not combine with
    disaggregation, and every pool's names exist (its tensor parallelism is check_deployment's)."""
    d = spec.hardware.disaggregated
    if d is None:
        return
    for section in ("speculation", "offload"):
        if getattr(spec, section) is not None:
            raise InfersimError(f"{source}: field 'hardware.disaggregated': does not combine with '{section}'")
    if spec.serving.prefix_caching:
        # the decode pool receives whole KV caches; which cached blocks a transfer could skip is not modelled
        raise InfersimError(f"{source}: field 'hardware.disaggregated': does not combine with 'serving.prefix_caching'")
    for name in POOLS:
        pool = getattr(d, name)
        field = f"hardware.disaggregated.{name}"
        if pool.profile is not None:
            in_field(source, f"{field}.profile", load_hardware, pool.profile)
        if pool.router is not None:
            in_field(source, f"{field}.router", ROUTERS.get, pool.router)


class Deployment:
    """The pools of one simulation; `build_disaggregated` puts its replicas on the simulation."""

    def __init__(self, sim, source: str):
        spec = sim.spec
        check_disaggregated(spec, source)
        hw, d = spec.hardware, spec.hardware.disaggregated
        self.section = d
        self.phases = PhaseTimes(len(sim.requests))
        tp = {name: sim.placements[name].tp for name in POOLS}
        inter_node = sim.placements["prefill"].cluster.inter_node  # the pools share the cluster
        self.link = resolve_kv_link(d.link, inter_node, tp["prefill"], tp["decode"])
        sent = bytes_kv_sent_per_token(sim.model, tp["decode"], sim.kv_dtype)
        self.transfers = KVTransfers(sim, d, self.link, sent, self.phases)
        self.pools: dict[str, dict] = {}
        self.replicas: dict[str, list] = {}
        index = 0
        for name, cls in zip(POOLS, (PrefillReplica, DecodeReplica)):
            pool = getattr(d, name)
            field = f"hardware.disaggregated.{name}"
            placement = sim.placements[name]
            tp = placement.tp
            hardware, cost = sim.build_pool(
                pool.profile or hw.profile,
                placement,
                source,
                host_link=hw.host_link,
                tp_field=f"{field}.tensor_parallel",
            )
            memory = sim.plan_pool_memory(hardware, tp, f"{source}: field '{field}'")
            sim.cost_model = cost  # the replicas of this pool time their iterations with it
            self.replicas[name] = [
                sim.new_replica(cls, index + i, memory, transfers=self.transfers) for i in range(pool.replicas)
            ]
            index += pool.replicas
            self.pools[name] = {
                "hardware": hardware,
                "cost_model": cost,
                "memory": memory,
                "tensor_parallel": tp,
                "tp_group_crosses_nodes": placement.tp_crosses_nodes,
            }
        self.prefill_router = ROUTERS.get(d.prefill.router or hw.router)(d.prefill.replicas)
        self.transfers.decode = self.replicas["decode"]
        self.transfers.router = ROUTERS.get(d.decode.router or hw.router)(d.decode.replicas)

    def resolved(self) -> dict:
        out = {}
        for name in POOLS:
            p = self.pools[name]
            m = p["memory"]
            out[name] = {
                "hardware": p["hardware"].name,
                "replicas": len(self.replicas[name]),
                "tensor_parallel": p["tensor_parallel"],
                "tp_group_crosses_nodes": p["tp_group_crosses_nodes"],
                "gpu_blocks": m.gpu_blocks,
                "cpu_blocks": m.cpu_blocks,
                "kv_bytes_per_block": m.kv_bytes_per_block,
                "weight_bytes_per_gpu": m.weight_bytes_per_gpu,
            }
        out["kv_link"] = self.link.record()
        out["bytes_kv_sent_per_token"] = self.transfers.bytes_sent_per_token
        return out

    def report(self, table: dict, extra: dict) -> None:
        """Per-request phase columns into `table`, the pools' summary entries into `extra`."""
        cols = self.phases.columns(table)
        table.update(cols)
        m = self.transfers.sim.metrics
        pools = {}
        for name in POOLS:
            idx = {r.index for r in self.replicas[name]}
            tw = m.time_integrals(idx)
            busy = tw["time_s"] or 1.0
            blocks = self.pools[name]["memory"].gpu_blocks
            pools[name] = {
                "replicas": len(idx),
                "gpus": len(idx) * self.pools[name]["tensor_parallel"],
                "hardware": self.pools[name]["hardware"].name,
                "gpu_blocks": blocks,
                "batch_size_mean_busy": tw["batch_size"] / busy,
                "kv_utilization_mean_busy": tw["gpu_blocks_used"] / busy / blocks,
                "busy_time_s": tw["time_s"],
            }
        c = self.transfers.counters
        extra["disaggregation"] = {
            "pools": pools,
            "phases_s": {name: _stats(cols[name]) for name in PHASES},
            "kv_transfers": c["transfers"],
            "kv_transfers_streamed": c["streamed"],
            "kv_transfer_bytes": c["bytes"],
            "kv_link_busy_s": c["time_s"],
            "kv_link": self.link.record(),
            "layerwise_streaming": self.section.layerwise_streaming,
        }


def build_disaggregated(sim, source: str) -> None:
    """Put a disaggregated deployment's replicas, router and pools on `sim`."""
    dep = Deployment(sim, source)
    decode = dep.pools["decode"]
    # what a single-pool caller reads (resolved config, memory): the decode pool, which holds the KV longest
    sim.hardware, sim.cost_model, sim.memory = decode["hardware"], decode["cost_model"], decode["memory"]
    sim.replicas = dep.replicas["prefill"] + dep.replicas["decode"]
    sim.entry = dep.replicas["prefill"]
    sim.router = dep.prefill_router
    sim.deployment = dep
