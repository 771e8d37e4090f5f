"""What proposes candidate tokens, what that costs and how many the target accepts: draft
models (one SSM, or several under the majority vote) and Medusa heads. Used by the replicas;
no SimPy here.

Common interface (per round, for the decoding sequences of a batch):
  plan(remaining)         -> k: drafted tokens per sequence (never more than remaining - 1)
  candidates(k)           -> q: tokens each sequence feeds the verification pass
  tokens_for(remaining)   -> q for one sequence, for the scheduler's KV lookahead
  draft_time_s(ctx, k)    -> the proposer's own time before verification (SSM steps)
  draft_prefill_time_s(q, ctx, logits, alongside) -> SSM prefill of newly admitted prompts
                             (alongside: the sequences the SSMs decode in the same first step)
  extra_time_s(n, tokens) -> time added to the verification pass (Medusa heads)
  accept(rng, k, rids)    -> (accepted candidates, voted SSM or -1, accepted / k); rids (request
                             ids, optional) give per-request acceptance models each request's level
  feedback(t, vl, voted, rates) -> the policies learn (selector, SSM weights)"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..costmodel import BatchShape, build_cost_model
from ..errors import InfersimError
from ..hardware.catalog import load_hardware
from ..models.catalog import load_model
from ..models.dtypes import bytes_per_element, normalize_dtype
from .acceptance import AcceptanceModel, resolve_model
from .config import AcceptanceRef, SpeculationSection
from .medusa_heads import load_accuracies
from .medusa_tree import (
    EmpiricalTreeSampler,
    TreeSampler,
    cartesian_tree,
    choices_tree,
    greedy_tree,
    head_params,
    heads_time_s,
    restrict,
)
from .minions import SSMWeights, draw_agreement_lengths, vote_agreement
from .sampling import convert_rank_accuracies
from .selector import AdaptiveLengthSelector

_GOLDEN = (5**0.5 - 1) / 2  # spreads k * _GOLDEN mod 1 most evenly for every k (three-distance theorem)


def level_offset(seed: int) -> float:
    return float(np.random.default_rng([int(seed) & 0xFFFFFFFF, 0xACC1]).random())


def request_levels(offset: float, rids) -> np.ndarray:
    """Each request's acceptance level in [0, 1) for per-request models: frac(offset + rid *
    (golden ratio - 1)), a Weyl sequence. A function of (seed, request id) only, so it does not
    depend on the order requests are drafted in (step and event-jumping modes agree) and the
    rounds' random stream is untouched; consecutive requests' levels spread evenly over [0, 1),
    so a run of a few dozen requests sees each component in its proportion (independent
    uniform levels left a 32-request run's mean acceptance several percent off by chance)."""
    return np.mod(float(offset) + np.asarray(rids, dtype=np.float64) * _GOLDEN, 1.0)


class StratifiedDraws:
    """Per-request low-discrepancy uniforms for replaying a recorded run: request r's n-th draw
    is frac(offset + r x (sqrt 2 - 1) + n x golden), so a request's draws over its rounds cover
    [0, 1) evenly and its simulated acceptance lands close to its component's (error O(1/n)
    rounds instead of O(1/sqrt n)). `on=False`: independent uniforms from the rng."""

    def __init__(self, seed: int, on: bool):
        self.on = bool(on)
        self._offset = level_offset(int(seed) + 1)
        self._count: dict[int, int] = {}

    def uniforms(self, rng: np.random.Generator, rids, n: int) -> np.ndarray:
        if not self.on or rids is None:
            return rng.random(n)
        out = np.empty(n)
        for i, r in enumerate(rids):
            c = self._count.get(int(r), 0)
            self._count[int(r)] = c + 1
            # the request's start point along another irrational than the sequence's step, so
            # request r + 1's sequence is not request r's shifted by one round
            out[i] = (self._offset + int(r) * (2**0.5 - 1) + c * _GOLDEN) % 1.0
        return out


@dataclass
class Draft:
    name: str
    model: object
    cost: object
    acceptance: AcceptanceModel


def _cost_key(model, hw, dtype, tp):
    return (model.name, hw.name, dtype, tp)


class DraftProposer:
    kind = "draft"

    def __init__(self, cfg: SpeculationSection, sim):
        self.cfg = cfg
        sv = sim.spec.serving
        dtype = normalize_dtype(sv.dtype)
        self.same_device = cfg.draft_hardware is None
        hw = sim.hardware if cfg.draft_hardware is None else load_hardware(cfg.draft_hardware)
        self.hardware = hw
        # draft steps run inside the target's engine iteration: kernels only, plus the section's
        # own draft_step_overhead_us (the engine overhead is paid once, by the target's step)
        hw = hw.model_copy(update={"overheads": hw.overheads.kernels_only()})
        drafts = cfg.drafts if cfg.voting_on else cfg.drafts[:1]
        cache: dict = {}
        self.drafts: list[Draft] = []
        mode, temp = cfg.sampling.mode, cfg.sampling.temperature
        for d in drafts:
            model = load_model(d.model)
            key = _cost_key(model, hw, dtype, cfg.draft_tensor_parallel)
            if key not in cache:
                cache[key] = build_cost_model(
                    sv.cost_model,
                    model,
                    hw,
                    dtype=dtype,
                    kv_dtype=sim.kv_dtype,
                    tensor_parallel=cfg.draft_tensor_parallel,
                )
            acc = resolve_model(d.acceptance, cfg.dataset, mode, temp)
            name = d.name or (d.acceptance.draft if isinstance(d.acceptance, AcceptanceRef) else d.model)
            self.drafts.append(Draft(name, model, cache[key], acc))
        self.names = [d.name for d in self.drafts]
        self.voting = cfg.voting_on
        v = cfg.voting
        self.weights = SSMWeights(
            np.array([d.weight for d in drafts], dtype=np.float64),
            v.reward_threshold,
            v.punish_threshold,
            v.reward_factor,
            v.punish_factor,
            v.threshold_mode,
            v.ema,
        )
        self.correlation = v.correlation
        self.acr_scope = v.acr_scope
        sc = cfg.selector
        self.selector = AdaptiveLengthSelector.from_section(cfg) if cfg.selector_on else None
        self.s_fixed = int(cfg.speculation_length)
        self.s_cap = max(self.s_fixed, sc.s_max if self.selector else self.s_fixed)
        self.step_overhead_s = cfg.draft_step_overhead_us * 1e-6
        # per-request acceptance (mixture): one level per request, a function of (seed, request
        # id) only, so it does not depend on the order requests are drafted in (step and
        # event-jumping modes agree) and the rounds' random stream is untouched
        self.per_request = any(d.acceptance.per_request for d in self.drafts)
        self._level_offset = level_offset(sim.spec.seed)
        # stratified draws (a mixture replaying a recorded run): request r's n-th round draws
        # u = frac(offset_r + n * golden) instead of an independent uniform
        self.stratified = any(getattr(d.acceptance, "stratified", False) for d in self.drafts)
        self._draws = StratifiedDraws(sim.spec.seed, self.stratified)

    # ---- lengths ------------------------------------------------------------------------
    @property
    def s(self) -> int:
        return self.selector.s if self.selector is not None else self.s_fixed

    def plan(self, remaining: np.ndarray) -> np.ndarray:
        return np.clip(np.minimum(self.s, np.asarray(remaining, dtype=np.int64) - 1), 0, None)

    def candidates(self, k: np.ndarray) -> np.ndarray:
        return np.asarray(k, dtype=np.int64) + 1

    def tokens_for(self, remaining: int) -> int:
        return 1 + max(0, min(self.s, int(remaining) - 1))

    # ---- costs --------------------------------------------------------------------------
    def draft_time_s(self, ctx: np.ndarray, k: np.ndarray) -> float:
        """Each SSM decodes k_i tokens autoregressively for every sequence: step j runs the
        sequences with k_i > j at context ctx_i + j. Several SSMs share the device: their
        roofline times add up (they compete for the same bandwidth and FLOP/s), while the fixed
        per-step overhead (kernel launches, sampling: idle GPU time) is paid once per step, as
        when the SSMs run concurrently (Minions runs them under MPS)."""
        ctx = np.asarray(ctx, dtype=np.int64)
        k = np.asarray(k, dtype=np.int64)
        if ctx.size == 0 or k.max(initial=0) <= 0:
            return 0.0
        kmax = int(k.max())
        total = 0.0
        seen: dict = {}
        for d in self.drafts:
            key = id(d.cost)
            if key not in seen:
                if (k == kmax).all():
                    t = float(np.sum(d.cost.decode_step_times_s(ctx, kmax)))
                else:
                    t = 0.0
                    for j in range(kmax):
                        sel = k > j
                        t += d.cost.iteration_time_s(BatchShape.decode(ctx[sel] + j))
                seen[key] = t
            total += seen[key]
        return total + kmax * self.step_overhead_s

    def draft_overhead_s(self, k: np.ndarray) -> float:
        """The fixed per-step part of draft_time_s (kernel launches, sampling, framework): host
        time during which the SSM engine issues no GPU work. On a GPU shared with the LLM
        (pipelined, MPS-like) the LLM keeps the whole GPU during it, so the pipeline charges
        contention only for draft_time_s - draft_overhead_s."""
        k = np.asarray(k, dtype=np.int64)
        if k.size == 0 or k.max(initial=0) <= 0:
            return 0.0
        return int(k.max()) * self.step_overhead_s

    def draft_prefill_time_s(self, q: np.ndarray, ctx: np.ndarray, logits: np.ndarray, alongside: int = 0) -> float:
        q = np.asarray(q, dtype=np.int64)
        if q.size == 0:
            return 0.0
        shape = BatchShape(
            q, np.asarray(ctx, dtype=np.int64), np.asarray(logits, dtype=np.int64), alongside=int(alongside)
        )
        return float(sum(d.cost.iteration_time_s(shape) for d in self.drafts))

    def extra_time_s(self, n_seqs: int, tokens: int) -> float:
        return 0.0

    # ---- acceptance ------------------------------------------------------------------------
    def request_levels(self, rids) -> np.ndarray:
        """Each request's level; a mixture that assigns requests to components (a replayed run's
        requests by id) overrides it for those (every SSM shares the level, as below)."""
        levels = request_levels(self._level_offset, rids)
        for d in self.drafts:
            if getattr(d.acceptance, "assigned", None):
                return d.acceptance.assigned_levels(rids, levels)
        return levels

    def accept(self, rng: np.random.Generator, k: np.ndarray, rids=None):
        """(accepted, voted SSM or -1, accepted / k, every SSM's agreement length or None).
        rids: the rounds' request ids (used by per-request acceptance models only)."""
        k = np.asarray(k, dtype=np.int64)
        n = k.size
        if n == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), None
        models = [d.acceptance for d in self.drafts]
        levels = self.request_levels(rids) if (self.per_request and rids is not None) else None
        lengths = None
        if len(models) == 1:
            if levels is None:
                acc = models[0].sample(rng, k, n)
            else:
                acc = models[0].from_uniform_at(self._draws.uniforms(rng, rids, n), k, levels)
            voted = np.zeros(n, dtype=np.int64)
        else:
            if levels is None:
                lengths = draw_agreement_lengths(rng, models, k, n, self.correlation)
            else:  # as draw_agreement_lengths, every SSM at the request's level
                shared, own, same = (
                    self._draws.uniforms(rng, rids, n),
                    rng.random((n, len(models))),
                    rng.random(n) < self.correlation,
                )
                u = np.where(same[:, None], shared[:, None], own)
                lengths = np.stack([m.from_uniform_at(u[:, j], k, levels) for j, m in enumerate(models)], axis=1)
            # ties (common while weights are equal) go to a random SSM, not to the first listed
            voted = vote_agreement(lengths, self.weights.weights, k, rng.random((n, len(models))))
            acc = lengths[np.arange(n), voted]
        rates = np.divide(acc, k, out=np.zeros(n), where=k > 0)
        voted = np.where(k > 0, voted, -1)
        return acc, voted, rates, lengths

    def feedback(
        self, t: float, vl: float, voted: np.ndarray, rates: np.ndarray, lengths=None, k=None, acc=None
    ) -> tuple[bool, bool]:
        """(s changed, weights updated)."""
        changed = self.selector.observe(t, vl) if self.selector is not None else False
        updated = False
        if self.voting:
            sel = voted >= 0
            if sel.any():
                if self.acr_scope == "all" and lengths is not None:
                    kk = np.asarray(k)[sel][:, None]
                    seen = np.minimum(np.asarray(lengths)[sel], np.asarray(acc)[sel][:, None] + 1)
                    self.weights.update_all(np.minimum(seen, kk) / kk)
                else:
                    self.weights.update(voted[sel], rates[sel])
                updated = True
        return changed, updated

    # ---- memory ----------------------------------------------------------------------------------
    def weight_bytes(self, dtype: str) -> float:
        return float(sum(d.model.weight_bytes_per_gpu(self.cfg.draft_tensor_parallel, dtype) for d in self.drafts))

    def kv_bytes_per_token(self, dtype: str) -> float:
        return float(
            sum(d.model.bytes_kv_per_token_per_gpu(self.cfg.draft_tensor_parallel, dtype) for d in self.drafts)
        )

    def describe(self) -> dict:
        return {
            "drafts": [
                {"name": d.name, "model": d.model.name, "acceptance": d.acceptance.describe()} for d in self.drafts
            ]
        }


class MedusaProposer:
    kind = "medusa"

    def __init__(self, cfg: SpeculationSection, sim):
        self.cfg = cfg
        mc = cfg.medusa
        self.table = load_accuracies(mc.accuracies)
        acc = self.table.rank_accuracies()
        self.heads = min(mc.heads or acc.shape[0], acc.shape[0])
        acc = acc[: self.heads]
        smp = cfg.sampling
        ra = convert_rank_accuracies(acc, smp.mode, smp.temperature, smp.epsilon, smp.delta)
        self.acc, self.extra = ra.acc, ra.extra
        top_k = acc.shape[1]
        tc = mc.tree
        if tc.type == "choices":
            tree = choices_tree(tc.choices if tc.choices is not None else self.table.tree)
            self.tree_name = "choices" if tc.choices is not None else (self.table.tree_name or "table tree")
        elif tc.type == "cartesian":
            tree = cartesian_tree(tc.sizes)
            self.tree_name = "cartesian " + "x".join(str(s) for s in tc.sizes)
        else:
            tree = greedy_tree(self.acc, tc.nodes)
            self.tree_name = f"greedy {tc.nodes}"
        self.tree = restrict(tree, self.heads, top_k)
        if not self.tree:
            raise InfersimError("the Medusa tree is empty for these heads")
        self.sampler = TreeSampler(self.tree, self.acc, self.extra)
        self.acceptance_source = "independent heads (accuracies)"
        if mc.acceptance is not None:  # an empirical distribution recorded on one tree
            recorded = sorted(tuple(int(i) for i in p) for p in mc.acceptance.tree)
            if recorded != sorted(tuple(p) for p in self.tree):
                raise InfersimError(
                    "speculation.medusa.acceptance: recorded on another tree than the one "
                    "simulated (medusa.tree / the accuracy table's tree, restricted to the heads); "
                    "give medusa.tree {type: choices, choices: <acceptance.tree>}"
                )
            self.sampler = EmpiricalTreeSampler(
                np.asarray(mc.acceptance.counts, dtype=np.float64),
                mc.acceptance.components,
                mc.acceptance.weights,
                mc.acceptance.assignment,
            )
            self.acceptance_source = "empirical accepted depths" + (
                f" ({mc.acceptance.source})" if mc.acceptance.source else ""
            )
        self.nodes = len(self.tree) + 1
        self.depth = self.sampler.depth
        self._level_offset = level_offset(sim.spec.seed)
        self._draws = StratifiedDraws(sim.spec.seed, mc.acceptance is not None and mc.acceptance.draws == "stratified")
        self.model, self.hardware = sim.model, sim.hardware
        self.dtype = normalize_dtype(sim.spec.serving.dtype)
        self.tp = sim.spec.hardware.tensor_parallel
        self.selector = None
        self.voting = False
        self.names = []
        self.weights = None

    @property
    def s(self) -> int:
        return self.depth

    def plan(self, remaining: np.ndarray) -> np.ndarray:
        return np.where(np.asarray(remaining) > 1, self.depth, 0).astype(np.int64)

    def candidates(self, k: np.ndarray) -> np.ndarray:
        return np.where(np.asarray(k) > 0, self.nodes, 1).astype(np.int64)

    def tokens_for(self, remaining: int) -> int:
        return self.nodes if remaining > 1 else 1

    def draft_time_s(self, ctx, k) -> float:
        return 0.0

    def draft_overhead_s(self, k) -> float:
        return 0.0

    def draft_prefill_time_s(self, q, ctx, logits, alongside: int = 0) -> float:
        return 0.0

    def extra_time_s(self, n_seqs: int, tokens: int) -> float:
        if not self.cfg.medusa.head_cost or n_seqs == 0:
            return 0.0
        on = tokens if self.cfg.medusa.heads_on_all_candidates else n_seqs
        return heads_time_s(self.model, self.hardware, self.heads, int(on), self.dtype, self.tp)

    def accept(self, rng, k, rids=None):
        k = np.asarray(k, dtype=np.int64)
        if getattr(self.sampler, "per_request", False) and rids is not None:
            levels = self.sampler.assigned_levels(rids, request_levels(self._level_offset, rids))
            d = self.sampler.sample(rng, k.size, levels, u=self._draws.uniforms(rng, rids, k.size))
        else:
            d = self.sampler.sample(rng, k.size)
        acc = np.where(k > 0, np.minimum(d, k), 0)
        rates = np.divide(acc, k, out=np.zeros(k.size), where=k > 0)
        return acc, np.full(k.size, -1, dtype=np.int64), rates, None

    def feedback(self, t, vl, voted, rates, lengths=None, k=None, acc=None):
        return False, False

    def weight_bytes(self, dtype: str) -> float:
        return self.heads * head_params(self.model) * bytes_per_element(dtype) / self.tp

    def kv_bytes_per_token(self, dtype: str) -> float:
        return 0.0

    def describe(self) -> dict:
        return {
            "accuracies": self.table.name,
            "heads": self.heads,
            "tree": self.tree_name,
            "tree_nodes": self.nodes,
            "tree_depth": self.depth,
            "typical_acceptance": self.extra is not None,
            "acceptance": self.acceptance_source,
            "expected_tokens_per_step": self.sampler.expected(),
        }


def build_proposer(cfg: SpeculationSection, sim):
    return MedusaProposer(cfg, sim) if cfg.method == "medusa" else DraftProposer(cfg, sim)
