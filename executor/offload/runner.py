"""One offloaded forward pass of a continuous batch: the KV cache lives in a host pool, and
each layer of each iteration copies the tokens the KV policy selects into a device working
buffer, attends over them plus the iteration's new tokens, and stores the new K/V back.

The host pool is a `PagedKVCache` whose blocks sit in host memory (pinned on CUDA): the
engine's block accounting (admission, watermark, recompute) is unchanged, only the storage
moved. Per layer there is one load (a gather of every decoding sequence's selected slots, all
KV heads, K and V) and one store (a scatter of every new token's K/V), so a layer's host
traffic is one copy each way, as the simulator's `OffloadCostModel` prices it
(latency + bytes / rate per layer).

Policies are executor/offload/policies.py's objects (the simulator's parameters and budget /
cap rules), one per sequence (batch 1), started when the sequence prefills from position 0:

  prefill  full causal attention over the prompt (nothing cached to load), `after_prefill`,
           then the K/V the policy keeps are stored (H2O: its budget; others: all)
  decode   `kv_select` (InfiniGen: from the prediction made at layer i-1), load, attend over
           the loaded tokens + the current one, `observe` (H2O's accumulated attention), store

Timing: on CPU the copies are real memcpys timed with perf_counter; on CUDA they run on a
side stream from a pinned staging buffer (non-blocking H2D), with events: the compute stream
waits for layer i's load right before layer i's attention, and the load of layer i+1 is issued
as `overlap` says (none: right before its attention; ffn: after layer i's attention; layer: at
the start of layer i) — the simulator's three pipelines."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from infersim.simulator.errors import InfersimError

from .model import DenseLlama, causal_mask
from .policies import build_kv_policy


@dataclass
class SeqState:
    policy: object
    final_tokens: int


@dataclass
class Loaded:
    """One sequence's loaded K/V of one layer: [1, Hkv, k, d] each, the valid mask [1, Hkv, k]
    and the positions [Hkv, k] (for scattering probabilities back)."""

    k: torch.Tensor
    v: torch.Tensor
    valid: torch.Tensor
    pos: torch.Tensor


@dataclass
class IterationRecord:
    """What one iteration moved: per layer the loaded and stored tokens (summed over the batch,
    counted per KV head / kv_heads: whole-token equivalents) and bytes, and the copy times."""

    loaded_tokens: np.ndarray
    stored_tokens: np.ndarray
    loaded_bytes: float = 0.0
    stored_bytes: float = 0.0
    load_s: float = 0.0
    store_s: float = 0.0
    # per decoding sequence and layer: (context, layer, InfiniGen's predicted count before the
    # cap or NaN, tokens loaded per KV head)
    counts: list = field(default_factory=list)


class OffloadRunner:
    """`forward(plan, cache)` with the engine's BatchPlan; the engine hands it the batch
    (`begin(batch)`) since the plan carries no sequence objects."""

    def __init__(self, loaded, pool, policy: str, params: dict | None, *, overlap: str = "none", skew=None):
        self.m = DenseLlama(loaded)
        self.pool = pool
        self.policy_name, self.params, self.skew = policy, dict(params or {}), skew
        self.overlap = overlap
        self.device = loaded.device
        self.cuda = self.device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(device=self.device) if self.cuda else None
        s = self.m.shape
        self.elem = pool._k.element_size()
        self.token_layer_bytes = 2 * s.kv_heads * s.head_dim * self.elem  # K and V of one token in one layer
        self.states: dict[int, SeqState] = {}
        self.batch = None
        self.record: IterationRecord | None = None
        self._copy_events: list = []  # CUDA (start, end) events of this iteration's loads
        build_kv_policy(policy, params, skew)  # bad names / params fail before serving

    # ---- sequences ---------------------------------------------------------------------------
    def begin(self, batch) -> None:
        self.batch = batch

    def release(self, rid: int) -> None:
        self.states.pop(rid, None)

    def _start(self, seq) -> SeqState:
        final = int(seq.prompt_len + seq.output_len)
        pol = build_kv_policy(self.policy_name, self.params, self.skew)
        pol.start(self.m, 1, final + 1, final)
        st = self.states[seq.rid] = SeqState(pol, final)
        return st

    # ---- copies --------------------------------------------------------------------------------
    def _slots(self, seq, positions: torch.Tensor) -> torch.Tensor:
        bs = self.pool.block_size
        bt = torch.as_tensor(seq.block_table, dtype=torch.long)
        return bt[positions // bs] * bs + positions % bs

    def _load(self, i: int, decodes: list) -> dict[int, Loaded]:
        """Layer i's load for the decoding sequences [(j, seq, pos)]: one gather of all selected
        slots from the host pool into the device buffer."""
        if not decodes:
            return {}
        s = self.m.shape
        idx, pos_l, valid_l, sizes = [], [], [], []
        for j, seq, pos in decodes:
            pol = self.states[seq.rid].policy
            n0 = len(pol.predicted_counts[i]) if hasattr(pol, "predicted_counts") else 0
            sel = pol.kv_select(i, pos, None)  # [1, Hkv, pos] bool or None (all); true scores are never read
            raw = float("nan")
            if hasattr(pol, "predicted_counts") and len(pol.predicted_counts[i]) > n0:
                raw = pol.predicted_counts[i][-1]  # InfiniGen's count above max - alpha, before the cap
            if sel is None:
                p = torch.arange(pos).expand(s.kv_heads, pos)
                ok = torch.ones(s.kv_heads, pos, dtype=torch.bool)
            else:
                sel = sel[0].cpu()
                cnt = sel.sum(dim=-1)
                kmax = int(cnt.max()) if pos else 0
                # each head's selected positions first, in order (a stable sort of ~sel)
                order = torch.sort((~sel).to(torch.int8), dim=-1, stable=True).indices[:, :kmax]
                p = order
                ok = torch.arange(kmax)[None, :] < cnt[:, None]
            pos_l.append(p)
            valid_l.append(ok)
            self.record.counts.append((pos, i, raw, float(ok.sum()) / s.kv_heads))
            idx.append(self._slots(seq, p))
            sizes.append(p.shape[1])
        slots = torch.cat(idx, dim=1)  # [Hkv, K]
        heads = torch.arange(s.kv_heads)[:, None]
        nvalid = float(sum(int(v.sum()) for v in valid_l))
        rec = self.record
        rec.loaded_tokens[i] += nvalid / s.kv_heads
        rec.loaded_bytes += nvalid * s.head_dim * self.elem * 2
        kf, vf = self.pool.flat(i)  # [slots, Hkv, d] in host memory
        t = time.perf_counter()
        if self.cuda:
            kh, vh = kf[slots, heads].pin_memory(), vf[slots, heads].pin_memory()  # gather on the host
            cur = torch.cuda.current_stream(self.device)
            with torch.cuda.stream(self.copy_stream):
                t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0.record(self.copy_stream)
                kd, vd = kh.to(self.device, non_blocking=True), vh.to(self.device, non_blocking=True)
                t1.record(self.copy_stream)
            kd.record_stream(cur)  # allocated on the copy stream, read on the compute stream
            vd.record_stream(cur)
            cur.wait_event(t1)  # layer i's attention waits for its load
            self._copy_events.append((t0, t1))
        else:
            kd, vd = kf[slots, heads], vf[slots, heads]  # the gather is the copy: [Hkv, K, d]
        # CPU: the gather is the copy, timed here; CUDA: host gather + issue here, the H2D copy
        # itself by its events (added in finish())
        rec.load_s += time.perf_counter() - t
        out, off = {}, 0
        for (j, _, _), n, p, ok in zip(decodes, sizes, pos_l, valid_l):
            out[j] = Loaded(kd[None, :, off : off + n], vd[None, :, off : off + n], ok[None].to(self.device), p)
            off += n
        return out

    def _store(self, i: int, items: list) -> None:
        """Layer i's store: [(seq, positions [n], k [Hkv, n, d], v, keep [Hkv, n] bool or None)]
        scattered into the host pool in one copy per tensor."""
        if not items:
            return
        s = self.m.shape
        slot_l, head_l, kk, vv = [], [], [], []
        for seq, positions, k, v, keep in items:
            sl = self._slots(seq, positions)  # [n]
            if keep is None:
                keep = torch.ones(s.kv_heads, sl.numel(), dtype=torch.bool)
            h, c = torch.nonzero(keep.cpu(), as_tuple=True)
            slot_l.append(sl[c])
            head_l.append(h)
            kk.append(k[h.to(k.device), c.to(k.device)])
            vv.append(v[h.to(v.device), c.to(v.device)])
        slots, heads = torch.cat(slot_l), torch.cat(head_l)
        kn, vn = torch.cat(kk), torch.cat(vv)  # [n, d]
        rec = self.record
        n = float(slots.numel())
        rec.stored_tokens[i] += n / s.kv_heads
        rec.stored_bytes += n * s.head_dim * self.elem * 2
        kf, vf = self.pool.flat(i)
        t = time.perf_counter()
        if self.cuda:
            with torch.cuda.stream(self.copy_stream):
                self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
                kh, vh = kn.to("cpu", non_blocking=True), vn.to("cpu", non_blocking=True)
            self.copy_stream.synchronize()
            kf[slots, heads], vf[slots, heads] = kh, vh
        else:
            kf[slots, heads], vf[slots, heads] = kn, vn
        rec.store_s += time.perf_counter() - t

    # ---- the forward pass ------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, plan, cache) -> torch.Tensor:
        batch = self.batch
        if batch is None or len(batch) != len(plan.q_lens):
            raise RuntimeError("OffloadRunner.forward needs the engine's batch (begin(batch))")
        m, s = self.m, self.m.shape
        self.record = IterationRecord(np.zeros(s.layers), np.zeros(s.layers))
        self._copy_events = []
        ids, positions = plan.input_ids[None], plan.positions[None]
        h = m.embed(ids)
        cos, sin = m.rope(h, positions)
        offs = np.concatenate(([0], np.cumsum(plan.q_lens)))
        decodes, prefills = [], []
        for j, ((seq, q), c) in enumerate(zip(batch, plan.ctx_lens)):
            if q == 1 and c > 0:
                decodes.append((j, seq, int(c)))
            elif c == 0:
                self._start(seq)
                prefills.append(j)
            else:
                raise InfersimError(
                    "the offload executor prefills whole prompts: chunked prefill (a prompt "
                    "continued at a later iteration) is not supported; set "
                    "serving.chunked_prefill: false"
                )
        predicting = any(getattr(self.states[seq.rid].policy, "predicts", False) for _, seq, _ in decodes)
        loads = {0: self._load(0, decodes)} if self.overlap != "none" else {}
        for i in range(s.layers):
            normed = m.input_norm(i, h)
            q, k, v = m.qkv(i, normed, cos, sin)
            if predicting:
                # InfiniGen speculates layer i+1's tokens from layer i's input (as evaluate.py)
                for j, seq, pos in decodes:
                    pol = self.states[seq.rid].policy
                    rows = slice(int(offs[j]), int(offs[j + 1]))
                    if i == 0:
                        pol.predict(0, h[:, rows], cos[:, rows], sin[:, rows], pos)
                    if i + 1 < s.layers:
                        pol.predict(i + 1, h[:, rows], cos[:, rows], sin[:, rows], pos)
            if self.overlap == "layer" and i + 1 < s.layers:
                loads[i + 1] = self._load(i + 1, decodes)  # overlaps all of layer i
            cur = loads.pop(i) if i in loads else self._load(i, decodes)
            outs, stores = [], []
            for j, (seq, qn) in enumerate(batch):
                r0, r1 = int(offs[j]), int(offs[j + 1])
                qj, kj, vj = q[:, :, r0:r1], k[:, :, r0:r1], v[:, :, r0:r1]
                pol = self.states[seq.rid].policy
                if j in cur:
                    pos = int(plan.ctx_lens[j])
                    kj, vj = pol.store(i, kj, vj, pos)
                    ld = cur[j]
                    keys, vals = torch.cat([ld.k, kj], dim=2), torch.cat([ld.v, vj], dim=2)
                    ok = torch.cat(
                        [ld.valid, torch.ones(1, s.kv_heads, 1, dtype=torch.bool, device=self.device)], dim=2
                    )
                    mask = m.expand_kv(ok)[:, :, None, :]
                    out, p = m.attend(m.scores(qj, keys), mask, vals)
                    # the probabilities at their positions (H2O accumulates them per position)
                    full = torch.zeros(1, s.heads, 1, pos + 1, dtype=p.dtype, device=p.device)
                    posx = m.expand_kv(ld.pos[None].to(p.device))[:, :, None, :]
                    full[..., :pos].scatter_add_(-1, posx, p[..., :-1] * mask[..., :-1])
                    full[..., pos] = p[..., -1]
                    sel = torch.zeros(1, s.heads, 1, pos + 1, dtype=torch.bool, device=p.device)
                    sel[..., :pos].scatter_(-1, posx, mask[..., :-1])
                    sel[..., pos] = True
                    pol.observe(i, pos, full, sel)
                    stores.append((seq, torch.tensor([pos]), kj[0], vj[0], None))
                else:
                    P = r1 - r0
                    kj, vj = pol.store(i, kj, vj, 0)
                    out, probs = m.attend(m.scores(qj, kj), causal_mask(P, self.device)[None, None], vj)
                    pol.after_prefill(i, qj, kj, probs)
                    keep = pol.held[i, 0, :, :P] if hasattr(pol, "held") else None  # H2O keeps its budget
                    stores.append((seq, torch.arange(P), kj[0], vj[0], keep))
                outs.append(out)
            if self.overlap == "ffn" and i + 1 < s.layers:
                loads[i + 1] = self._load(i + 1, decodes)  # under layer i's FFN
            h = m.finish_layer(i, h, torch.cat(outs, dim=2))
            self._store(i, stores)
        return m.logits(h[0, plan.logit_rows])

    def finish(self) -> None:
        """After the engine synchronised the iteration: add the CUDA copies' own durations."""
        for t0, t1 in getattr(self, "_copy_events", []):
            self.record.load_s += t0.elapsed_time(t1) * 1e-3
        self._copy_events = []


__all__ = ["IterationRecord", "OffloadRunner"]
