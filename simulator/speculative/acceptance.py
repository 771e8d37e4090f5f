"""Acceptance models: how many of a round's s drafted tokens the target accepts.

A model is its sequence of conditional acceptance probabilities c_1, c_2, ...: c_i = P(token
i accepted | tokens 1..i-1 accepted). Then P(A >= i) = c_1 ... c_i, the expected tokens per
step (accepted drafts plus the target's own bonus/correction token) are 1 + sum_i P(A >= i),
and a draw is the number of i <= s with u < P(A >= i) for one uniform u (inverse CDF), so
SSMs can share or not share their uniforms (see minions.draw_agreement_lengths).

Models are data: simulator/catalog/acceptance/<table>.yaml holds them per (target, draft,
dataset) with their source; a workload may also give one inline (config.AcceptanceSpec).
No SimPy here: the real executor can fit and use the same objects."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from pydantic import BaseModel, Field

from ..errors import InfersimError, UnknownNameError
from ..paths import catalog_dir
from ..validation import STRICT_CONFIG
from ..yamlio import load_mapping, validate
from .config import AcceptanceRef, AcceptanceSpec
from .sampling import convert_token_acceptance


class AcceptanceModel:
    """Base: subclasses give `conditional(n)`, the first n conditional probabilities."""

    kind = "base"

    def conditional(self, n: int) -> np.ndarray:
        raise NotImplementedError

    # ---- derived quantities ----------------------------------------------------------
    def survival(self, s: int) -> np.ndarray:
        """P(A >= i) for i = 1..s."""
        return np.cumprod(self.conditional(int(s))) if s > 0 else np.zeros(0)

    def pmf(self, s: int) -> np.ndarray:
        """P(A = k) for k = 0..s."""
        surv = np.concatenate(([1.0], self.survival(s), [0.0]))
        return surv[:-1] - surv[1:]

    def expected_accepted(self, s: int) -> float:
        return float(self.survival(s).sum())

    def expected_tokens(self, s: int) -> float:
        """Tokens a round of speculation length s yields on average (Minions' vl(s) + 1;
        for i.i.d. alpha: (1 - alpha^(s+1)) / (1 - alpha))."""
        return 1.0 + self.expected_accepted(s)

    def mean_acceptance_rate(self, s: int) -> float:
        """Minions' acceptance rate: accepted / speculated, averaged over rounds."""
        return self.expected_accepted(s) / s if s > 0 else 0.0

    # ---- draws ----------------------------------------------------------------------
    def from_uniform(self, u: np.ndarray, s) -> np.ndarray:
        """Accepted counts for uniforms u (one per round) and speculation lengths s (scalar or
        one per round): #{i <= s : u < P(A >= i)}."""
        u = np.asarray(u, dtype=np.float64).reshape(-1)
        s_arr = np.broadcast_to(np.asarray(s, dtype=np.int64), u.shape)
        smax = int(s_arr.max()) if s_arr.size else 0
        if smax <= 0:
            return np.zeros(u.shape, dtype=np.int64)
        surv = self.survival(smax)
        ok = u[:, None] < surv[None, :]
        ok &= np.arange(1, smax + 1)[None, :] <= s_arr[:, None]
        return ok.sum(axis=1).astype(np.int64)

    def sample(self, rng: np.random.Generator, s, n: Optional[int] = None) -> np.ndarray:
        if n is None:
            n = int(np.size(s))
        return self.from_uniform(rng.random(n), s)

    # ---- per-request levels (MixtureAcceptance overrides; others ignore the level) ---------
    per_request = False

    def from_uniform_at(self, u: np.ndarray, s, levels: Optional[np.ndarray] = None) -> np.ndarray:
        """As from_uniform, each round at its request's level (a quantile in [0, 1), drawn once
        per request): a per-request model draws from the component at that level."""
        return self.from_uniform(u, s)

    def describe(self) -> dict:
        return {"kind": self.kind, "conditional_1_to_8": [round(float(x), 4) for x in self.conditional(8)]}


class IIDAcceptance(AcceptanceModel):
    kind = "iid"

    def __init__(self, alpha: float):
        if not 0 <= alpha <= 1:
            raise InfersimError(f"acceptance alpha must lie in [0, 1], got {alpha}")
        self.alpha = float(alpha)

    def conditional(self, n: int) -> np.ndarray:
        return np.full(int(n), self.alpha)

    def expected_tokens(self, s: int) -> float:
        a = self.alpha
        return float(s + 1) if a == 1.0 else (1.0 - a ** (s + 1)) / (1.0 - a)

    def describe(self) -> dict:
        return {"kind": self.kind, "alpha": self.alpha}


class PositionalAcceptance(AcceptanceModel):
    kind = "positional"

    def __init__(self, probs: Sequence[float]):
        p = np.asarray(list(probs), dtype=np.float64)
        if p.size == 0 or np.any((p < 0) | (p > 1)):
            raise InfersimError("positional acceptance needs probabilities in [0, 1]")
        self.probs = p

    def conditional(self, n: int) -> np.ndarray:
        n = int(n)
        if n <= self.probs.size:
            return self.probs[:n].copy()
        return np.concatenate((self.probs, np.full(n - self.probs.size, self.probs[-1])))

    def describe(self) -> dict:
        return {"kind": self.kind, "probs": [round(float(x), 4) for x in self.probs]}


class EmpiricalAcceptance(PositionalAcceptance):
    """A histogram of accepted counts recorded at speculation length `recorded_s`, e.g. by the
    real executor. Conditional probabilities are its hazards S_i / S_(i-1); past recorded_s
    nothing was observed, so their geometric mean is carried on."""

    kind = "empirical"

    def __init__(self, counts: Sequence[float], recorded_s: int):
        c = np.asarray(list(counts), dtype=np.float64)
        if c.size != recorded_s + 1 or c.sum() <= 0 or np.any(c < 0):
            raise InfersimError("empirical acceptance needs recorded_s + 1 non-negative counts")
        self.counts, self.recorded_s = c, int(recorded_s)
        pmf = c / c.sum()
        surv = 1.0 - np.cumsum(pmf)[:-1]  # P(A >= i), i = 1..recorded_s
        prev = np.concatenate(([1.0], surv[:-1]))
        hazards = np.divide(surv, prev, out=np.zeros_like(surv), where=prev > 0)
        pos = hazards[hazards > 0]
        self.tail = float(np.exp(np.log(pos).mean())) if pos.size else 0.0
        super().__init__(np.concatenate((hazards, [self.tail])))

    def describe(self) -> dict:
        return {"kind": self.kind, "recorded_s": self.recorded_s, "counts": self.counts.tolist(), "tail": self.tail}


class MixtureAcceptance(AcceptanceModel):
    """Per-request acceptance: a request at level u (uniform, drawn once per request) draws all
    its rounds from component j(u) = the first j with u < W_j (W: cumulative weights of the
    components, ordered from hardest to easiest). A round of a request drawn afresh (no level)
    follows the marginal: P(A >= i) = sum_j w_j S_j(i), so expected tokens per step are the
    weighted mean of the components' — the same mean as the pooled histogram the mixture was
    fitted from, with the spread between requests kept."""

    kind = "mixture"
    per_request = True

    def __init__(
        self,
        components: Sequence[AcceptanceModel],
        weights: Sequence[float],
        order_s: int = 4,
        assignment: Optional[dict] = None,
        stratified: bool = False,
    ):
        self.stratified = bool(stratified)
        w = np.asarray(list(weights), dtype=np.float64)
        if len(components) == 0 or w.size != len(components) or np.any(w < 0) or w.sum() <= 0:
            raise InfersimError("mixture acceptance needs components and one non-negative weight each")
        # hardest first, so that a shared level means "a hard request" for every SSM
        order = np.argsort([c.expected_tokens(order_s) for c in components], kind="stable")
        self.components = [components[i] for i in order]
        self.weights = w[order] / w.sum()
        self._cum = np.cumsum(self.weights)
        self._cum[-1] = 1.0
        # request id -> the level at the middle of its component's interval (components as given,
        # mapped to their place in the hardest-first order)
        place = np.empty(len(order), dtype=np.int64)
        place[order] = np.arange(len(order))
        mid = self._cum - self.weights / 2.0
        self.assigned = {int(r): float(mid[place[int(j)]]) for r, j in (assignment or {}).items()}

    def assigned_levels(self, rids, levels: np.ndarray) -> np.ndarray:
        """`levels` with each assigned request's level replaced by its component's."""
        if not self.assigned:
            return levels
        out = np.array(levels, dtype=np.float64, copy=True)
        for i, r in enumerate(rids):
            lv = self.assigned.get(int(r))
            if lv is not None:
                out[i] = lv
        return out

    def component_index(self, levels) -> np.ndarray:
        lv = np.asarray(levels, dtype=np.float64).reshape(-1)
        return np.minimum(np.searchsorted(self._cum, lv, side="right"), len(self.components) - 1)

    def survival(self, s: int) -> np.ndarray:
        if s <= 0:
            return np.zeros(0)
        return np.sum([w * c.survival(s) for w, c in zip(self.weights, self.components)], axis=0)

    def conditional(self, n: int) -> np.ndarray:
        surv = self.survival(int(n))
        prev = np.concatenate(([1.0], surv[:-1]))
        return np.divide(surv, prev, out=np.zeros_like(surv), where=prev > 0)

    def expected_tokens(self, s: int) -> float:
        return float(sum(w * c.expected_tokens(s) for w, c in zip(self.weights, self.components)))

    def from_uniform_at(self, u: np.ndarray, s, levels: Optional[np.ndarray] = None) -> np.ndarray:
        if levels is None:
            return self.from_uniform(u, s)
        u = np.asarray(u, dtype=np.float64).reshape(-1)
        s_arr = np.broadcast_to(np.asarray(s, dtype=np.int64), u.shape)
        smax = int(s_arr.max()) if s_arr.size else 0
        if smax <= 0:
            return np.zeros(u.shape, dtype=np.int64)
        table = np.stack([c.survival(smax) for c in self.components])  # (components, smax)
        surv = table[self.component_index(levels)]
        ok = u[:, None] < surv
        ok &= np.arange(1, smax + 1)[None, :] <= s_arr[:, None]
        return ok.sum(axis=1).astype(np.int64)

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "weights": [round(float(x), 4) for x in self.weights],
            "components": [c.describe() for c in self.components],
            "expected_tokens_s4": round(self.expected_tokens(4), 4),
        }


def build_model(spec: AcceptanceSpec, mode: str = "greedy", temperature: float = 0.0) -> AcceptanceModel:
    """The model an inline/table spec describes, seen under the workload's sampling (mode,
    temperature): converted per position by the synthetic-logits toy when it differs from how
    the spec was measured (sampling.py)."""
    if spec.kind == "mixture":
        # each component converted on its own (its own measured setting)
        return MixtureAcceptance(
            [build_model(c, mode, temperature) for c in spec.components],
            spec.weights if spec.weights is not None else [1.0] * len(spec.components),
            assignment=spec.assignment,
            stratified=spec.draws == "stratified",
        )
    if spec.kind == "iid":
        model: AcceptanceModel = IIDAcceptance(spec.alpha)
    elif spec.kind == "positional":
        model = PositionalAcceptance(spec.probs)
    else:
        model = EmpiricalAcceptance(spec.counts, spec.recorded_s)
    src = (spec.measured_mode, spec.measured_temperature)
    if mode == "typical":
        raise InfersimError("typical acceptance applies to Medusa heads, not draft models")
    dst = (mode, temperature)
    if _same_setting(src, dst):
        return model
    if isinstance(model, IIDAcceptance):
        return IIDAcceptance(convert_token_acceptance(model.alpha, src, dst))
    probs = model.conditional(max(len(getattr(model, "probs", [])), 1))
    return PositionalAcceptance([convert_token_acceptance(float(p), src, dst) for p in probs])


def _same_setting(a: tuple[str, float], b: tuple[str, float]) -> bool:
    norm = lambda m, t: ("greedy", 0.0) if (m == "greedy" or t <= 0) else (m, round(float(t), 6))
    return norm(*a) == norm(*b)


# ---- the catalog ------------------------------------------------------------------------------
class TableEntry(AcceptanceSpec):
    model_config = STRICT_CONFIG
    draft: str
    dataset: str


class AcceptanceTable(BaseModel):
    """simulator/catalog/acceptance/<name>.yaml: one target, entries per (draft, dataset)."""

    model_config = STRICT_CONFIG
    name: str
    target: str
    source: str
    notes: str = ""
    drafts: dict[str, str] = Field(default_factory=dict)  # draft label -> the model its steps cost
    entries: list[TableEntry]

    def find(self, draft: str, dataset: Optional[str]) -> TableEntry:
        hits = [e for e in self.entries if e.draft == draft and (dataset is None or e.dataset == dataset)]
        if not hits:
            known = sorted({f"{e.draft}/{e.dataset}" for e in self.entries})
            raise UnknownNameError(f"acceptance entry in table '{self.name}'", f"{draft}/{dataset}", known)
        if len(hits) > 1:
            raise InfersimError(
                f"acceptance table '{self.name}': draft '{draft}' has several datasets; "
                f"give speculation.dataset or acceptance.dataset "
                f"({', '.join(sorted(e.dataset for e in hits))})"
            )
        return hits[0]


def acceptance_dir() -> Path:
    return catalog_dir() / "acceptance"


def list_tables() -> list[str]:
    d = acceptance_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


@lru_cache(maxsize=32)
def load_table(name_or_path: str) -> AcceptanceTable:
    path = Path(str(name_or_path)).expanduser()
    if path.suffix not in (".yaml", ".yml", ".json"):
        path = acceptance_dir() / f"{str(name_or_path).strip().lower()}.yaml"
        if not path.is_file():
            raise UnknownNameError("acceptance table", str(name_or_path), list_tables())
    return validate(AcceptanceTable, load_mapping(path), str(path))


def resolve_spec(acc, dataset: Optional[str] = None) -> AcceptanceSpec:
    """An inline spec as is; a table reference looked up (its dataset, else `dataset`)."""
    if isinstance(acc, AcceptanceSpec) and not isinstance(acc, TableEntry):
        return acc
    if isinstance(acc, TableEntry):
        return acc
    if isinstance(acc, AcceptanceRef):
        entry = load_table(acc.table).find(acc.draft, acc.dataset or dataset)
        return entry
    raise InfersimError(f"not an acceptance spec: {acc!r}")


def resolve_model(
    acc, dataset: Optional[str] = None, mode: str = "greedy", temperature: float = 0.0
) -> AcceptanceModel:
    return build_model(resolve_spec(acc, dataset), mode, temperature)
