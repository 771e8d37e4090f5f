"""Builds a simulation's pipelined replicas: per replica, a shared stage timeline and one
virtual engine per stage, each with an equal share of the replica's KV blocks."""

from __future__ import annotations

import simpy

from ..engine.blocks import BlockManager
from ..errors import InfersimError
from ..policies import build_scheduler
from .replica import PipelineReplica, VirtualEngine


def pipeline_replicas(sim, source: str = "") -> list[PipelineReplica]:
    sv, pp = sim.spec.serving, sim.placement.pp
    gpu_blocks, cpu_blocks = sim.memory.gpu_blocks // pp, sim.memory.cpu_blocks // pp
    if gpu_blocks < 1:
        raise InfersimError(
            f"{source}: field 'serving.gpu_blocks': {sim.memory.gpu_blocks} blocks cannot be shared by "
            f"{pp} virtual engines (one per pipeline stage); give at least {pp}"
        )
    out = []
    for i in range(sim.spec.hardware.replicas):
        link = simpy.Resource(sim.env, capacity=1)  # the virtual engines share the GPUs' host links

        def engine(v, timeline, i=i, link=link):
            return VirtualEngine(
                v,
                timeline,
                i,
                sim,
                BlockManager(gpu_blocks, cpu_blocks, sv.block_size, sv.watermark),
                build_scheduler(sv.scheduler, sv.preemption),
                sim.limits,
                sim.memory.kv_bytes_per_block,
                link,
            )

        out.append(PipelineReplica(i, sim, engine, pp))
    return out
