"""A whole simulated deployment: arrivals, a router, replicas, metrics. Built from a
workload spec; runs on SimPy; returns a `SimulationResult`. It sits above the engine (the
serving loop) and the features that extend it (speculation, offload), choosing the Replica
class a workload's sections ask for."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import simpy

from .costmodel import build_cost_model
from .disaggregation.deployment import build_disaggregated
from .engine.clock import SimEnvironment
from .engine.memory import MemoryOptions, MemoryPlan, plan_memory
from .engine.prefix_blocks import block_manager, prefix_cache_counters
from .engine.replica import Replica
from .engine.router import ROUTERS
from .engine.sequence import Sequence
from .errors import InfersimError
from .hardware.allreduce import build_all_reduce
from .hardware.catalog import load_hardware
from .hardware.quantization import require_weight_dtype
from .metrics.collector import MetricsCollector
from .models.catalog import load_model
from .models.dtypes import kv_dtype_for, normalize_dtype
from .offload.replica import offload_memory_plan
from .offload.replica import replica_class as offload_replica_class
from .parallel.dp_attention import check_rank_weights_fit, dp_attention_weight_bytes_per_gpu
from .parallel.dp_group import lockstep_groups
from .parallel.layout import layout_cost_model
from .parallel.memory import plan_pipeline_memory
from .parallel.placement import COLOCATED, check_deployment
from .parallel.setup import pipeline_replicas
from .policies import SchedulerLimits, build_scheduler
from .speculative.replica import replica_class as speculative_replica_class
from .validation import source_field
from .workload.requests import Requests
from .workload.schema import WorkloadSpec


@dataclass
class SimulationResult:
    spec: WorkloadSpec
    requests: dict[str, np.ndarray]
    series: np.ndarray | None  # None when streamed to disk
    metrics: MetricsCollector
    memory: MemoryPlan
    sim_time_s: float
    resolved: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # feature-specific summary entries (speculation, offload)


class Simulation:
    def __init__(
        self,
        spec: WorkloadSpec,
        requests: Requests,
        *,
        step_mode: bool = False,
        series_path: Path | None = None,
        progress: Callable[[int, int, float], None] | None = None,
        source: str = "workload",
    ):
        self.spec, self.requests, self.step_mode, self.progress = spec, requests, step_mode, progress
        self.source = source  # the workload file, named by errors found while building
        # token identity for prefix caching: keys of each request's full blocks
        self._prefix = requests.prefix if spec.serving.prefix_caching else None
        sv = spec.serving
        self.model = load_model(spec.model)
        self.dtype = normalize_dtype(sv.dtype)
        self.kv_dtype = kv_dtype_for(sv.dtype, sv.kv_dtype)
        max_model_len = sv.max_model_len or self.model.max_position_embeddings
        self.max_batched = sv.max_batched_tokens or (2048 if sv.chunked_prefill else max(max_model_len, 2048))
        self.limits = SchedulerLimits(sv.max_batch_size, self.max_batched, max_model_len, sv.chunked_prefill)
        # vLLM 0.2-0.5 keep a K and a V tensor per layer and swap block by block with one
        # cudaMemcpyAsync each (cache_ops.swap_blocks), per GPU: 2 x layers copies per block
        self.kv_copies_per_block = 2 * self.model.num_layers
        self.env = SimEnvironment()
        self.metrics = MetricsCollector(len(requests), series_path=series_path)
        self.extra: dict = {}
        self.deployment = None  # a disaggregated deployment's pools and KV transfers
        self.loops: list = []  # what runs the replicas' iterations, when not each replica its own
        # every pool's tensor parallelism (and a colocated pool's stages) checked once, here
        self.placements = check_deployment(self.model, spec, source)
        if spec.hardware.disaggregated is not None:
            build_disaggregated(self, source)
        else:
            self._build_colocated(source)
        self.total = len(requests)
        self.finished = 0
        self._next_rid = 0
        self._progress_every = max(1, self.total // 200)

    def _build_colocated(self, source: str) -> None:
        """One pool of identical replicas behind the workload's router; with pipeline stages (or a
        tensor-parallel group across nodes) the pipelined cost model, memory plan and replicas."""
        hw_sec = self.spec.hardware
        self.placement = self.placements[COLOCATED]
        tp = self.placement.tp
        self.hardware, self.cost_model = self.build_pool(
            hw_sec.profile, self.placement, source, host_link=hw_sec.host_link
        )
        self.parallel_account = {}  # per-stage memory and the links' sources, for config.yaml
        if self.placement.staged:
            self.parallel_account["links"] = self.cost_model.links.sources
        if self.spec.offload is not None:
            # KV lives in host memory: the GPU-only plan would reject models that offload weights too
            self.memory = offload_memory_plan(self)
        elif self.placement.pp > 1:
            self.memory, stages = plan_pipeline_memory(
                self.model, self.hardware, self.memory_options(tp), self.placement, source
            )
            self.parallel_account.update(stages)
        else:
            self.memory = self.plan_pool_memory(self.hardware, tp, source)
        if self.placement.pp > 1:
            self.replicas = pipeline_replicas(self, source)
        else:
            replica_cls = self._replica_class()
            self.replicas = [self.new_replica(replica_cls, i, self.memory) for i in range(hw_sec.replicas)]
            if self.spec.speculation is not None:
                # colocated drafts or Medusa heads took part of every replica's pool (each alike):
                # KV utilisation and config.yaml refer to what is left for the target
                self.memory = replace(self.memory, gpu_blocks=self.replicas[0].blocks.total_gpu)
        if hw_sec.data_parallel_attention:
            self.loops = lockstep_groups(self.replicas, hw_sec.expert_parallel, self.cost_model, self.step_mode)
        self.entry = self.replicas  # the replicas arrivals are routed to
        self.router = ROUTERS.get(hw_sec.router)(hw_sec.replicas)

    def build_pool(self, profile: str, placement, source: str, *, host_link=None, tp_field="hardware.tensor_parallel"):
        """The hardware and cost model of a pool of replicas placed as check_deployment checked
        (`tp_field` names its degree); a staged placement (stages, or a tensor-parallel group
        across nodes) prices its stages and links."""
        tp = placement.tp
        hardware = load_hardware(profile, host_link=host_link, all_reduce=self.spec.hardware.all_reduce)
        require_weight_dtype(hardware, self.dtype, f"{source}: field 'serving.dtype'", self.model)
        hardware.require_dtype(self.kv_dtype, f"{source}: field 'serving.kv_dtype'")
        hardware.require_tensor_parallel(tp, f"{source}: field '{tp_field}'")
        build_all_reduce(hardware.all_reduce, hardware).check(
            tp, placement.tp_crosses_nodes, source_field(source, "hardware.all_reduce")
        )
        dp_attention = self.spec.hardware.data_parallel_attention
        ep = self.spec.hardware.expert_parallel
        parallel = {"expert_parallel": ep} if ep > 1 and not dp_attention else {}
        cost_model = build_cost_model(
            self.spec.serving.cost_model,
            self.model,
            hardware,
            dtype=self.dtype,
            kv_dtype=self.kv_dtype,
            tensor_parallel=tp,
            **parallel,
        )
        return hardware, layout_cost_model(cost_model, placement, self.spec.hardware, source)

    def memory_options(self, tp: int) -> MemoryOptions:
        sv = self.spec.serving
        return MemoryOptions(
            sv.block_size,
            self.dtype,
            self.kv_dtype,
            tp,
            sv.gpu_memory_utilization,
            sv.swap_space_gb,
            self.max_batched,
            sv.max_batch_size,
            gpu_blocks=sv.gpu_blocks,
            cpu_blocks=sv.cpu_blocks,
            max_model_len=self.limits.max_model_len,
            non_torch_reserve_gib=sv.non_torch_reserve_gib,
            weight_bytes_per_gpu=self._dp_attention_weights(),
        )

    def _dp_attention_weights(self) -> float | None:
        """A data-parallel-attention rank's weights (experts sharded over its group), else None."""
        hw = self.spec.hardware
        if not hw.data_parallel_attention:
            return None
        return dp_attention_weight_bytes_per_gpu(self.model, hw.expert_parallel, self.dtype)

    def plan_pool_memory(self, hardware, tp: int, source: str) -> MemoryPlan:
        opts = self.memory_options(tp)
        if opts.weight_bytes_per_gpu is not None:
            check_rank_weights_fit(self.model, hardware, opts, self.spec.hardware.expert_parallel, source)
        return plan_memory(self.model, hardware, opts, source=source)

    def new_replica(self, replica_cls, index: int, memory: MemoryPlan, **kwargs):
        """A replica with its own block pools (sized by `memory`), scheduler and host link."""
        sv = self.spec.serving
        return replica_cls(
            index,
            self,
            block_manager(sv.prefix_caching, memory.gpu_blocks, memory.cpu_blocks, sv.block_size, sv.watermark),
            build_scheduler(sv.scheduler, sv.preemption),
            self.limits,
            memory.kv_bytes_per_block,
            simpy.Resource(self.env, capacity=1),
            **kwargs,
        )

    def _replica_class(self):
        """Features that change the iteration loop provide a Replica subclass."""
        if self.spec.speculation is not None:
            if self.spec.serving.prefix_caching:
                raise InfersimError(
                    f"{self.source}: serving.prefix_caching does not combine with speculation (the speculative "
                    "engines roll back KV blocks by count)"
                )
            return speculative_replica_class(self.spec.speculation)
        if self.spec.offload is not None:
            return offload_replica_class(self.spec.offload)
        return Replica

    # ---- arrivals -----------------------------------------------------------------------
    def _new_seq(self, i: int, arrival: float, client: int = -1) -> Sequence:
        r = self.requests
        seq = Sequence(i, r.prompt_tokens[i], r.output_tokens[i], arrival, client)
        if self._prefix is not None:
            seq.block_keys = self._prefix.keys(i, seq.prompt_len + seq.output_len, self.spec.serving.block_size)
        self.metrics.arrive(seq)
        return seq

    def _deliver(self, seq: Sequence) -> None:
        self.entry[self.router.route(seq, self.entry)].add(seq)

    def _open_loop(self):
        env, arrivals = self.env, self.requests.arrival_s
        limit = self.requests.duration_s
        for i in range(len(arrivals)):
            t = float(arrivals[i])
            if limit is not None and t > limit:
                break
            if t > env.now:
                yield env.timeout_at(t)
            self._deliver(self._new_seq(i, t))

    def _start_client(self, client: int) -> None:
        if self._next_rid >= self.total:
            return
        now = self.env.now
        if self.requests.duration_s is not None and now > self.requests.duration_s:
            return
        i = self._next_rid
        self._next_rid += 1
        self._deliver(self._new_seq(i, now, client))

    def _client_after(self, client: int, delay: float):
        yield self.env.timeout_at(self.env.now + delay)
        self._start_client(client)

    # ---- called by replicas -------------------------------------------------------------
    def finish(self, seq: Sequence, now: float, aborted: bool = False) -> None:
        reason = self.limits.abort_reason(seq.num_tokens) if aborted else "unknown"
        self.metrics.finish(seq, now, aborted=aborted, reason=reason)
        seq.block_keys = None  # a finished request's keys are not needed again
        self.finished += 1
        if self.progress is not None and self.finished % self._progress_every == 0:
            self.progress(self.finished, self.total, now)
        if seq.client >= 0:
            think = self.requests.think_time_s
            if think > 0:
                self.env.process(self._client_after(seq.client, think))
            else:
                self._start_client(seq.client)

    # ---- run ----------------------------------------------------------------------------
    def run(self) -> SimulationResult:
        if self.requests.closed_loop:
            for c in range(self.requests.closed_loop_clients):
                self._start_client(c)
        else:
            self.env.process(self._open_loop())
        for loop in self.loops or self.replicas:
            self.env.process(loop.run())
        self.env.run()
        if self.progress is not None:
            self.progress(self.finished, self.total, self.env.now)
        stuck = sum(r.outstanding for r in self.replicas)
        if stuck:
            raise RuntimeError(f"simulation ended with {stuck} requests unfinished")
        series = self.metrics.close_series()
        for rep in self.replicas:
            rep.report(self.extra)
        if self.spec.serving.prefix_caching:
            self.extra["prefix_cache"] = prefix_cache_counters([rep.blocks for rep in self.replicas])
        table = self.metrics.requests_table()
        if self.deployment is not None:
            self.deployment.report(table, self.extra)
        return SimulationResult(
            self.spec,
            table,
            series,
            self.metrics,
            self.memory,
            float(self.env.now),
            self.resolved(),
            self.extra,
        )

    def resolved(self) -> dict:
        """Everything the run used, defaults included."""
        out = {
            "workload": self.spec.model_dump(mode="json"),
            "model": self.model.summary(self.spec.serving.dtype),
            "hardware": self.hardware.record(),
            "memory": {
                "gpu_blocks": self.memory.gpu_blocks,
                "cpu_blocks": self.memory.cpu_blocks,
                "kv_bytes_per_block": self.memory.kv_bytes_per_block,
                "weight_bytes_per_gpu": self.memory.weight_bytes_per_gpu,
                "activation_bytes_per_gpu": self.memory.activation_bytes_per_gpu,
                "non_torch_reserve_bytes_per_gpu": self.memory.non_torch_reserve_bytes,
                "memory_bytes_per_gpu": self.memory.memory_bytes_per_gpu,
                "blocks_source": self.memory.source,
            },
            "limits": self.limits.__dict__,
            "step_mode": self.step_mode,
            "num_requests": self.total,
        }
        if self.spec.hardware.disaggregated is not None:
            out["disaggregated"] = self.deployment.resolved()
        else:
            out["parallel"] = {**self.placement.describe(), **self.parallel_account}
            if self.spec.hardware.data_parallel_attention:
                out["parallel"]["data_parallel_attention"] = {
                    "expert_parallel": self.spec.hardware.expert_parallel,
                    "groups": self.spec.hardware.replicas // self.spec.hardware.expert_parallel,
                }
                if self.spec.hardware.two_batch_overlap:
                    out["parallel"]["data_parallel_attention"]["two_batch_overlap"] = (
                        self.spec.hardware.two_batch_overlap
                    )
        return out


def simulate(spec: WorkloadSpec, requests: Requests, **kwargs) -> SimulationResult:
    if len(requests) == 0:
        raise InfersimError("the workload produced no requests")
    return Simulation(spec, requests, **kwargs).run()
