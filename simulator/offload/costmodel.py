"""The offload cost model: one `CostModel` whose iteration time composes, layer by layer, the
roofline's compute with the host-link traffic a KV placement policy asks for.

Per layer i of an iteration (all arrays over settings, so k decode steps cost one call):

  attn_i, ffn_i   the roofline's attention-side (norm, q/k/v/o projections, KV write, QK^T,
                  softmax, PV) and FFN-side operators, with the attention over the tokens the
                  policy attends to at that layer (plus the policy's extra work, e.g. INT4
                  dequantization), and half the tensor-parallel all-reduce each
  pred_i          the prediction that chooses layer i's tokens, run at layer i-1 (InfiniGen)
  T_i             host-to-device load of layer i: loaded tokens x bytes per token, plus the
                  CPU-resident share of the layer's weights; latency + bytes / h2d rate
  S_i             device-to-host store of the iteration's new KV of layer i

and the pipeline (`overlap`), with layer 0's load overlapping only the embedding:

  ffn    block_i = attn_i + pred_{i+1} + max(ffn_i, T_{i+1}, S_i)
         FlexGen's loop with attention and MLP as separate layers: while one layer computes,
         the next one's cache loads, so layer i+1's KV loads under layer i's FFN; InfiniGen
         launches its prefetch after the attention that predicted it (Fig. 18: FFN hidden
         under the transfer, attention and prediction exposed).
  layer  block_i = pred_{i+1} + max(attn_i + ffn_i, T_{i+1}, S_i)
         the load overlaps the whole previous layer (InfiniGen Fig. 3(c)/(d)); the prediction
         comes first because the load needs its indices. With no prediction this is the
         textbook max(compute_{i-1}, transfer_i).
  none   block_i = T_i + attn_i + pred_{i+1} + ffn_i + S_i   (no overlap; InfiniGen's
         artifact runs its baselines with FlexGen's --overlap false)

  iteration = overhead + max(embed, T_0) + sum_i block_i + final norm + lm_head

With the `gpu` policy and all weights on the GPU every transfer is zero and the sum is the
roofline's own iteration time. Everything is elementwise over settings and summed over layers
in a fixed order, so `decode_step_times_s` equals stepping `iteration_time_s` bit for bit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..costmodel.base import CostModel, Direction, OperatorCost
from ..costmodel.batch import BatchShape
from ..costmodel.operators import PRE_LAYER_OPS
from ..costmodel.roofline import RooflineCostModel
from ..errors import InfersimError
from ..models.dtypes import weight_bytes_per_element
from .calibrated import HostLink, StageInputs
from .policies import PlacementPolicy, Work

ATTENTION_OPS = frozenset(
    {
        "input_norm",
        "qkv_proj",
        "q_proj",
        "k_proj",
        "v_proj",
        "rotary",
        "kv_write",
        "qk",
        "softmax",
        "pv",
        "o_proj",
        "attn_residual_add",
    }
)
MAX_ELEMENTS = 1 << 21  # per chunk of settings x sequences x layers


@dataclass
class Stages:
    """Per-layer stage times (n settings x L layers) and per-setting ends, in seconds, and the
    token/byte counts behind them."""

    attn: np.ndarray
    ffn: np.ndarray
    pred: np.ndarray  # pred[:, i]: choosing layer i's tokens, paid during layer i-1
    load: np.ndarray  # T_i
    store: np.ndarray  # S_i
    pre: np.ndarray  # embedding (+ a prediction for layer 0, if any)
    post: np.ndarray  # final norm + lm_head
    overhead: float
    loaded_tokens: np.ndarray  # (n, L) summed over the batch
    load_bytes: np.ndarray  # (n, L)
    store_bytes: np.ndarray  # (n, L)

    @property
    def num_layers(self) -> int:
        return self.attn.shape[1]


class OffloadCostModel(CostModel):
    name = "offload"

    def __init__(
        self,
        base: RooflineCostModel,
        policy: PlacementPolicy,
        *,
        overlap: str = "ffn",
        weights_gpu_fraction: float = 1.0,
        kv_store_gbps: Optional[float] = None,
        layer_overhead_us: float = 0.0,
        compute=None,
        link: Optional[HostLink] = None,
    ):
        """`compute` (an object with `stage_times(StageInputs, pred_mask) -> StageTimes`, e.g.
        calibrated.LinearStageCompute) replaces the roofline's per-layer compute stages and
        `link` (a calibrated.HostLink) the hardware profile's host link; the composition
        (overlap, loads of the policy's tokens per layer) is the same either way. `base` still
        gives the model and hardware (shapes, dtypes, the policy's extra work without `compute`)."""
        if not isinstance(base, RooflineCostModel):
            raise InfersimError(f"offload needs the roofline cost model underneath, not '{base.name}'")
        if overlap not in ("ffn", "layer", "none"):
            raise InfersimError(f"unknown offload overlap '{overlap}'; known: ffn, layer, none")
        self.base, self.policy, self.overlap = base, policy, overlap
        self.model, self.hardware = base.model, base.hardware
        self.num_layers = base.model.num_layers
        self.weights_gpu_fraction = float(weights_gpu_fraction)
        ops = base.ops
        self._attn_rows = [j for j, op in enumerate(ops) if op.scope == "layer" and op.name in ATTENTION_OPS]
        self._ffn_rows = [j for j, op in enumerate(ops) if op.scope == "layer" and op.name not in ATTENTION_OPS]
        self._pre_rows = [j for j, op in enumerate(ops) if op.scope == "model" and op.name in PRE_LAYER_OPS]
        self._post_rows = [j for j, op in enumerate(ops) if op.scope == "model" and op.name not in PRE_LAYER_OPS]
        self.layer_weight_bytes = base.model.params_per_layer() * weight_bytes_per_element(base.weight_dtype) / base.tp
        self.offloaded_weight_bytes = (1.0 - self.weights_gpu_fraction) * self.layer_weight_bytes
        hl = base.hardware.host_link
        self._lat = hl.latency_us * 1e-6
        self._h2d = hl.h2d_gbps * 1e9
        self._d2h = (kv_store_gbps or hl.d2h_gbps) * 1e9
        self._lat_store = self._lat
        self.compute, self.link = compute, link
        if link is not None:
            self._lat, self._h2d = link.h2d_latency_s, link.h2d_bytes_per_s
            self._lat_store, self._d2h = link.d2h_latency_s, link.d2h_bytes_per_s
        hw = base.hardware
        self._peak = hw.peak_flops(base.act_dtype)
        self._bw = hw.memory_bandwidth_bytes_per_s()
        self._launch = hw.overheads.kernel_launch_us * 1e-6
        self._pred_mask = policy.prediction_mask()
        self._layer_overhead = float(layer_overhead_us) * 1e-6
        self._bound_final: Optional[np.ndarray] = None

    # ---- sequence lengths the BatchShape does not carry -----------------------------------
    def bind_final(self, final_tokens) -> None:
        """Final lengths (prompt + output) of the sequences of the next call, in batch order;
        used once, by the next `iteration_time_s` or `decode_step_times_s` of that many
        sequences (H2O's budget is a fraction of them). The serving replica binds them."""
        self._bound_final = np.asarray(final_tokens, dtype=np.int64).reshape(-1)

    def _take_final(self, b: int) -> Optional[np.ndarray]:
        f, self._bound_final = self._bound_final, None
        return f if f is not None and f.size == b else None

    # ---- helpers ---------------------------------------------------------------------------
    def _link_time(self, nbytes: np.ndarray, rate: float, latency: Optional[float] = None) -> np.ndarray:
        lat = self._lat if latency is None else latency
        return np.where(nbytes > 0, lat + nbytes / rate, 0.0)

    def _work_time(self, works: list[Work]) -> np.ndarray | float:
        """Roofline time of a policy's extra work, split over the tensor-parallel group."""
        total = 0.0
        tp = self.base.tp
        for w in works:
            eff = self.hardware.efficiency_for(w.op_class)
            t = np.maximum(w.flops / tp / (self._peak * eff.compute), w.bytes / tp / (self._bw * eff.memory))
            total = total + np.where((w.flops > 0) | (w.bytes > 0), t + w.kernels * self._launch, 0.0)
        return total

    # ---- the core: stages for n settings of a batch of b sequences -------------------------
    def stages(self, q, c, lg, final=None) -> Stages:
        """q, c, lg, final: (n, b) new tokens, cached tokens, logit positions, final lengths."""
        q, c, lg = (np.atleast_2d(np.asarray(x, dtype=np.int64)) for x in (q, c, lg))
        final = c + q if final is None else np.broadcast_to(np.asarray(final, dtype=np.int64), c.shape)
        n, L, pol, base = c.shape[0], self.num_layers, self.policy, self.base
        decode = q == 1
        held = pol.held_tokens(c, final)
        att = np.where(decode[..., None], pol.attended_tokens(c, final), held[..., None])  # (n, b, L)
        qq = q[..., None]
        K = (att + qq).sum(axis=1)  # (n, L), exact integers
        P = (qq * (att + qq)).sum(axis=1)
        att_total = att.sum(axis=1)
        loaded = np.zeros_like(K) if pol.kv_on_gpu else att_total
        T = q.sum(axis=1).astype(np.float64)
        Lg = lg.sum(axis=1).astype(np.float64)
        stored = pol.stored_new_tokens(c, q, final).sum(axis=1).astype(np.float64)
        # per GPU: under tensor parallelism each GPU moves its heads' share over its own link
        tp = base.tp
        load_bytes = loaded * (pol.fetch_bytes_per_token / tp) + self.offloaded_weight_bytes
        store_bytes = np.broadcast_to((stored * (pol.store_bytes_per_token / tp))[:, None], (n, L))
        if self.compute is not None:
            x = StageInputs(
                T,
                Lg,
                K.astype(np.float64),
                P.astype(np.float64),
                att_total.astype(np.float64),
                decode.sum(axis=1).astype(np.float64),
                (~decode).sum(axis=1).astype(np.float64),
                np.where(decode, 0, q).sum(axis=1).astype(np.float64),
                np.where(decode, held, 0).sum(axis=1).astype(np.float64),
            )
            ct = self.compute.stage_times(x, self._pred_mask if pol.predicts else np.zeros(L, dtype=bool))
            pre = ct.pre + ct.pred[:, 0]  # a prediction for layer 0 has no layer before it
            return Stages(
                ct.attn,
                ct.ffn,
                ct.pred,
                self._link_time(load_bytes, self._h2d),
                self._link_time(store_bytes, self._d2h, self._lat_store),
                pre,
                ct.post,
                ct.overhead,
                loaded,
                load_bytes,
                store_bytes,
            )

        rep = np.repeat
        times = base.op_times(
            rep(T, L), P.reshape(-1).astype(np.float64), K.reshape(-1).astype(np.float64), rep(Lg, L)
        )[4]
        attn = np.zeros(n * L)
        for j in self._attn_rows:
            attn = attn + times[j]
        ffn = np.zeros(n * L)
        for j in self._ffn_rows:
            ffn = ffn + times[j]
        attn, ffn = attn.reshape(n, L), ffn.reshape(n, L)
        ar = base.allreduce_time_s(T)[:, None] * 0.5
        attn, ffn = attn + ar, ffn + ar
        attn = attn + self._work_time(pol.attention_work(att_total, T[:, None])) + self._layer_overhead
        mt = base.op_times(T, 0.0 * T, 0.0 * T, Lg)[4]
        pre = np.zeros(n)
        for j in self._pre_rows:
            pre = pre + mt[j]
        post = np.zeros(n)
        for j in self._post_rows:
            post = post + mt[j]

        pred = np.zeros((n, L))
        if pol.predicts and self._pred_mask.any():
            D = decode.sum(axis=1).astype(np.float64)[:, None]
            C = np.where(decode, held, 0).sum(axis=1).astype(np.float64)[:, None]
            Tp = np.where(decode, 0, q).sum(axis=1).astype(np.float64)[:, None]
            per = self._work_time(pol.prediction_work(D, C, Tp))
            pred = np.where(self._pred_mask[None, :], np.broadcast_to(per, (n, L)), 0.0)
            pre = pre + pred[:, 0]  # a prediction for layer 0 has no layer before it
        return Stages(
            attn,
            ffn,
            pred,
            self._link_time(load_bytes, self._h2d),
            self._link_time(store_bytes, self._d2h, self._lat_store),
            pre,
            post,
            base.iteration_overhead_s,
            loaded,
            load_bytes,
            store_bytes,
        )

    def blocks(self, st: Stages) -> tuple[np.ndarray, np.ndarray]:
        """(prologue (n,), block times (n, L)) under the overlap mode."""
        n, L = st.attn.shape
        nxt_load = np.concatenate([st.load[:, 1:], np.zeros((n, 1))], axis=1)
        nxt_pred = np.concatenate([st.pred[:, 1:], np.zeros((n, 1))], axis=1)
        if self.overlap == "ffn":
            return np.maximum(st.pre, st.load[:, 0]), st.attn + nxt_pred + np.maximum(
                np.maximum(st.ffn, nxt_load), st.store
            )
        if self.overlap == "layer":
            return np.maximum(st.pre, st.load[:, 0]), nxt_pred + np.maximum(
                np.maximum(st.attn + st.ffn, nxt_load), st.store
            )
        return st.pre, st.load + st.attn + nxt_pred + st.ffn + st.store

    def total(self, st: Stages) -> np.ndarray:
        prologue, blocks = self.blocks(st)
        t = st.overhead + prologue
        for i in range(blocks.shape[1]):  # a fixed order of additions
            t = t + blocks[:, i]
        return t + st.post

    # ---- the CostModel interface -----------------------------------------------------------
    def time_s(self, batch: BatchShape, final=None) -> float:
        fin = None if final is None else np.asarray(final, dtype=np.int64)[None, :]
        st = self.stages(batch.query_tokens[None, :], batch.context_tokens[None, :], batch.logit_tokens[None, :], fin)
        return float(self.total(st)[0])

    def iteration_time_s(self, batch: BatchShape) -> float:
        return self.time_s(batch, self._take_final(batch.num_seqs))

    def decode_step_times_s(self, context_tokens, steps: int, final_tokens=None) -> np.ndarray:
        ctx = np.asarray(context_tokens, dtype=np.int64).reshape(-1)
        b = ctx.size
        bound = self._take_final(b)
        fin = bound if final_tokens is None else np.asarray(final_tokens, dtype=np.int64).reshape(-1)
        chunk = max(1, MAX_ELEMENTS // max(1, b * self.num_layers))
        out = []
        for s0 in range(0, steps, chunk):
            j = np.arange(s0, min(steps, s0 + chunk), dtype=np.int64)[:, None]
            c = ctx[None, :] + j
            ones = np.ones_like(c)
            f = None if fin is None else np.broadcast_to(fin[None, :], c.shape)
            out.append(self.total(self.stages(ones, c, ones, f)))
        return np.concatenate(out) if out else np.zeros(0)

    def transfer_time_s(self, nbytes: float, direction: Direction) -> float:
        return self.base.transfer_time_s(nbytes, direction)

    def breakdown(self, batch: BatchShape) -> list[OperatorCost]:
        """The roofline's operators (attention ones at the layers' mean attended tokens) plus
        the offload rows: per-layer means of KV load, store and prediction time."""
        rows = []
        st = self.stages(batch.query_tokens[None, :], batch.context_tokens[None, :], batch.logit_tokens[None, :])
        t = batch.totals()
        q, c = batch.query_tokens, batch.context_tokens
        att_mean = float(c.sum()) if self.policy.kv_on_gpu else float(st.loaded_tokens[0].mean())
        scale = att_mean / max(float(c.sum()), 1.0)
        keys = float((c * scale + q).sum())
        pairs = float((q * (c * scale + q)).sum())
        f, nb, ct, mt, tm = (a[:, 0] for a in self.base.op_times(t.tokens, pairs, keys, t.logits))
        for j, op in enumerate(self.base.ops):
            cnt = self.num_layers if op.scope == "layer" else 1
            rows.append(
                OperatorCost(
                    op.name,
                    op.op_class,
                    op.scope,
                    cnt,
                    float(f[j]),
                    float(nb[j]),
                    float(ct[j]),
                    float(mt[j]),
                    float(tm[j]),
                )
            )
        L = self.num_layers
        for name, arr, nb in (("kv_load", st.load, st.load_bytes), ("kv_store", st.store, st.store_bytes)):
            rows.append(
                OperatorCost(
                    name, "communication", "layer", L, 0.0, float(nb.mean()), 0.0, float(arr.mean()), float(arr.mean())
                )
            )
        if st.pred.any():
            rows.append(OperatorCost("prediction", "attention", "layer", L, 0.0, 0.0, 0.0, 0.0, float(st.pred.mean())))
        return rows

    # ---- plots: per-layer breakdown and timeline -----------------------------------------
    def layer_breakdown(self, batch: BatchShape, final=None) -> dict[str, np.ndarray]:
        """Per layer: attention, FFN, prediction (of the next layer, paid in this block), the
        next layer's load hidden in or exposed by this block, the store, and the block time;
        `transfer_share` is the load's share of the block (InfiniGen Fig. 18's
        'data transfer')."""
        fin = None if final is None else np.asarray(final, dtype=np.int64)[None, :]
        st = self.stages(batch.query_tokens[None, :], batch.context_tokens[None, :], batch.logit_tokens[None, :], fin)
        _, blocks = self.blocks(st)
        L = st.num_layers
        # block i pays the prediction of layer i+1; it hides (or exposes) layer i+1's load,
        # except without overlap, where it carries its own
        pred = np.concatenate([st.pred[0, 1:], [0.0]])
        load = st.load[0] if self.overlap == "none" else np.concatenate([st.load[0, 1:], [0.0]])
        blk = blocks[0]
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(blk > 0, np.minimum(load, blk) / blk, 0.0)
        return {
            "layer": np.arange(L),
            "attention": st.attn[0],
            "ffn": st.ffn[0],
            "prediction": pred,
            "transfer": load,
            "store": st.store[0],
            "block": blk,
            "exposed_transfer": np.maximum(0.0, blk - st.attn[0] - st.ffn[0] - pred),
            "transfer_share": share,
            "loaded_tokens": st.loaded_tokens[0],
        }

    def timeline(self, batch: BatchShape, final=None) -> list[dict]:
        """Intervals of one iteration on three streams (compute, h2d, d2h), in the order the
        pipeline runs them; the last end equals `iteration_time_s` (the per-iteration overhead
        is the first compute interval)."""
        fin = None if final is None else np.asarray(final, dtype=np.int64)[None, :]
        st = self.stages(batch.query_tokens[None, :], batch.context_tokens[None, :], batch.logit_tokens[None, :], fin)
        a, f, p, T, S = st.attn[0], st.ffn[0], st.pred[0], st.load[0], st.store[0]
        L = st.num_layers
        ev: list[dict] = []

        def add(stream, kind, layer, start, dur):
            if dur > 0:
                ev.append({"stream": stream, "kind": kind, "layer": layer, "start": start, "end": start + dur})

        t = 0.0
        add("compute", "overhead", -1, t, st.overhead)
        t += st.overhead
        add("compute", "embedding", -1, t, float(st.pre[0]))
        if self.overlap == "none":
            t += float(st.pre[0])
            for i in range(L):
                add("h2d", "load", i, t, T[i])
                t += T[i]
                add("compute", "attention", i, t, a[i])
                t += a[i]
                if i + 1 < L:
                    add("compute", "prediction", i + 1, t, p[i + 1])
                    t += p[i + 1]
                add("compute", "ffn", i, t, f[i])
                t += f[i]
                add("d2h", "store", i, t, S[i])
                t += S[i]
        else:
            add("h2d", "load", 0, t, T[0])
            t += max(float(st.pre[0]), T[0])
            for i in range(L):
                nT = T[i + 1] if i + 1 < L else 0.0
                nP = p[i + 1] if i + 1 < L else 0.0
                if self.overlap == "ffn":
                    add("compute", "attention", i, t, a[i])
                    add("compute", "prediction", i + 1, t + a[i], nP)
                    s0 = t + a[i] + nP
                    add("compute", "ffn", i, s0, f[i])
                    add("h2d", "load", i + 1, s0, nT)
                    add("d2h", "store", i, s0, S[i])
                    t = s0 + max(f[i], nT, S[i])
                else:
                    add("compute", "prediction", i + 1, t, nP)
                    s0 = t + nP
                    add("compute", "attention", i, s0, a[i])
                    add("compute", "ffn", i, s0 + a[i], f[i])
                    add("h2d", "load", i + 1, s0, nT)
                    add("d2h", "store", i, s0, S[i])
                    t = s0 + max(a[i] + f[i], nT, S[i])
        add("compute", "lm_head", -1, t, float(st.post[0]))
        return ev

    # ---- quality proxies -------------------------------------------------------------------
    def proxies(self, context_tokens, final=None) -> dict[str, float]:
        """Mean relative KV size and attention mass kept over decoding sequences."""
        c = np.asarray(context_tokens, dtype=np.int64).reshape(-1)
        fin = None if final is None else np.asarray(final, dtype=np.int64).reshape(-1)
        p = self.policy.proxies(c, fin)
        return {k: float(np.mean(v)) for k, v in p.items()}
