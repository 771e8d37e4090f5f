"""An offloading serving replica: the engine's continuous-batching loop, with

  - the KV pool in CPU memory: the block manager's pool is the offload memory plan's
    (`memory.plan_offload_memory`), so host memory, not GPU blocks, bounds the batch
    (its `gpu` fields count the pool; there is no second tier to swap to, so preemption
    falls back to recompute);
  - every iteration costed by the offload cost model (per-layer compute pipelined with the
    policy's KV loads), with each sequence's final length bound for policies that need it
    (H2O's budget is a fraction of it);
  - counters for the summary: bytes loaded and stored over the host link, and the quality
    proxies (relative KV size, attention mass kept) averaged over decode tokens.

Decode stretches still jump from event to event: the cost model's `decode_step_times_s`
equals stepping `iteration_time_s`, so event and step modes give identical timestamps."""

from __future__ import annotations

import weakref
from dataclasses import replace

import numpy as np

from ..engine.prefix_blocks import block_manager
from ..engine.replica import Replica
from ..models.dtypes import kv_dtype_for
from .config import OffloadSection
from .memory import OffloadMemoryPlan, plan_offload_memory
from .setup import OffloadSetup, build_offload

_SETUPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _Shared:
    """What the replicas of one simulation share: the setup, the plan and the counters."""

    def __init__(self, sim, section: OffloadSection):
        sv, hw = sim.spec.serving, sim.spec.hardware
        self.setup: OffloadSetup = build_offload(
            sim.model,
            sim.hardware,
            section,
            dtype=sv.dtype,
            kv_dtype=kv_dtype_for(sv.dtype, sv.kv_dtype),
            tensor_parallel=hw.tensor_parallel,
            base=sim.cost_model,
        )
        opts = replace(
            sim.memory_options(hw.tensor_parallel),
            dtype=self.setup.base.weight_dtype,
            kv_dtype=self.setup.base.kv_dtype,
        )
        self.plan: OffloadMemoryPlan = plan_offload_memory(
            sim.model, sim.hardware, self.setup.policy, section, opts, source=sim.spec.name
        )
        sim.memory = self.plan.engine_plan()  # summaries and KV utilisation refer to the pool
        self.totals = {
            "loaded_bytes": 0.0,
            "stored_bytes": 0.0,
            "decode_tokens": 0.0,
            "kv_size_sum": 0.0,
            "mass_sum": 0.0,
        }


def _shared(sim, section) -> _Shared:
    sh = _SETUPS.get(sim)
    if sh is None:
        sh = _SETUPS[sim] = _Shared(sim, section)
    return sh


def replica_class(section: OffloadSection):
    """The Replica subclass for a workload's `offload:` section."""

    class OffloadReplica(Replica):
        offload = section

        def __init__(self, index, sim, blocks, scheduler, limits, kv_bytes_per_block, link):
            super().__init__(index, sim, blocks, scheduler, limits, kv_bytes_per_block, link)
            self.shared = _shared(sim, section)
            self.cost = self.shared.setup.cost_model()
            plan = self.shared.plan
            sv = sim.spec.serving
            self.blocks = block_manager(sv.prefix_caching, plan.pool_blocks, 0, blocks.block_size, sv.watermark)
            self.kv_bytes_per_block = plan.kv_bytes_per_block
            self.policy = self.shared.setup.policy

        # ---- costing with final lengths bound ------------------------------------------
        def _iteration(self, batch, out_bytes, in_bytes):
            final = np.fromiter((s.prompt_len + s.output_len for s, _ in batch), dtype=np.int64, count=len(batch))
            q = np.fromiter((n for _, n in batch), dtype=np.int64, count=len(batch))
            ctx = np.fromiter((s.computed for s, _ in batch), dtype=np.int64, count=len(batch))
            self._account(q[None, :], ctx[None, :], final)
            self.cost.bind_final(final)
            yield from super()._iteration(batch, out_bytes, in_bytes)

        def _decode_stretch(self, seqs):
            self._stretch_final = np.fromiter(
                (s.prompt_len + s.output_len for s in seqs), dtype=np.int64, count=len(seqs)
            )
            self.cost.bind_final(self._stretch_final)
            yield from super()._decode_stretch(seqs)

        def _commit_stretch(self, seqs, ctx, alloc, times, ends, start, end, k):
            c = ctx[None, :] + np.arange(k, dtype=np.int64)[:, None]
            self._account(np.ones_like(c), c, self._stretch_final)
            super()._commit_stretch(seqs, ctx, alloc, times, ends, start, end, k)

        # ---- counters ------------------------------------------------------------------
        def _account(self, q, c, final):
            """Bytes over the link and quality proxies of iterations that ran (k x b arrays)."""
            tot = self.shared.totals
            f = np.broadcast_to(final[None, :], c.shape)
            st = self.cost.stages(q, c, np.ones_like(q), f)
            tot["loaded_bytes"] += float(st.load_bytes.sum() - self.cost.offloaded_weight_bytes * st.load_bytes.size)
            tot["stored_bytes"] += float(st.store_bytes.sum())
            dec = q == 1
            if dec.any():
                p = self.policy.proxies(c[dec], f[dec])
                tot["decode_tokens"] += float(dec.sum())
                tot["kv_size_sum"] += float(p["relative_kv_size"].sum())
                tot["mass_sum"] += float(p["attention_mass"].sum())

        def report(self, extra: dict) -> None:
            sh = self.shared
            tot = sh.totals
            n = max(tot["decode_tokens"], 1.0)
            extra["offload"] = {
                **sh.setup.describe(),
                "memory": sh.plan.summary(),
                "kv_loaded_gb": tot["loaded_bytes"] / 1e9,
                "kv_stored_gb": tot["stored_bytes"] / 1e9,
                "decode_tokens": int(tot["decode_tokens"]),
                # quality proxies, not accuracy: see docs/offload.md
                "relative_kv_size": tot["kv_size_sum"] / n,
                "attention_mass_kept": tot["mass_sum"] / n,
            }

    return OffloadReplica


def offload_memory_plan(sim):
    """The engine MemoryPlan of an offloading simulation (the KV pool in host memory).

    Meant for a hook in `Simulation.__init__` (`self.memory = offload_memory_plan(self)` in
    place of `plan_memory(...)` when `spec.offload` is set), so that a model whose weights do
    not all fit the GPU (`weights_gpu_percent` < 100) is not rejected by the GPU-only plan.
    Until then the replicas install the same plan when they are built."""
    return _shared(sim, sim.spec.offload).plan.engine_plan()
