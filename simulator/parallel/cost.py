"""Stage times of a placed replica, from the roofline's per-operator times.

Stage s runs its own layers, each with attention, its MLP (dense or sparse, as the model lays
out its layers: DeepSeek's leading dense layers sit on stage 0) and its two tensor-parallel
all-reduces; a sparse layer adds its routed experts. Stage 0 also embeds the tokens (adding
learned positions, where the model has them) and carries the per-iteration overhead
(scheduling happens before the first stage starts); the last stage also runs the final norm and
the LM head. Between stages the activations move: the hidden state and, for RMSNorm models, the
residual (vLLM's fused add-and-norm keeps them apart and sends both as `IntermediateTensors`),
tokens x hidden each. One batch alone takes the sum of its stage times and hand-offs; a
pipeline keeps several batches in flight (parallel/replica.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..costmodel.base import CostModel, OperatorCost
from ..costmodel.batch import BatchShape, BatchTotals
from ..costmodel.operators import PRE_LAYER_OPS
from ..costmodel.roofline import overhead_row
from ..models.dtypes import bytes_per_element
from .links import Links
from .placement import Placement


class PipelineCostModel(CostModel):
    name = "pipeline"

    def __init__(self, base, placement: Placement, source: str = ""):
        self.base, self.placement = base, placement
        self.links = Links(base, placement, source)
        n_layer = len(base.layer_ops)
        self._n_layer = n_layer
        self._kinds = base.layer_kinds
        self._sparse = placement.sparse_layers(base.model)  # per stage; the rest of its layers dense
        self._model_row = {op.name: n_layer + j for j, op in enumerate(base.model_ops)}
        tensors = 2 if base.model.norm == "rmsnorm" else 1
        self.handoff_bytes_per_token = tensors * base.model.hidden_size * bytes_per_element(base.act_dtype)
        self.iteration_overhead_s = base.iteration_overhead_s

    # ---- stage times from totals (arrays) ------------------------------------------------
    def _layer_times(self, time: np.ndarray, tokens: np.ndarray, routed_s=None) -> dict[str, np.ndarray]:
        """One layer's time by kind: what `every` layer runs (attention, its two all-reduces), a
        `dense` layer's MLP and a `sparse` layer's MLP (router, shared and routed experts; the
        routed experts priced here unless the caller gives their time per column, `routed_s`)."""
        parts = {kind: np.zeros(time.shape[1]) for kind in ("every", "dense", "sparse")}
        for row, kind in zip(time[: self._n_layer], self._kinds):  # a fixed order: identical for any n
            parts[kind] = parts[kind] + row
        parts["every"] = parts["every"] + self.links.allreduce_pair_time_s(tokens)
        if self.base.experts is not None:
            routed = self.routed_expert_time_s(tokens) if routed_s is None else routed_s
            parts["sparse"] = parts["sparse"] + routed
        return parts

    def routed_expert_time_s(self, tokens) -> np.ndarray:
        """One sparse layer's routed experts for `tokens` (every GPU of the group holds them all)."""
        return self.base.experts.expert_time_s(tokens)

    def model_parts_s(self, t: BatchTotals, routed_s=None):
        """(first, last, layer) of totals `t`: what runs before the layers (the per-iteration
        overhead, the embedding), after them (final norm, LM head), and one layer by kind
        (_layer_times), each an array of n."""
        time = self.base.op_times(t.tokens, t.score_pairs, t.keys, t.logits)[4]
        layer = self._layer_times(time, np.asarray(t.tokens, dtype=np.float64).reshape(-1), routed_s)
        first = self.iteration_overhead_s
        for name in PRE_LAYER_OPS:
            if name in self._model_row:
                first = first + time[self._model_row[name]]
        last = time[self._model_row["final_norm"]] + time[self._model_row["lm_head"]]
        return first, last, layer

    def stage_times_from_totals(self, t: BatchTotals, routed_s=None) -> np.ndarray:
        """Compute time of each stage, shape (stages, n): each stage runs its own layers, dense
        and sparse as the model lays them out."""
        first, last, layer = self.model_parts_s(t, routed_s)
        stages = []
        for s, (n, m) in enumerate(zip(self.placement.layers, self._sparse)):
            st = n * layer["every"] + (n - m) * layer["dense"] + m * layer["sparse"]
            if s == 0:
                st = st + first
            if s == self.placement.pp - 1:
                st = st + last
            stages.append(st)
        return np.vstack(stages)

    def handoff_times_from_tokens(self, tokens) -> np.ndarray:
        """Hand-off time at each stage boundary, shape (stages - 1, n)."""
        nbytes = self.handoff_bytes_per_token * np.asarray(tokens, dtype=np.float64).reshape(-1)
        if self.placement.pp == 1:
            return np.zeros((0, nbytes.size))
        return np.vstack([self.links.handoff_time_s(s, nbytes) for s in range(self.placement.pp - 1)])

    def _latency(self, t: BatchTotals, routed_s=None) -> np.ndarray:
        total = np.zeros(np.asarray(t.tokens).size)
        for row in self.stage_times_from_totals(t, routed_s):
            total = total + row
        for row in self.handoff_times_from_tokens(t.tokens):
            total = total + row
        return total

    # ---- per-operator rows (sim roofline) ----------------------------------------------------
    def stage_breakdown(self, batch: BatchShape) -> list[list[OperatorCost]]:
        """Each stage's operators for one batch, each row priced as stage_times_s prices it and
        counted over the stage's own layers: the per-iteration overhead and the embedding on
        stage 0, every layer's operators, the all-reduce pair, a sparse layer's routed parts
        (routed_rows), the final norm and LM head on the last stage, and the hand-off to the
        next stage. A stage's rows sum to its stage time plus its hand-off (to float rounding)."""
        tokens = np.array([float(batch.totals().tokens)])
        rows = self.base.breakdown(batch)
        n_ops = len(self.base.ops)
        layer_rows = rows[: self._n_layer]
        model_rows = {r.name: r for r in rows[self._n_layer : n_ops]}
        routed = self.routed_rows(float(tokens[0]), {r.name: r for r in rows[n_ops:]})
        first = [overhead_row(self.iteration_overhead_s)]
        first += [model_rows[name] for name in PRE_LAYER_OPS if name in model_rows]
        last = [model_rows["final_norm"], model_rows["lm_head"]]
        handoffs = self.handoff_times_from_tokens(tokens)[:, 0]
        out = []
        for s, (n, m) in enumerate(zip(self.placement.layers, self._sparse)):
            counts = {"every": n, "dense": n - m, "sparse": m}
            stage = first if s == 0 else []
            stage = stage + [replace(r, count=counts[k]) for r, k in zip(layer_rows, self._kinds) if counts[k]]
            if self.placement.tp > 1:
                stage.append(self._allreduce_row(tokens, n))
            stage += [replace(r, count=m) for r in routed] if m else []
            if s == self.placement.pp - 1:
                stage += last
            else:
                stage.append(self._handoff_row(s, float(tokens[0]), float(handoffs[s])))
            out.append(stage)
        return out

    def routed_rows(self, tokens: float, extra: dict[str, OperatorCost]) -> list[OperatorCost]:
        """A sparse layer's routed experts (the base model's row, every GPU holding them all), or
        none for a dense model; `extra` holds the base breakdown's rows after its operators."""
        return [extra["routed_experts"]] if "routed_experts" in extra else []

    def _allreduce_row(self, tokens: np.ndarray, layers: int) -> OperatorCost:
        """The two all-reduces of each of `layers` layers, over the node or across nodes."""
        time_s = float(self.links.allreduce_pair_time_s(tokens)[0])
        nbytes = float(self.base._ar_bytes_per_token * tokens[0])
        link = "network" if self.placement.tp_crosses_nodes else "node"
        return OperatorCost("allreduce", "communication", "layer", layers, 0.0, nbytes, 0.0, time_s, time_s, link)

    def _handoff_row(self, stage: int, tokens: float, time_s: float) -> OperatorCost:
        nbytes = self.handoff_bytes_per_token * tokens
        link = self.handoff_link(stage)
        return OperatorCost("handoff", "communication", "iteration", 1, 0.0, nbytes, 0.0, time_s, time_s, link)

    def handoff_link(self, stage: int) -> str:
        """The link from `stage` to the next: "node" (the interconnect) or "network"."""
        return "network" if self.placement.boundary_crosses_nodes(stage) else "node"

    # ---- what the engine asks -------------------------------------------------------------
    def stage_times_s(self, batch: BatchShape) -> tuple[np.ndarray, np.ndarray]:
        """(time on each stage, time of each hand-off) of one batch."""
        t = batch.totals()
        return self.stage_times_from_totals(t)[:, 0], self.handoff_times_from_tokens(t.tokens)[:, 0]

    def decode_stage_times_s(self, context_tokens, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """stage_times_s of `steps` consecutive decode steps at once, shapes (stages, steps) and
        (stages - 1, steps): the same totals and arithmetic as one by one, so identical."""
        t = self._decode_totals(context_tokens, steps)
        return self.stage_times_from_totals(t), self.handoff_times_from_tokens(t.tokens)

    @staticmethod
    def _decode_totals(context_tokens, steps: int) -> BatchTotals:
        ctx = np.asarray(context_tokens, dtype=np.int64)
        b = ctx.size
        keys = ((ctx.sum() + b) + b * np.arange(steps, dtype=np.int64)).astype(np.float64)
        bf = np.full(steps, float(b))
        return BatchTotals(bf, keys, keys, bf)

    def iteration_time_s(self, batch: BatchShape) -> float:
        """One batch through every stage with nothing else in flight."""
        return float(self._latency(batch.totals())[0])

    def decode_step_times_s(self, context_tokens, steps: int) -> np.ndarray:
        return self._latency(self._decode_totals(context_tokens, steps))

    def transfer_time_s(self, nbytes: float, direction) -> float:
        return self.base.transfer_time_s(nbytes, direction)

    def kv_transfer_time_s(self, nbytes: float, direction, copies: int = 1) -> float:
        return self.base.kv_transfer_time_s(nbytes, direction, copies)
