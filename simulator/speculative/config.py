"""The `speculation:` section of a workload file.

    speculation:
      method: draft | minions | medusa
      dataset: finance                   # default dataset for acceptance-table look-ups
      speculation_length: 4              # s (draft / minions); the selector's start value
      drafts:                            # one SSM for `draft`, one or more for `minions`
        - model: opt-125m
          acceptance: {table: opt-13b, draft: opt-125m}      # catalog look-up (simulator/catalog/acceptance)
        - model: opt-125m
          acceptance: {kind: iid, alpha: 0.8}                # or inline: iid | positional | empirical
      sampling: {mode: greedy, temperature: 0.0}             # greedy | sampling (rejection) | typical (Medusa)
      voting:   {enabled: true, ...}       # Minions (a) majority-voted speculator
      selector: {enabled: true, ...}       # Minions (b) adaptive speculation length
      pipeline: {enabled: true, ...}       # Minions (c) SSM and LLM engines run concurrently
      medusa:   {accuracies: vicuna-7b, tree: {type: choices}}

`method` sets the defaults of the three Minions switches (all on for `minions`, all off for
`draft`); each switch can be set on its own for ablations. See docs/speculative.md."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, Discriminator, Field, NonNegativeFloat, PositiveInt, Tag, model_validator

from ..validation import STRICT_CONFIG


class _Strict(BaseModel):
    model_config = STRICT_CONFIG


# ---- acceptance --------------------------------------------------------------------------
class AcceptanceRef(_Strict):
    """An entry of an acceptance table in simulator/catalog/acceptance/<table>.yaml."""

    table: str
    draft: str = Field(description="the draft (SSM) label inside the table")
    dataset: Optional[str] = None  # None: the speculation section's dataset


def _check_assignment(assignment: dict | None, n_components: int, field: str) -> None:
    """A replayed run's request id -> component index map must name listed components."""
    bad = [j for j in (assignment or {}).values() if not 0 <= j < n_components]
    if bad:
        raise ValueError(f"{field}: component index {bad[0]} out of range (0..{n_components - 1})")


class AcceptanceSpec(_Strict):
    """An acceptance model given inline (same fields as a table entry).

    iid:        every drafted token is accepted with probability `alpha`, independently;
                expected tokens per step (1 - alpha^(s+1)) / (1 - alpha).
    positional: `probs[i]` = P(token i+1 accepted | tokens 1..i accepted); the last value
                repeats past the end of the list.
    empirical:  `counts[k]` = rounds (recorded at speculation length `recorded_s`) in which
                exactly k drafted tokens were accepted, k = 0..recorded_s, e.g. from a real run;
                turned into positional probabilities (past recorded_s: their geometric mean).
    mixture:    per-request acceptance. `components` are acceptance specs (any kind but
                mixture), `weights` the fraction of requests each describes: a request draws one
                component when it is first drafted for and all its rounds draw from it (real
                acceptance varies by request: repetitive code is easy, prose hard). Components
                are ordered from hardest to easiest when used, so several SSMs of one request
                get the same quantile (a prompt easy for one draft is easy for all). Fitted from
                an executor run by executor/speculative/validate_hooks.py. `assignment` (optional)
                names the component of given request ids (a recorded run's requests replayed by
                id, as the validation does: which request was hard is then known, as its output
                length is); other requests draw their level."""

    kind: Literal["iid", "positional", "empirical", "mixture"]
    alpha: Optional[float] = Field(None, ge=0, le=1)
    probs: Optional[list[float]] = None
    recorded_s: Optional[PositiveInt] = None
    counts: Optional[list[NonNegativeFloat]] = None
    components: Optional[list["AcceptanceSpec"]] = None  # mixture
    weights: Optional[list[float]] = None  # mixture: fraction of requests per component
    assignment: Optional[dict[int, int]] = None  # mixture: request id -> component index (0-based, as listed)
    # mixture: "stratified" draws each request's rounds along a low-discrepancy sequence (a Weyl
    # sequence per request) instead of independent uniforms, so a request's simulated acceptance
    # over its rounds lands close to its component's (Monte Carlo noise O(1/n) instead of
    # O(1/sqrt n)); for replaying a recorded run's per-request acceptance (the validation)
    draws: Literal["random", "stratified"] = "random"
    # how the numbers were measured; the model is converted when the workload samples differently
    measured_mode: Literal["greedy", "sampling"] = "greedy"
    measured_temperature: NonNegativeFloat = 0.0
    source: str = ""

    @model_validator(mode="after")
    def _fields(self):
        if self.kind == "iid" and self.alpha is None:
            raise ValueError("kind 'iid' needs 'alpha'")
        if self.kind == "positional":
            if not self.probs or any(not 0 <= p <= 1 for p in self.probs):
                raise ValueError("kind 'positional' needs 'probs', each in [0, 1]")
        if self.kind == "empirical":
            if self.recorded_s is None or self.counts is None:
                raise ValueError("kind 'empirical' needs 'recorded_s' and 'counts'")
            if len(self.counts) != self.recorded_s + 1:
                raise ValueError(f"'counts' needs recorded_s + 1 = {self.recorded_s + 1} entries (k = 0..recorded_s)")
            if sum(self.counts) <= 0:
                raise ValueError("'counts' must not all be zero")
        if self.kind == "mixture":
            if not self.components:
                raise ValueError("kind 'mixture' needs 'components' (acceptance specs)")
            if any(c.kind == "mixture" for c in self.components):
                raise ValueError("a mixture's components must not be mixtures")
            w = self.weights if self.weights is not None else [1.0] * len(self.components)
            if len(w) != len(self.components) or any(x < 0 for x in w) or sum(w) <= 0:
                raise ValueError("mixture 'weights': one non-negative weight per component, not all zero")
            _check_assignment(self.assignment, len(self.components), "mixture 'assignment'")
        elif self.assignment is not None or self.draws != "random":
            raise ValueError("'assignment' and 'draws' apply to kind 'mixture' only")
        return self


AcceptanceSpec.model_rebuild()


def _acceptance_form(v) -> str | None:
    """An inline model names its `kind`; a table entry does not: each form reports its own errors."""
    if isinstance(v, (AcceptanceRef, AcceptanceSpec)):
        return "table" if isinstance(v, AcceptanceRef) else "inline"
    return ("inline" if "kind" in v else "table") if isinstance(v, dict) else None


Acceptance = Annotated[
    Union[Annotated[AcceptanceRef, Tag("table")], Annotated[AcceptanceSpec, Tag("inline")]],
    Discriminator(
        _acceptance_form,
        custom_error_type="acceptance_form",
        custom_error_message="give {kind: iid|positional|empirical|mixture, ...} or a table entry {table, draft}",
    ),
]


class DraftSection(_Strict):
    model: str = Field(description="the SSM's model (catalog name, YAML or config.json): what its steps cost")
    acceptance: Acceptance
    name: Optional[str] = None  # label in reports (default: model, or the table's draft label)
    weight: float = Field(1.0, gt=0)  # initial voting weight


class SamplingSection(_Strict):
    """How the target accepts: greedy (argmax match), sampling (rejection sampling at
    `temperature`) or typical (Medusa's typical acceptance: p(x) > min(epsilon, delta exp(-H)))."""

    mode: Literal["greedy", "sampling", "typical"] = "greedy"
    temperature: NonNegativeFloat = 0.0
    epsilon: float = Field(0.09, gt=0, le=1)  # the Medusa reference code's defaults (FasterDecoding/Medusa)
    delta: float = Field(0.3, gt=0)


# ---- Minions --------------------------------------------------------------------------------
class VotingSection(_Strict):
    """Minions (a): majority-voted speculator. After each LLM verification every SSM's ACR (mean
    accepted/s of the outputs it was the voted SSM for) is compared with the thresholds; the
    weight is multiplied by reward_factor above reward_threshold and by punish_factor below
    punish_threshold. The paper gives no threshold values: `threshold_mode: relative` (default)
    reads the thresholds as multiples of a running mean (EMA) of all SSMs' ACR, `absolute` as
    acceptance rates."""

    enabled: Optional[bool] = None  # None: on for method minions
    reward_threshold: float = Field(1.05, ge=0)
    punish_threshold: float = Field(0.95, ge=0)
    reward_factor: float = Field(1.1, ge=1)
    punish_factor: float = Field(0.9, gt=0, le=1)
    threshold_mode: Literal["relative", "absolute"] = "relative"
    # voted: ACR over the outputs an SSM was voted for (the paper's Equation 1); all: every SSM
    # scored on every output by its agreement with what verification revealed (the weighted-
    # majority algorithm the paper builds on); an SSM never voted can then still gain weight
    acr_scope: Literal["all", "voted"] = "all"
    ema: float = Field(0.05, gt=0, le=1)  # smoothing of the running mean ACR (relative mode)
    # how alike the SSMs' mistakes are: probability that all SSMs share one uniform draw for a
    # request's agreement lengths (0: independent SSMs, 1: a token hard for one is hard for all)
    correlation: float = Field(0.5, ge=0, le=1)

    @model_validator(mode="after")
    def _order(self):
        if self.punish_threshold > self.reward_threshold:
            raise ValueError("punish_threshold must not exceed reward_threshold")
        return self


class SelectorSection(_Strict):
    """Minions (b): adaptive speculation length. The monitor records t / vl per verification
    (t: see `measure`; vl: mean tokens gained per request); after `decision_threshold` samples since the last
    change it fits a line through them and the samples before the change; slope > 0 -> s -=
    s_punish, slope <= 0 -> s += s_reward (rule `paper`, literally). Rule `directional` (the
    default) reads "punish" as "undo the last change": it keeps moving the way the last change
    went while t/vl falls and turns back when it rises. The two agree whenever the last change
    was an increase; after a decrease that hurt, the literal rule decreases again and can spiral
    down to s_min (docs/findings/minions.md measures it)."""

    enabled: Optional[bool] = None  # None: on for method minions
    decision_threshold: PositiveInt = 20
    s_reward: PositiveInt = 1
    s_punish: PositiveInt = 1
    s_min: PositiveInt = 1
    s_max: PositiveInt = 12
    rule: Literal["paper", "directional"] = "directional"
    # what t is: llm = the LLM's verification time (the paper); round = SSM steps + verification
    # (coupled); period = time between the ends of successive verifications, waits for the pool
    # included (pipelined: equals llm while the SSMs keep up, and sees it when they do not).
    # auto: round when coupled, period when pipelined
    measure: Literal["auto", "llm", "round", "period"] = "auto"

    @model_validator(mode="after")
    def _order(self):
        if self.s_min > self.s_max:
            raise ValueError("s_min must not exceed s_max")
        return self


class PipelineSection(_Strict):
    """Minions (c): the SSM engine and the LLM engine as concurrent processes joined by the
    intermediate result pool. `shared`: one GPU, MPS-like; while both engines are busy each runs
    at its share of its solo speed (shares summing to 1 or less model no overlap gain: the GPU's
    throughput is only split). `separate`: the SSMs have their own device (speculation.
    draft_hardware, default the same profile), no contention.

    `contention` (shared placement): `sharing` (processor sharing, above: a pass slows down only
    while the other engine runs) or `whole_pass`: a pass during which the other engine is busy
    at all takes its solo time / its share, however long the overlap (what two Python threads
    contending for the GIL and two cores did in the executor, analysis/validate/spec_costmodel.py:
    verifying passes overlapped for 10-50% of their time were as slow as those overlapped
    throughout). `llm_prefill_share` prices the verifying passes that also prefill at their own
    share."""

    enabled: Optional[bool] = None  # None: on for method minions
    placement: Literal["shared", "separate"] = "shared"
    llm_share: float = Field(0.8, gt=0, le=1)
    ssm_share: float = Field(0.5, gt=0, le=1)
    # the share of a verifying pass that also prefills new sequences (None: llm_share). Prefill
    # work is mostly inside kernels that run on their own core; a decode pass of a small model is
    # mostly interpreter work, which the other thread holds up: in the executor an overlapped
    # prefilling pass took 1.04-1.14x its solo time, a decode-only one 1.2-1.75x
    llm_prefill_share: Optional[float] = Field(None, gt=0, le=1)
    contention: Literal["sharing", "whole_pass"] = "sharing"
    # host time on the verifying engine after each verification before its sequences go back to
    # the drafting engine and the next pass can begin: token commits, finished requests'
    # release, the hand-over to the drafting thread or process. The CPU executor spent a median
    # 0.14-0.25 ms per pass there (most of the gaps between its passes); `sim validate` measures
    # it on the calibration runs. 0 leaves it out (no measurement for the deployment)
    handoff_s: float = Field(0.0, ge=0)
    llm_batch_size: Optional[PositiveInt] = None  # None: serving.max_batch_size // 2 (two batches in flight)
    ssm_batch_size: Optional[PositiveInt] = None  # None: llm_batch_size
    back_pressure: bool = True  # SSMs pause while the pool holds >= llm_batch_size requests


# ---- Medusa ---------------------------------------------------------------------------------
class TreeSection(_Strict):
    """choices: an explicit list of paths (default: the accuracy table's tree, mc_sim_7b_63);
    cartesian: every path through the top-sizes[k] guesses of head k; greedy: Medusa 2.3.3,
    the `nodes` (root included) most probable paths under the accuracy table."""

    type: Literal["choices", "cartesian", "greedy"] = "choices"
    choices: Optional[list[list[int]]] = None
    sizes: Optional[list[PositiveInt]] = None
    nodes: Optional[PositiveInt] = None

    @model_validator(mode="after")
    def _fields(self):
        if self.type == "cartesian" and not self.sizes:
            raise ValueError("tree type 'cartesian' needs 'sizes' (top-s_k per head)")
        if self.type == "greedy" and self.nodes is None:
            raise ValueError("tree type 'greedy' needs 'nodes' (tree size, root included)")
        return self


class MedusaAcceptance(_Strict):
    """An empirical accepted-depth distribution recorded on one tree (e.g. by the executor:
    executor/medusa/serve.py's accepted_hist): `counts[d]` = tree steps that accepted exactly d
    candidates, d = 0..depth. Replaces the head-independence model (which needs only the
    accuracies) when the simulated tree is `tree`; real heads are right together more often
    than independent ones (a context easy for head 1 is easy for head 2)."""

    kind: Literal["empirical"] = "empirical"
    counts: list[NonNegativeFloat]
    tree: list[list[int]] = Field(description="the tree (choices) the counts were recorded on")
    # per request (optional): histograms like `counts`, one per group of requests, and the
    # fraction of requests in each; a request draws one when first verified and all its tree
    # steps draw from it (as AcceptanceSpec kind mixture). `counts` is then only reported.
    components: Optional[list[list[NonNegativeFloat]]] = None
    weights: Optional[list[NonNegativeFloat]] = None
    # replaying a recorded run (as AcceptanceSpec's mixture): request id -> component index (as
    # listed), and stratified draws (each request's tree steps along a low-discrepancy sequence)
    assignment: Optional[dict[int, int]] = None
    draws: Literal["random", "stratified"] = "random"
    source: str = ""

    @model_validator(mode="after")
    def _fields(self):
        depth = max((len(p) for p in self.tree), default=0)
        if len(self.counts) != depth + 1:
            raise ValueError(f"'counts' needs tree depth + 1 = {depth + 1} entries (d = 0..depth)")
        if sum(self.counts) <= 0:
            raise ValueError("'counts' must not all be zero")
        if self.components is not None:
            if not self.components or any(len(c) != depth + 1 or sum(c) <= 0 for c in self.components):
                raise ValueError(f"'components': histograms of depth + 1 = {depth + 1} counts each, not all zero")
            w = self.weights if self.weights is not None else [1.0] * len(self.components)
            if len(w) != len(self.components) or sum(w) <= 0:
                raise ValueError("'weights': one per component, not all zero")
            _check_assignment(self.assignment, len(self.components), "'assignment'")
        elif self.assignment is not None or self.draws != "random":
            raise ValueError("'assignment' and 'draws' need per-request 'components'")
        return self


class MedusaSection(_Strict):
    accuracies: str = "vicuna-7b"  # simulator/catalog/medusa/<name>.yaml or a file
    # None: heads independent (accuracies); empirical: the recorded distribution on its tree
    acceptance: Optional[MedusaAcceptance] = None
    heads: Optional[PositiveInt] = None  # None: every head in the table
    tree: TreeSection = TreeSection()
    head_cost: bool = True  # cost the heads (residual SiLU block + vocab projection each)
    heads_on_all_candidates: bool = True  # reference code applies the heads to every tree position


class SpeculationSection(_Strict):
    model_config = STRICT_CONFIG
    method: Literal["draft", "minions", "medusa"] = "draft"
    dataset: Optional[str] = None
    speculation_length: PositiveInt = 4
    drafts: list[DraftSection] = []
    sampling: SamplingSection = SamplingSection()
    draft_hardware: Optional[str] = None  # None: the target's profile (same GPU when coupled or shared)
    draft_tensor_parallel: PositiveInt = Field(
        1,
        description="GPUs the draft model is split over; 1 (a small draft on one GPU) or the target's tensor_parallel",
    )
    # fixed cost per SSM step not in the roofline (kernel launches, sampling, framework); paid once
    # per step however many SSMs draft (they run concurrently, their idle gaps overlap)
    draft_step_overhead_us: NonNegativeFloat = 0.0
    account_memory: bool = (
        True  # colocated SSM weights/KV and Medusa heads come out of the KV pool (derived pools only)
    )
    voting: VotingSection = VotingSection()
    selector: SelectorSection = SelectorSection()
    pipeline: PipelineSection = PipelineSection()
    medusa: MedusaSection = MedusaSection()
    series_max_points: PositiveInt = 200  # time series in summary.json are thinned to this many points

    @model_validator(mode="after")
    def _check(self):
        if self.method == "medusa":
            if self.drafts:
                raise ValueError("method 'medusa' takes no drafts")
            if self.sampling.mode == "sampling" and self.sampling.temperature == 0:
                pass  # rejection sampling at temperature 0 is greedy
        else:
            if not self.drafts:
                raise ValueError(f"method '{self.method}' needs at least one entry in 'drafts'")
            if self.method == "draft" and len(self.drafts) > 1 and not self.voting_on:
                raise ValueError("method 'draft' takes one draft; use method 'minions' (voting) for several")
            if self.sampling.mode == "typical":
                raise ValueError("typical acceptance is modelled for Medusa only; use greedy or sampling")
        return self

    # resolved switches ---------------------------------------------------------------------
    def _switch(self, value: Optional[bool]) -> bool:
        return (self.method == "minions") if value is None else bool(value)

    @property
    def voting_on(self) -> bool:
        return self.method != "medusa" and self._switch(self.voting.enabled) and len(self.drafts) > 1

    @property
    def selector_on(self) -> bool:
        return self.method != "medusa" and self._switch(self.selector.enabled)

    @property
    def pipeline_on(self) -> bool:
        return self.method != "medusa" and self._switch(self.pipeline.enabled)
