"""`sim plan`: what-if capacity planning.

For each candidate deployment (hardware profile x tensor-parallel degree x any other option,
e.g. a preemption policy) this finds by search the highest Poisson request rate one replica
sustains within the latency SLOs (its *goodput*), then the number of replicas a target load
needs, the GPUs that makes, and the cost per million output tokens from a price per GPU-hour.

Goodput search, per candidate: every probe is a full simulation of `search.requests` requests
(or more, so that the arrivals span at least `search.min_duration_s`: a short run hides an
overload, the queue has no time to build) with one replica, Poisson arrivals at the probed
rate and a fixed seed (the same for every probe, so two probes differ only by rate). A probe passes when every SLO percentile in its
summary is within its limit. Exponential search (doubling or halving from `start_rate`) finds
a passing and a failing rate; bisection (geometric mid-points) narrows them until
failing/passing <= 1 + tolerance. The goodput is the highest passing rate; the lowest failing
rate probed above it is kept as well (the bracket), so "a slightly higher rate violates the
SLO" is a recorded fact, not an assumption. A few more probes at fractions of the goodput
fill in the latency-against-load curve.

Replicas for a target load: n = ceil(target / goodput), then a verification run with n
replicas behind the least_outstanding router at the target rate (n x search.requests
requests); if it misses an SLO, n grows (by one, or by 10% past
ten replicas) until it passes. GPUs = replicas x tensor_parallel x pipeline_parallel. Cost per million output
tokens at the target = price x GPUs / (3600 x target x mean output tokens) x 1e6.

Data-parallel attention (`data_parallel_attention: [N, ...]` in the plan file, `--dp-attention`):
a candidate whose replica is a group of N one-GPU ranks sharing the experts
(parallel/dp_attention.py), so its probes run whole groups behind the least_outstanding router,
replicas count groups and GPUs = groups x N; goodput per GPU is then comparable with a
tensor-parallel replica's. An option of a field that only data-parallel attention reads
(`hardware.two_batch_overlap=false,true,auto`) multiplies the data-parallel-attention candidates
only; the others run without it and keep their labels.

Pricing and the target load are not part of the workload file: they come from a plan file
(`--plan plan.yaml`, see examples/plan/) or from flags (`--price`, `--target-rate`); flags win.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import time
from concurrent.futures import FIRST_COMPLETED, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generator, Optional, Union

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field, NonNegativeFloat, PositiveFloat, PositiveInt

from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware, split_mode
from infersim.simulator.metrics.plots import REPRODUCIBLE_PNG, finish_figure, pyplot
from infersim.simulator.metrics.rundir import staged_dir, write_json
from infersim.simulator.models.catalog import load_model
from infersim.simulator.parallel.dp_rules import check_dp_attention
from infersim.simulator.parallel.placement import cluster_gpus_per_node, tp_across_nodes_note
from infersim.simulator.preflight import check_workload
from infersim.simulator.progress import ProgressBar
from infersim.simulator.validation import (
    MAX_SEED,
    STRICT_CONFIG,
    check_memory,
    in_field,
    simulation_bytes,
    source_field,
)
from infersim.simulator.workload.builder import load_workload
from infersim.simulator.workload.schema import WorkloadSpec
from infersim.simulator.yamlio import load_model_file, validate

from .goodput_config import GoodputSection
from .report_html import Image, Report, Table
from .sweep import config_key, resolve_config, run_config
from .sweep_backends import BackendOptions

# ---------------------------------------------------------------------------------------------
# SLOs

SLO_METRICS = {
    "ttft": "ttft_s",
    "tpot": "tpot_s",
    "itl": "itl_s",
    "e2e": "e2e_s",
    "queueing": "queueing_s",
    "normalized_latency": "normalized_latency_s",
}
SLO_STATS = ("p50", "p90", "p99", "mean")
_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "min": 60.0, "m": 60.0}


@dataclass(frozen=True)
class SLO:
    name: str  # as the user wrote it, e.g. ttft_p99
    metric: str  # summary path, e.g. ttft_s.p99
    limit_s: float

    def describe(self) -> str:
        what, stat = self.name.rsplit("_", 1)
        return f"{what.upper() if what in ('ttft', 'tpot', 'itl') else what.replace('_', ' ')} {stat} ≤ {fmt_time(self.limit_s)}"


def parse_duration(value: Union[str, float, int], what: str = "duration") -> float:
    """'2s', '100ms', '250us', '1.5' (seconds) or a number -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        secs = float(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zµ]*)\s*", str(value))
        if not m or m.group(2) not in ("", *_UNITS):
            raise InfersimError(f"bad {what} '{value}': give a number with s, ms or us, e.g. 2s or 100ms")
        secs = float(m.group(1)) * _UNITS.get(m.group(2) or "s")
    if not secs > 0 or not math.isfinite(secs):
        raise InfersimError(f"bad {what} '{value}': must be positive")
    return secs


def parse_slo(spec: Union[str, dict, None]) -> list[SLO]:
    """'ttft_p99=2s,tpot_p99=100ms' or {ttft_p99: 2s, ...} -> SLOs."""
    if spec is None:
        return []
    if isinstance(spec, str):
        items = []
        for part in filter(None, (x.strip() for x in spec.split(","))):
            if "=" not in part:
                raise InfersimError(f"bad SLO '{part}': write NAME=LIMIT, e.g. ttft_p99=2s")
            k, v = part.split("=", 1)
            items.append((k.strip(), v.strip()))
    else:
        items = list(spec.items())
    out = []
    for name, value in items:
        m = re.fullmatch(r"([a-z0-9_]+)_(p50|p90|p99|mean)", str(name).strip().lower())
        if not m or m.group(1) not in SLO_METRICS:
            raise InfersimError(
                f"unknown SLO '{name}'; write METRIC_STAT with METRIC one of "
                f"{', '.join(SLO_METRICS)} and STAT one of {', '.join(SLO_STATS)}, e.g. ttft_p99"
            )
        out.append(
            SLO(m.group(0), f"{SLO_METRICS[m.group(1)]}.{m.group(2)}", parse_duration(value, f"SLO limit for {name}"))
        )
    return out


def slo_value(summary: dict, slo: SLO) -> float:
    key, stat = slo.metric.split(".")
    v = (summary.get(key) or {}).get(stat)
    return float("nan") if v is None else float(v)


def meets(summary: dict | None, slos: list[SLO]) -> bool:
    if not summary or not summary.get("finished"):
        return False
    for s in slos:
        v = slo_value(summary, s)
        if not (math.isfinite(v) and v <= s.limit_s):
            return False
    return True


def fmt_time(s: float) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"


def parse_prices(text: str | None) -> dict[str, float]:
    """'a100-80gb-pcie=1.8,h100-sxm=4' -> {name: USD per GPU-hour}."""
    out = {}
    for part in filter(None, (x.strip() for x in (text or "").split(","))):
        if "=" not in part:
            raise InfersimError(f"bad price '{part}': write HARDWARE=USD_PER_GPU_HOUR, e.g. h100-sxm=4.0")
        k, v = part.split("=", 1)
        try:
            price = float(v)
        except ValueError:
            raise InfersimError(f"bad price '{part}': '{v}' is not a number") from None
        if not math.isfinite(price) or price < 0:
            raise InfersimError(f"bad price '{part}': a finite number >= 0 (USD per GPU-hour)")
        out[k.strip()] = price
    return out


# ---------------------------------------------------------------------------------------------
# the plan file


class _Strict(BaseModel):
    model_config = STRICT_CONFIG


class SearchSection(_Strict):
    requests: PositiveInt = 3000  # simulated requests per probe
    seed: Optional[int] = Field(None, ge=0, le=MAX_SEED)  # None: the workload's seed
    start_rate: Optional[PositiveFloat] = None  # None: the workload's rate, else 1 req/s
    min_rate: PositiveFloat = 0.01
    max_rate: PositiveFloat = 10000.0
    tolerance: float = Field(0.05, gt=0, lt=1)  # stop when failing/passing rate <= 1 + tolerance
    curve_points: list[PositiveFloat] = Field(default_factory=lambda: [0.25, 0.5, 0.75, 1.25, 1.6])
    # Every probe spans at least this much simulated time of arrivals, so that a queue building
    # up at an overloading rate reaches the p99s; None: 1.25 x the largest SLO limit / tolerance
    # (at 5% over capacity the backlog delay grows by 5% of the elapsed time), at least 30 s.
    min_duration_s: Optional[PositiveFloat] = None
    max_requests: PositiveInt = 30000  # cap on the requests of one probe (high rates, many replicas)
    max_replicas: PositiveInt = 1024


class PlanFile(_Strict):
    """What `--plan plan.yaml` holds; every entry is optional and a flag overrides it."""

    slo: dict[str, Union[str, float]] = Field(default_factory=dict)
    hardware: list[str] = Field(default_factory=list)  # empty: the workload's profile
    tensor_parallel: list[PositiveInt] = Field(default_factory=list)  # empty: the workload's
    pipeline_parallel: list[PositiveInt] = Field(default_factory=list)  # empty: the workload's; crossed with TP
    # data-parallel-attention group sizes: each N a layout beside the TP x PP ones (one GPU per rank,
    # expert_parallel N), crossed with hardware and options
    data_parallel_attention: list[PositiveInt] = Field(default_factory=list)
    options: dict[str, list[Any]] = Field(default_factory=dict)  # dotted workload path -> values to compare
    prices: dict[str, NonNegativeFloat] = Field(default_factory=dict)  # hardware name -> USD per GPU-hour
    price_source: str = ""  # where the prices come from (shown in the report)
    target_rate: Optional[PositiveFloat] = None  # req/s; None: the workload's arrival rate
    search: SearchSection = SearchSection()
    # compare colocated and disaggregated deployments of the same GPUs by goodput (analysis/goodput.py)
    disaggregation: Optional[GoodputSection] = None


def load_plan_file(path: str | Path | None) -> PlanFile:
    if path is None:
        return PlanFile()

    return load_model_file(PlanFile, path)


@dataclass
class Candidate:
    label: str
    overrides: dict[str, Any]
    hardware: str  # canonical profile name
    tensor_parallel: int
    price: Optional[float]  # USD per GPU-hour
    pipeline_parallel: int = 1
    gpus_per_node: int = 8  # the workload's cluster, as check_candidates reads it
    refused: str = ""  # why this combination of the grid cannot run (reported, not probed)
    dp_attention: int = 0  # ranks (GPUs) of a data-parallel-attention group, the candidate's unit; 0: none


@dataclass
class Probe:
    rate: float
    replicas: int = 1
    requests: int = 0
    kind: str = "search"  # search | curve | verify


@dataclass
class ProbeResult:
    candidate: str
    kind: str
    rate: float
    replicas: int
    requests: int
    ok: bool
    status: str
    error: Optional[str]
    metrics: dict[str, float]
    wall_s: float


@dataclass
class CandidateResult:
    label: str
    hardware: str
    tensor_parallel: int
    overrides: dict[str, Any]
    price_per_gpu_hour: Optional[float]
    status: str = "ok"  # ok | infeasible | failed
    error: Optional[str] = None
    goodput_rps: float = 0.0  # per replica
    fail_rate_rps: Optional[float] = None  # lowest failing rate probed above the goodput
    capped: bool = False  # passed at max_rate: the goodput is at least this
    goodput_output_tps: float = 0.0
    mean_output_tokens: float = float("nan")
    mean_prompt_tokens: float = float("nan")
    at_goodput: dict[str, float] = field(default_factory=dict)  # SLO metric values at the goodput
    replicas_initial: Optional[int] = None  # ceil(target / goodput)
    replicas: Optional[int] = None  # after verification
    verified: bool = False
    verify: dict[str, float] = field(default_factory=dict)
    gpus: Optional[int] = None
    cost_per_m_output_tokens: Optional[float] = None  # at the target load, with the replicas needed
    cost_per_m_total_tokens: Optional[float] = None
    cost_per_m_output_tokens_at_goodput: Optional[float] = None  # a replica run at its goodput
    probes: list[ProbeResult] = field(default_factory=list)
    pipeline_parallel: int = 1
    gpus_per_node: int = 8
    dp_attention: int = 0  # a replica here is a data-parallel-attention group of this many GPUs; 0: none

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel * max(1, self.dp_attention)

    @property
    def layout(self) -> str:
        """'DP-attn 8' or 'TP 4' (with ' × PP 2'): what one replica is."""
        if self.dp_attention:
            return f"DP-attn {self.dp_attention}"
        return f"TP {self.tensor_parallel}{_pp(self)}"


@dataclass
class PlanResult:
    workload: str
    model: str
    slos: list[SLO]
    target_rate: Optional[float]
    search: SearchSection
    seed: int
    candidates: list[CandidateResult]
    wall_s: float = 0.0
    backend: str = ""
    price_source: str = ""
    arrival_note: str = ""

    def best(self) -> Optional[CandidateResult]:
        return rank(self.candidates)[0] if rank(self.candidates) else None


def rank(cands: list[CandidateResult]) -> list[CandidateResult]:
    """Feasible candidates, best first: lowest cost at the target where priced, then fewest
    GPUs, then the highest goodput per GPU."""
    ok = [c for c in cands if c.status == "ok" and c.goodput_rps > 0]

    def key(c):
        cost = c.cost_per_m_output_tokens if c.cost_per_m_output_tokens is not None else math.inf
        gpus = c.gpus if c.gpus is not None else math.inf
        return (cost, gpus, -c.goodput_rps / c.gpus_per_replica)

    return sorted(ok, key=key)


# ---------------------------------------------------------------------------------------------
# the search, as a generator: it yields the probes it needs and receives their results, so a
# driver can interleave every candidate's probes on a pool of workers


class _Search:
    def __init__(
        self,
        cand: Candidate,
        base: dict,
        base_dir: str,
        slos: list[SLO],
        search: SearchSection,
        target: Optional[float],
        seed: int,
        arrival: dict,
    ):
        self.cand, self.base, self.base_dir, self.slos, self.s = cand, base, base_dir, slos, search
        self.target, self.seed, self.arrival = target, seed, arrival
        self.result = CandidateResult(cand.label, cand.hardware, cand.tensor_parallel, cand.overrides, cand.price)
        self.result.pipeline_parallel = cand.pipeline_parallel
        self.result.gpus_per_node = cand.gpus_per_node
        self.result.dp_attention = cand.dp_attention

    def task(self, p: Probe) -> dict:
        arrival = dict(self.arrival, rate=float(p.rate))
        over = dict(self.cand.overrides)
        ranks = p.replicas * max(1, self.cand.dp_attention)  # a DP-attention replica is a whole group
        over.update(
            {
                "hardware.replicas": ranks,
                "requests.arrival": arrival,
                "requests.count": p.requests,
                "requests.duration_s": None,
                "seed": self.seed,
            }
        )
        if ranks > 1:
            over["hardware.router"] = "least_outstanding"
        return {"config": resolve_config(self.base, over), "base_dir": self.base_dir}

    def record(self, p: Probe, res: dict) -> ProbeResult:
        summary = res.get("summary") or {}
        metrics = {s.metric: slo_value(summary, s) for s in self.slos}
        for k in (
            "throughput_req_per_s",
            "throughput_output_tokens_per_s",
            "throughput_total_tokens_per_s",
            "finished",
            "aborted",
            "makespan_s",
        ):
            if k in summary:
                metrics[k] = float(summary[k])
        for k in ("ttft_s", "tpot_s", "e2e_s"):
            if k in summary:
                metrics[f"{k}.p99"] = float(summary[k]["p99"]) if summary[k]["p99"] is not None else float("nan")
        pr = ProbeResult(
            self.cand.label,
            p.kind,
            p.rate,
            p.replicas,
            p.requests,
            res["status"] == "ok" and meets(summary, self.slos),
            res["status"],
            res.get("error"),
            metrics,
            res.get("wall_s", 0.0),
        )
        self.result.probes.append(pr)
        if res["status"] == "ok" and summary.get("finished"):
            fin = summary["finished"]
            out_tok = summary["throughput_output_tokens_per_s"] * summary["makespan_s"]
            tot_tok = summary["throughput_total_tokens_per_s"] * summary["makespan_s"]
            if p.kind == "search" and math.isnan(self.result.mean_output_tokens):
                self.result.mean_output_tokens = out_tok / fin
                self.result.mean_prompt_tokens = (tot_tok - out_tok) / fin
        return pr

    def run(self) -> Generator[list[Probe], list[dict], CandidateResult]:
        s, r = self.s, self.result
        if self.cand.refused:
            r.status, r.error = "failed", self.cand.refused
            return r
        n = s.requests
        min_dur = probe_duration_s(s, self.slos)

        def one(rate, kind="search", replicas=1):
            count = min(s.max_requests, max(n * replicas, math.ceil(rate * min_dur)))
            return Probe(rate=float(rate), replicas=replicas, requests=count, kind=kind)

        rate = min(max(s.start_rate, s.min_rate), s.max_rate)
        p = one(rate)
        first = self.record(p, (yield [p])[0])
        if first.status != "ok":
            r.status, r.error = "failed", first.error
            return r
        lo, hi = (rate, None) if first.ok else (None, rate)
        # exponential search for a bracket
        while lo is None or hi is None:
            nxt = lo * 2 if hi is None else hi / 2
            if hi is None and nxt > s.max_rate:
                r.capped = True
                break
            if lo is None and nxt < s.min_rate:
                break
            p = one(nxt)
            pr = self.record(p, (yield [p])[0])
            if pr.status != "ok":
                r.status, r.error = "failed", pr.error
                return r
            if pr.ok:
                lo = nxt
            else:
                hi = nxt
        if lo is None:
            r.status = "infeasible"
            r.error = f"misses the SLO even at {s.min_rate:g} req/s"
            r.fail_rate_rps = hi
            return r
        # bisection in log space
        while hi is not None and hi / lo > 1 + s.tolerance:
            mid = math.sqrt(lo * hi)
            p = one(mid)
            pr = self.record(p, (yield [p])[0])
            if pr.ok:
                lo = mid
            else:
                hi = mid
        r.goodput_rps, r.fail_rate_rps = lo, hi
        at = next(x for x in r.probes if x.rate == lo and x.kind == "search")
        r.at_goodput = {k: v for k, v in at.metrics.items()}
        r.goodput_output_tps = lo * r.mean_output_tokens
        # the latency-against-load curve
        probed = [x.rate for x in r.probes]
        fill = [
            one(lo * f, "curve")
            for f in s.curve_points
            if all(abs(lo * f / q - 1) > 0.04 for q in probed) and s.min_rate <= lo * f <= s.max_rate
        ]
        if fill:
            results = yield fill
            for p, res in zip(fill, results):
                self.record(p, res)
        if r.price_per_gpu_hour is not None and r.mean_output_tokens > 0:
            r.cost_per_m_output_tokens_at_goodput = (
                r.price_per_gpu_hour * r.gpus_per_replica * 1e6 / (3600 * lo * r.mean_output_tokens)
            )
        # replicas for the target load
        if self.target:
            need = max(1, math.ceil(self.target / lo - 1e-9))
            r.replicas_initial = need
            while True:
                p = one(self.target, "verify", need)
                pr = self.record(p, (yield [p])[0])
                if pr.ok:
                    r.replicas, r.verified, r.verify = need, True, dict(pr.metrics)
                    break
                if pr.status != "ok" or need >= s.max_replicas:
                    r.replicas, r.verified, r.verify = need, False, dict(pr.metrics)
                    if pr.status != "ok":
                        r.error = pr.error
                    break
                need = min(s.max_replicas, need + (1 if need < 10 else math.ceil(need * 0.1)))
            r.gpus = r.replicas * r.gpus_per_replica
            if r.price_per_gpu_hour is not None and r.mean_output_tokens > 0:
                tok_out = self.target * r.mean_output_tokens
                tok_all = self.target * (r.mean_output_tokens + r.mean_prompt_tokens)
                r.cost_per_m_output_tokens = r.price_per_gpu_hour * r.gpus * 1e6 / (3600 * tok_out)
                r.cost_per_m_total_tokens = r.price_per_gpu_hour * r.gpus * 1e6 / (3600 * tok_all)
            if not r.verified:
                r.status = "infeasible"
                r.error = r.error or f"misses the SLO at {self.target:g} req/s even with {r.replicas} replicas"
        return r


# ---------------------------------------------------------------------------------------------
# the driver


def probe_duration_s(search: SearchSection, slos: list[SLO]) -> float:
    """The simulated time of arrivals every probe spans at least (see SearchSection)."""
    if search.min_duration_s is not None:
        return float(search.min_duration_s)
    longest = max((x.limit_s for x in slos), default=1.0)
    return max(30.0, 1.25 * longest / search.tolerance)


# the workload fields a data-parallel-attention layout sets: option values for them apply to
# the tensor-parallel layouts only
DP_LAYOUT_KEYS = (
    "hardware.tensor_parallel",
    "hardware.pipeline_parallel",
    "hardware.expert_parallel",
    "hardware.data_parallel_attention",
    "hardware.replicas",
)
# the workload fields that mean something with data-parallel attention only: option values for
# them apply to the data-parallel-attention candidates, and every other candidate runs without
DP_ONLY_KEYS = ("hardware.two_batch_overlap",)


def dp_layout(ranks: int) -> dict[str, Any]:
    """The overrides of a data-parallel-attention group of `ranks` GPUs (one group: the search
    multiplies the replicas)."""
    return {
        "hardware.tensor_parallel": 1,
        "hardware.pipeline_parallel": 1,
        "hardware.data_parallel_attention": True,
        "hardware.expert_parallel": int(ranks),
        "hardware.replicas": int(ranks),
    }


def build_candidates(
    spec,
    hardware: list[str],
    tps: list[int],
    options: dict[str, list],
    prices: dict[str, float],
    pps: list[int] | None = None,
    dp_attention: list[int] | None = None,
) -> list[Candidate]:
    """Every hardware x layout x option value: the layouts are TP x PP (default the workload's)
    and, with `dp_attention`, one data-parallel-attention group per size."""
    hardware = hardware or [spec.hardware.profile]
    tps = tps or [spec.hardware.tensor_parallel]
    pps = pps or [spec.hardware.pipeline_parallel]
    dps = list(dp_attention or [])
    # prices by canonical name, so an alias or a file path in either place matches
    canon_prices = {}
    for name, price in prices.items():
        canon_prices[load_hardware(name).name] = price
    keys = list(options)
    out, seen = [], set()
    for hw in hardware:
        canon = load_hardware(hw).name
        layouts = [_tp_layout(tp, pp, tps, pps, bool(dps)) for tp, pp in itertools.product(tps, pps)]
        layouts += [(f"dp-attn {n}", dp_layout(n), n) for n in dps]
        for (name, layout, ranks), combo in itertools.product(
            layouts, itertools.product(*[options[k] for k in keys]) if keys else [()]
        ):
            chosen = [(k, v) for k, v in zip(keys, combo) if not (ranks and k in DP_LAYOUT_KEYS)]
            off = {}  # a candidate without data-parallel attention runs without the fields of it
            if not _runs_dp_attention(spec, {**layout, **dict(chosen)}):
                chosen = [(k, v) for k, v in chosen if k not in DP_ONLY_KEYS]
                off = {k: False for k in DP_ONLY_KEYS if getattr(spec.hardware, k.split(".")[-1])}
            over = {"hardware.profile": hw, **layout, **dict(chosen), **off}
            parts = [canon] + ([name] if name else [])
            parts += [f"{k.split('.')[-1]}={v}" for k, v in chosen if len(options[k]) > 1]
            label = " ".join(parts)
            if label in seen:
                continue
            seen.add(label)
            tp, pp = over["hardware.tensor_parallel"], over["hardware.pipeline_parallel"]
            out.append(Candidate(label, over, canon, int(tp), _price(canon_prices, canon), int(pp), dp_attention=ranks))
    return out


def _tp_layout(tp: int, pp: int, tps: list[int], pps: list[int], beside_dp: bool) -> tuple[str, dict, int]:
    """(label part, overrides, 0) of a tensor x pipeline layout; beside data-parallel-attention
    layouts it runs without data-parallel attention, whatever the workload says."""
    parts = [f"tp{tp}"] if len(tps) > 1 or tp != 1 or beside_dp else []
    parts += [f"pp{pp}"] if len(pps) > 1 or pp != 1 else []
    over = {"hardware.tensor_parallel": int(tp), "hardware.pipeline_parallel": int(pp)}
    if beside_dp:
        over["hardware.data_parallel_attention"] = False
    return " ".join(parts), over, 0


def _runs_dp_attention(spec, overrides: dict) -> bool:
    """Whether a candidate of these overrides on the workload `spec` runs data-parallel attention."""
    return bool(overrides.get("hardware.data_parallel_attention", spec.hardware.data_parallel_attention))


def _price(prices: dict[str, float], canon: str) -> Optional[float]:
    """The price of a candidate's GPU: its own name's, else its base profile's (NAME:datasheet
    runs on the same GPU as NAME, only priced by another cost model)."""
    return prices.get(canon, prices.get(split_mode(canon)[0]))


def check_names(hardware: list[str] | None, pf: PlanFile, prices: dict[str, float] | None, plan_source: str) -> None:
    """Every hardware name, from the flags or the plan file, exists; an error names its origin."""
    for names, source, where in (
        (hardware or [], "", "--hardware"),
        (list(prices or {}), "", "--price"),
        ([] if hardware else pf.hardware, plan_source, "hardware"),
        (list(pf.prices), plan_source, "prices"),
    ):
        for name in names:
            in_field(source, where, load_hardware, name)


def check_candidates(
    cands: list[Candidate], base: dict, source: str, search: SearchSection, workers: int | None, allow_large: bool
) -> None:
    """Every candidate passes the shared rules (schema, tensor parallelism, seed) before any
    probe runs, and the largest probes, one per worker, fit in memory."""
    mismatches = []
    for c in cands:
        spec = _candidate_spec(c, base, source)
        mismatch = _grid_mismatch(spec)
        c.refused = mismatch[1] if mismatch else ""
        if mismatch:
            mismatches.append(mismatch)
        else:
            check_workload(spec, f"{source} as {c.label}", allow_large=True)
        c.gpus_per_node = cluster_gpus_per_node(spec.hardware)
    if all(c.refused for c in cands):
        raise InfersimError(f"{source}: field '{mismatches[0][0]}': {mismatches[0][1]}")
    parallel = min(workers or os.cpu_count() or 1, len(cands))
    check_memory(
        simulation_bytes(search.max_requests, parallel),
        f"plan: field 'search.max_requests': probes of up to {search.max_requests:,} requests x {parallel} " f"workers",
        allow_large,
    )


def _candidate_spec(c: Candidate, base: dict, source: str):
    """The candidate's workload. A data-parallel-attention candidate, from the plan's layouts or
    an option turning hardware.data_parallel_attention on, is one group: its ranks are its
    replicas, and the group is its unit (Candidate.dp_attention)."""
    where = f"{source} as {c.label}"
    spec = validate(WorkloadSpec, resolve_config(base, c.overrides), where)
    hw = spec.hardware
    if hw.data_parallel_attention and hw.replicas != hw.expert_parallel:
        c.overrides["hardware.replicas"] = hw.expert_parallel
        spec = validate(WorkloadSpec, resolve_config(base, c.overrides), where)
    c.dp_attention = hw.expert_parallel if hw.data_parallel_attention else 0
    return spec


def check_dp_sizes(model, base: dict, sizes: list[int], source: str, field: str) -> None:
    """Each data-parallel-attention group size passes dp_rules before any candidate is checked:
    a refusal names the plan file's field (or the flag) and the size, in one line."""
    for n in sizes:
        spec = validate(WorkloadSpec, resolve_config(base, dp_layout(n)), f"{source_field(source, field)}: {n}")
        in_field(source, field, check_dp_attention, model, spec, f"dp-attn {n}")


def _grid_mismatch(spec) -> tuple[str, str] | None:
    """(field, why) a combination of the grid's degrees cannot run (None when it can): expert parallelism
    spreads the experts over the tensor-parallel group, so crossing both degrees makes pairs
    that do not match; a data-parallel-attention rank is one GPU, so crossing it with tensor or
    pipeline degrees above 1 does too. The plan reports such pairs."""
    hw = spec.hardware
    if hw.data_parallel_attention:
        if hw.tensor_parallel == 1 and hw.pipeline_parallel == 1:
            return None
        return "hardware.data_parallel_attention", (
            f"data_parallel_attention needs tensor_parallel 1 and pipeline_parallel 1, not "
            f"{hw.tensor_parallel} and {hw.pipeline_parallel} (each rank is one GPU)"
        )
    ep = hw.expert_parallel
    if ep == 1 or hw.disaggregated is not None or ep == hw.tensor_parallel:
        return None
    return (
        "hardware.expert_parallel",
        f"expert_parallel {ep} needs tensor_parallel {ep} (experts are spread over the tensor-parallel group)",
    )


@dataclass(frozen=True)
class PlanFlags:
    """The command line's values, each overriding the plan file's (None: the plan file's)."""

    hardware: list[str] | None = field(default=None, metadata={"help": "hardware profiles to compare"})
    tensor_parallel: list[int] | None = field(default=None, metadata={"help": "tensor-parallel degrees"})
    pipeline_parallel: list[int] | None = field(default=None, metadata={"help": "pipeline stages, crossed with TP"})
    data_parallel_attention: list[int] | None = field(
        default=None, metadata={"help": "data-parallel-attention group sizes, layouts beside TP x PP"}
    )
    options: dict[str, list] | None = field(default=None, metadata={"help": "dotted workload path -> values"})
    prices: dict[str, float] | None = field(default=None, metadata={"help": "USD per GPU-hour by hardware"})
    target_rate: float | None = field(default=None, metadata={"help": "req/s the plan sizes for"})
    requests: int | None = field(default=None, metadata={"help": "requests per probe"})
    tolerance: float | None = field(default=None, metadata={"help": "relative precision of the rate search"})
    seed: int | None = field(default=None, metadata={"help": "seed of every probe's requests"})


def plan(
    workload: str,
    *,
    slos: list[SLO],
    plan_file: PlanFile | None = None,
    flags: PlanFlags = PlanFlags(),
    run: BackendOptions = BackendOptions(),
    plan_source: str = "plan file",
) -> PlanResult:
    """Run the searches (no files written): see `write_plan` for the report."""
    t0 = time.perf_counter()
    pf = plan_file or PlanFile()
    slos = slos or in_field(plan_source, "slo", parse_slo, pf.slo or None)
    if not slos:
        raise InfersimError("give at least one SLO: --slo ttft_p99=2s,tpot_p99=100ms (or slo: in the plan file)")
    spec, wl_path = load_workload(workload)
    arr = spec.requests.arrival
    if spec.requests.trace is not None and spec.requests.trace.arrival_column is not None:
        raise InfersimError(
            "sim plan varies the arrival rate: the workload's trace arrival times cannot be used "
            "(drop trace.arrival_column and give requests.arrival)"
        )
    note = ""
    if arr is not None and arr.type in ("poisson", "gamma"):
        arrival = arr.model_dump(mode="json")
        workload_rate = float(arr.rate)
    else:
        arrival = {"type": "poisson", "rate": 1.0}
        workload_rate = None
        note = (
            f"the workload's '{arr.type if arr else 'trace'}' arrivals were replaced by Poisson arrivals "
            "for the search"
        )
    search = pf.search.model_copy(
        update={k: v for k, v in (("requests", flags.requests), ("tolerance", flags.tolerance)) if v is not None}
    )
    if search.start_rate is None:
        search = search.model_copy(update={"start_rate": workload_rate or 1.0})
    if search.requests > search.max_requests:  # one() would cap every probe at max_requests, unsaid
        where = "--requests" if flags.requests is not None else f"{plan_source}: field 'search.requests'"
        raise InfersimError(
            f"{where}: {search.requests:,} requests per probe is more than search.max_requests "
            f"({search.max_requests:,}), the most one probe simulates; ask for fewer or raise search.max_requests"
        )
    if flags.tolerance is not None and not 0 < flags.tolerance < 1:
        raise InfersimError(f"--tolerance must be between 0 and 1, got {flags.tolerance}")
    target = flags.target_rate if flags.target_rate is not None else (pf.target_rate or workload_rate)
    seed = flags.seed if flags.seed is not None else (search.seed if search.seed is not None else spec.seed)
    all_prices = dict(pf.prices)
    all_prices.update(flags.prices or {})
    opts = dict(pf.options)
    opts.update(flags.options or {})
    check_names(flags.hardware, pf, flags.prices, plan_source)
    base = spec.model_dump(mode="json")
    origin = str(wl_path) + (f" with {plan_source}" if plan_file is not None else "")
    dps = flags.data_parallel_attention or pf.data_parallel_attention
    if dps:
        model = in_field(str(wl_path), "model", load_model, spec.model)
        where = ("", "--dp-attention") if flags.data_parallel_attention else (plan_source, "data_parallel_attention")
        check_dp_sizes(model, base, dps, *where)
    cands = build_candidates(
        spec,
        flags.hardware or pf.hardware,
        flags.tensor_parallel or pf.tensor_parallel,
        opts,
        all_prices,
        flags.pipeline_parallel or pf.pipeline_parallel,
        dps,
    )
    check_candidates(cands, base, origin, search, run.workers, run.allow_large)
    searches = [_Search(c, base, str(wl_path.parent), slos, search, target, seed, arrival) for c in cands]

    be = run.make()
    cancel = True
    try:
        with _PlanProgress(run.quiet, len(cands), be.describe()) as prog:
            _drive(searches, be, prog)
        cancel = False
    finally:
        be.close(cancel=cancel)
    return PlanResult(
        spec.name,
        spec.model,
        slos,
        target,
        search,
        seed,
        [s.result for s in searches],
        time.perf_counter() - t0,
        be.describe(),
        pf.price_source,
        note,
    )


def _drive(searches: list[_Search], be, prog) -> None:
    """Step every search's generator; run each batch of probes it asks for on the backend."""
    gens = {i: s.run() for i, s in enumerate(searches)}
    batches: dict[int, tuple[list[Probe], list]] = {}
    fut_owner: dict = {}

    def advance(i, results=None):
        try:
            batch = gens[i].send(results) if results is not None else next(gens[i])
        except StopIteration:
            prog.done(searches[i].result)
            return
        futs = [be.submit(run_config, searches[i].task(p)) for p in batch]
        batches[i] = (batch, futs)
        for f in futs:
            fut_owner[f] = i

    for i in gens:
        advance(i)
    while fut_owner:
        done, _ = wait(list(fut_owner), return_when=FIRST_COMPLETED)
        for f in done:
            fut_owner.pop(f, None)
            prog.probe()
        for i in list(batches):
            batch, futs = batches[i]
            if all(f.done() for f in futs):
                del batches[i]
                advance(i, [_safe(f) for f in futs])


def _safe(fut) -> dict:
    try:
        return fut.result()
    except BrokenProcessPool:
        raise InfersimError("a worker process died (out of memory or killed); try fewer --workers") from None
    except Exception as exc:
        return {
            "status": "failed",
            "summary": None,
            "error": f"worker failed: {exc.__class__.__name__}: {exc}",
            "wall_s": 0.0,
            "worker": "?",
        }


class _PlanProgress(ProgressBar):
    def __init__(self, quiet: bool, total: int, where: str):
        super().__init__(
            f"planning [dim]({where})[/]",
            quiet=quiet,
            total=total,
            fields="configurations, {task.fields[probes]} simulations {task.fields[note]}",
            probes=0,
            note="",
        )
        self.probes = 0

    def probe(self) -> None:
        self.probes += 1
        self.update(probes=self.probes)

    def done(self, r: CandidateResult) -> None:
        msg = f"{r.label}: goodput {r.goodput_rps:.3g} req/s" if r.status != "failed" else f"{r.label}: failed"
        self.update(advance=1, note=f"[dim]· {msg}[/]")
        self.print(msg + (f", {r.replicas} replicas" if r.replicas else "") + (f" ({r.error})" if r.error else ""))


# ---------------------------------------------------------------------------------------------
# outputs


def money(v: Optional[float]) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    return f"${v:.3f}" if v < 1 else f"${v:.2f}"


def num(v: Optional[float], digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.{digits}g}"


def _pp(c: CandidateResult) -> str:
    return f" × PP {c.pipeline_parallel}" if c.pipeline_parallel > 1 else ""


def _unit(c: CandidateResult) -> str:
    """What the candidate's replicas are: a data-parallel-attention candidate scales by groups."""
    return "group" if c.dp_attention else "replica"


def verdict(res: PlanResult) -> list[str]:
    slo_txt = ", ".join(s.describe() for s in res.slos)
    ranked = rank(res.candidates)
    lines = []
    bad = [c for c in res.candidates if c not in ranked]
    if not ranked:
        lines.append(
            f"No configuration meets {slo_txt}" + (f" at {res.target_rate:g} req/s." if res.target_rate else ".")
        )
    else:
        best = ranked[0]
        if res.target_rate and best.gpus:
            cost = (
                f" at **{money(best.cost_per_m_output_tokens)} per million output tokens**"
                if best.cost_per_m_output_tokens is not None
                else ""
            )
            how = "cheapest" if best.cost_per_m_output_tokens is not None else "the one needing the fewest GPUs"
            lines.append(
                f"To serve **{res.target_rate:g} req/s** within {slo_txt}, **{best.label}** is {how}: "
                f"**{best.gpus} GPU{'s' if best.gpus != 1 else ''}** ({best.replicas} "
                f"{_unit(best)}{'s' if best.replicas != 1 else ''} × {best.layout}){cost}."
            )
            for other in ranked[1:3]:
                rel = ""
                if other.cost_per_m_output_tokens and best.cost_per_m_output_tokens:
                    rel = (
                        f", {money(other.cost_per_m_output_tokens)}/M "
                        f"({other.cost_per_m_output_tokens / best.cost_per_m_output_tokens:.2f}× the cost)"
                    )
                lines.append(f"Next: {other.label} needs {other.gpus} GPU{'s' if other.gpus != 1 else ''}{rel}.")
        else:
            lines.append(
                f"Within {slo_txt}, **{best.label}** sustains the most load per GPU: "
                f"{best.goodput_rps / best.gpus_per_replica:.3g} req/s per GPU."
            )
        top = max(ranked, key=lambda c: c.goodput_rps)
        lines.append(
            f"Highest goodput per replica: {top.label}, {top.goodput_rps:.3g} req/s "
            f"({top.goodput_output_tps:.0f} output tokens/s)."
        )
    for c in ranked:
        note = tp_across_nodes_note(c.tensor_parallel, c.gpus_per_node)
        if note:
            lines.append(f"{c.label}: {note}.")
    for c in bad:
        lines.append(f"{c.label}: {c.status}" + (f" ({c.error})" if c.error else "") + ".")
    return lines


def _plots(res: PlanResult, pdir: Path) -> list[tuple[str, str, str]]:
    """The plan's figures, written to pdir: (path in the report, title, caption) per figure, in
    the report's order; the cost figure only where a candidate has a price."""
    pdir.mkdir(parents=True, exist_ok=True)
    colors = _candidate_colors(res.candidates)
    made = [_latency_vs_load_plot(res, colors, pdir), _goodput_plot(res.candidates, colors, pdir)]
    if res.target_rate:
        made.append(_replicas_plot(res, colors, pdir))
    priced = [c for c in res.candidates if c.price_per_gpu_hour is not None and c.status != "failed"]
    if priced:
        made.append(_cost_plot(res, priced, colors, pdir))
    return made


def _candidate_colors(cands: list[CandidateResult]) -> dict[str, str]:
    """One colour per candidate, from the style's cycle, the same in every figure."""
    colors = pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    return {c.label: colors[i % len(colors)] for i, c in enumerate(cands)}


def _latency_vs_load_plot(res: PlanResult, col: dict[str, str], pdir: Path) -> tuple[str, str, str]:
    """Latency against load, one panel per SLO, one curve per candidate with its goodput starred."""
    plt = pyplot()
    n = len(res.slos)
    fig, axes = plt.subplots(1, n, figsize=(5.6 * n, 4.2), squeeze=False)
    for ax, slo in zip(axes[0], res.slos):
        for c in res.candidates:
            _load_curve(ax, c, slo, col[c.label])
        _slo_panel(ax, slo)
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(fontsize=8, loc="upper left")
    fig.suptitle("latency against load (one replica; stars: goodput)", fontsize=11)
    finish_figure(fig, pdir / "latency_vs_load.png", **REPRODUCIBLE_PNG)
    return (
        "plots/latency_vs_load.png",
        "latency against load",
        "Each point is a full simulation of one replica at that Poisson rate; the dashed line is the SLO; "
        "the star marks the goodput found by the search.",
    )


def _load_curve(ax, c: CandidateResult, slo: SLO, color: str) -> None:
    """A candidate's one-replica probes that ran, by rate, and a star at its goodput."""
    pts = sorted(
        (p.rate, p.metrics.get(slo.metric, float("nan"))) for p in c.probes if p.replicas == 1 and p.status == "ok"
    )
    if not pts:
        return
    x, y = zip(*pts)
    ax.plot(x, y, "-o", ms=3.5, lw=1.4, color=color, label=c.label)
    if c.goodput_rps > 0:
        gy = c.at_goodput.get(slo.metric)
        ax.plot([c.goodput_rps], [gy], marker="*", ms=13, color=color, mec="black", mew=0.6, zorder=5)


def _slo_panel(ax, slo: SLO) -> None:
    """The SLO's limit as a labelled dashed line, log axes, the panel's labels and title."""
    ax.axhline(slo.limit_s, color="#d1495b", ls="--", lw=1.3)
    ax.annotate(
        f"SLO {fmt_time(slo.limit_s)}",
        xy=(0.01, slo.limit_s),
        xycoords=("axes fraction", "data"),
        xytext=(2, 3),
        textcoords="offset points",
        color="#d1495b",
        fontsize=8,
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("offered load per replica (req/s)")
    ax.set_ylabel(f"{slo.name.replace('_', ' ')} (s)")
    ax.set_title(slo.describe(), fontsize=10)


def _bars_height(n: int) -> float:
    """Figure height (inches) for n horizontal bars."""
    return max(2.2, 0.55 * n + 1.2)


def _bar_labels(ax, labels: list[str]) -> None:
    """One bar per label, the first on top."""
    ax.set_yticks(np.arange(len(labels)))
    ax.set_yticklabels(labels, fontsize=9)
    ax.invert_yaxis()


def _goodput_plot(cands: list[CandidateResult], col: dict[str, str], pdir: Path) -> tuple[str, str, str]:
    """Goodput per replica and per GPU, one bar per candidate."""
    fig, (a1, a2) = pyplot().subplots(1, 2, figsize=(11, _bars_height(len(cands))), sharey=True)
    y = np.arange(len(cands))
    g = [c.goodput_rps for c in cands]
    gpg = [c.goodput_rps / c.gpus_per_replica for c in cands]
    a1.barh(y, g, color=[col[c.label] for c in cands])
    a2.barh(y, gpg, color=[col[c.label] for c in cands])
    for ax, vals, unit in ((a1, g, "req/s"), (a2, gpg, "req/s/GPU")):
        for yi, v, c in zip(y, vals, cands):
            txt = f"{v:.3g}" if c.status != "failed" else "failed"
            ax.annotate(txt, (v, yi), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
        ax.set_xlim(0, max(vals + [1e-9]) * 1.18)
        ax.set_xlabel(unit)
    _bar_labels(a1, [c.label for c in cands])
    a1.set_title("goodput per replica", fontsize=10)
    a2.set_title("goodput per GPU", fontsize=10)
    finish_figure(fig, pdir / "goodput.png", **REPRODUCIBLE_PNG)
    return (
        "plots/goodput.png",
        "goodput per configuration",
        "Highest Poisson rate one replica sustains within every SLO.",
    )


def _replicas_plot(res: PlanResult, col: dict[str, str], pdir: Path) -> tuple[str, str, str]:
    """GPUs each candidate needs for the target load, with its replicas x degrees."""
    cands = res.candidates
    fig, ax = pyplot().subplots(figsize=(8, _bars_height(len(cands))))
    gpus = [c.gpus or 0 for c in cands]
    ax.barh(np.arange(len(cands)), gpus, color=[col[c.label] for c in cands])
    for yi, c in enumerate(cands):
        ax.annotate(
            _replicas_text(c), (c.gpus or 0, yi), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8
        )
    ax.set_xlim(0, max(gpus + [1]) * 1.45)
    _bar_labels(ax, [c.label for c in cands])
    ax.set_xlabel("GPUs")
    ax.set_title(f"GPUs needed for {res.target_rate:g} req/s (verified by simulation)", fontsize=10)
    finish_figure(fig, pdir / "replicas.png", **REPRODUCIBLE_PNG)
    return (
        "plots/replicas.png",
        "replicas needed",
        "ceil(target / goodput) replicas, verified with that many replicas behind a least-outstanding "
        "router and raised until the SLOs hold.",
    )


def _replicas_text(c: CandidateResult) -> str:
    """'8 GPUs = 2 × TP 4' (or '16 GPUs = 2 × DP-attn 8'), marked where the verification missed an SLO; the status without GPUs."""
    if not c.gpus:
        return c.status
    txt = f"{c.gpus} GPUs = {c.replicas} × {c.layout}"
    return txt if c.verified else txt + " (SLO not met)"


def _cost_plot(res: PlanResult, priced: list[CandidateResult], col: dict[str, str], pdir: Path) -> tuple[str, str, str]:
    """Cost per million output tokens of the priced candidates: bars at the target load, diamonds
    at the floor (every replica at its goodput)."""
    fig, ax = pyplot().subplots(figsize=(8, _bars_height(len(priced))))
    yy = np.arange(len(priced))
    at_t = [c.cost_per_m_output_tokens or 0 for c in priced]
    at_g = [c.cost_per_m_output_tokens_at_goodput or 0 for c in priced]
    if res.target_rate:
        ax.barh(yy, at_t, color=[col[c.label] for c in priced])
    ax.scatter(at_g, yy, marker="D", color="black", s=22, zorder=4)
    _cost_labels(ax, priced, at_t, res.target_rate)
    ax.set_xlim(0, max(at_t + at_g + [1e-9]) * 1.3)
    _bar_labels(ax, [c.label for c in priced])
    ax.set_xlabel("USD per million output tokens")
    ax.set_title(
        (f"bars: at {res.target_rate:g} req/s; " if res.target_rate else "")
        + "diamonds: floor, every replica at its goodput",
        fontsize=10,
    )
    finish_figure(fig, pdir / "cost.png", **REPRODUCIBLE_PNG)
    return (
        "plots/cost.png",
        "cost per million output tokens",
        "Price per GPU-hour × GPUs / output tokens per hour at the target load; the diamond is the floor "
        "reached if every replica ran exactly at its goodput.",
    )


def _cost_labels(ax, priced: list[CandidateResult], at_target: list[float], target_rate: Optional[float]) -> None:
    """Each candidate's cost, at the target where there is one (else the floor), right of its bar or diamond."""
    for yi, c, v in zip(np.arange(len(priced)), priced, at_target):
        ax.annotate(
            money(v if target_rate else c.cost_per_m_output_tokens_at_goodput),
            (max(v, c.cost_per_m_output_tokens_at_goodput or 0), yi),
            xytext=(5, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )


def candidates_table(res: PlanResult):
    rows = []
    for c in res.candidates:
        row = {
            "configuration": c.label,
            "hardware": c.hardware,
            "tensor_parallel": c.tensor_parallel,
            "pipeline_parallel": c.pipeline_parallel,
            "dp_attention_ranks": c.dp_attention,
            "gpus_per_replica": c.gpus_per_replica,
            "status": c.status,
            "error": c.error or "",
            "goodput_rps": c.goodput_rps,
            "fail_rate_rps": c.fail_rate_rps,
            "goodput_capped": c.capped,
            "goodput_output_tokens_per_s": c.goodput_output_tps,
            "mean_output_tokens": c.mean_output_tokens,
            "replicas_initial": c.replicas_initial,
            "replicas": c.replicas,
            "verified": c.verified,
            "gpus": c.gpus,
            "price_per_gpu_hour": c.price_per_gpu_hour,
            "cost_per_m_output_tokens": c.cost_per_m_output_tokens,
            "cost_per_m_total_tokens": c.cost_per_m_total_tokens,
            "cost_per_m_output_tokens_at_goodput": c.cost_per_m_output_tokens_at_goodput,
        }
        for k, v in c.overrides.items():
            row[f"option.{k}"] = v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
        for s in res.slos:
            row[f"{s.name}_at_goodput_s"] = c.at_goodput.get(s.metric)
            row[f"{s.name}_verified_s"] = c.verify.get(s.metric)
        rows.append(row)
    return pd.DataFrame(rows)


def probes_table(res: PlanResult):
    rows = []
    for c in res.candidates:
        for p in c.probes:
            rows.append(
                {
                    "configuration": c.label,
                    "kind": p.kind,
                    "rate_rps": p.rate,
                    "replicas": p.replicas,
                    "requests": p.requests,
                    "meets_slo": p.ok,
                    "status": p.status,
                    "error": p.error or "",
                    "wall_s": p.wall_s,
                    **p.metrics,
                }
            )
    return pd.DataFrame(rows)


def to_json(res: PlanResult) -> dict:
    d = asdict(res)
    d["slos"] = [asdict(s) for s in res.slos]
    d["search"] = res.search.model_dump()
    return d


def build_report(res: PlanResult, images: list[tuple[str, str, str]]):
    slo_txt = ", ".join(s.describe() for s in res.slos)
    sub = (
        f"Workload **{res.workload}** (model `{res.model}`), SLOs {slo_txt}"
        + (f", target load {res.target_rate:g} req/s" if res.target_rate else "")
        + "."
    )
    rep = Report(title=f"Capacity plan: {res.workload}", subtitle=sub, verdict=verdict(res))
    ranked = rank(res.candidates)
    order = ranked + [c for c in res.candidates if c not in ranked]
    rep.h2("Configurations")
    cols = ["configuration", "goodput (req/s per replica)", "output tok/s per replica"]
    if res.target_rate:
        cols += ["replicas", "GPUs"]
    cols += [
        "$ per GPU-hour",
        "$ per M output tokens" + (f" at {res.target_rate:g} req/s" if res.target_rate else ""),
        "$ per M at goodput",
    ]
    cols += [
        f"{s.name.replace('_', ' ').upper().replace('P99', 'p99').replace('P90', 'p90').replace('P50', 'p50').replace('MEAN', 'mean')} at goodput"
        for s in res.slos
    ] + ["status"]
    rows = []
    for c in order:
        row = [c.label, num(c.goodput_rps) + ("+" if c.capped else ""), num(c.goodput_output_tps, 4)]
        if res.target_rate:
            row += [str(c.replicas) if c.replicas else "-", str(c.gpus) if c.gpus else "-"]
        row += [
            money(c.price_per_gpu_hour),
            money(c.cost_per_m_output_tokens),
            money(c.cost_per_m_output_tokens_at_goodput),
        ]
        row += [fmt_time(c.at_goodput.get(s.metric, float("nan"))) for s in res.slos]
        row.append(c.status if c.status == "ok" else f"{c.status}: {c.error}")
        rows.append(row)
    rep.add(
        Table(
            cols,
            rows,
            highlight={0} if ranked else set(),
            numeric=set(range(1, len(cols) - 1)),
            caption="Best first (lowest cost at the target, then fewest GPUs). “+”: still within the SLOs at "
            "the search's maximum rate."
            + (
                " A “dp-attn N” replica is a data-parallel-attention group of N GPUs."
                if any(c.dp_attention for c in res.candidates)
                else ""
            ),
        )
    )
    rep.h2("Plots")
    for src, alt, cap in images:
        rep.add(Image(src, alt, cap))
    rep.h2("Method")
    s = res.search
    items = [
        f"Goodput: exponential search then bisection on the Poisson rate until the failing rate is within "
        f"{s.tolerance:.0%} of the passing one; every probe is a full simulation of one replica with seed "
        f"{res.seed} and {s.requests} requests, or more to span at least {probe_duration_s(s, res.slos):.0f} s of "
        f"arrivals (at most {s.max_requests}); a probe passes when every SLO percentile is within its limit.",
        "Replicas: ceil(target / goodput), verified by simulating that many replicas behind a least-outstanding "
        "router at the target rate and raised until the SLOs hold.",
        "Cost per million output tokens: price per GPU-hour × GPUs × 10⁶ / (3600 × target rate × mean output "
        "tokens per request).",
        f"Searches ran on {res.backend} in {res.wall_s:.1f} s.",
    ]
    if any(c.dp_attention for c in res.candidates):
        items.append(
            "Data-parallel attention: a “dp-attn N” replica is a group of N one-GPU ranks sharing the experts; "
            "its probes simulate whole groups behind a least-outstanding router, its GPUs are groups × N."
        )
    if res.price_source:
        items.append(f"Prices: {res.price_source.rstrip('.')}.")
    if res.arrival_note:
        items.append(f"Note: {res.arrival_note}.")
    rep.bullets(items)
    probe_rows = []
    for c in res.candidates:
        for p in sorted(c.probes, key=lambda p: (p.replicas, p.rate)):
            probe_rows.append(
                [
                    c.label,
                    p.kind,
                    num(p.rate, 4),
                    str(p.replicas),
                    str(p.requests),
                    *[fmt_time(p.metrics.get(x.metric, float("nan"))) for x in res.slos],
                    "yes" if p.ok else ("error" if p.status != "ok" else "no"),
                ]
            )
    rep.details(
        f"All {len(probe_rows)} simulations",
        [
            Table(
                [
                    "configuration",
                    "kind",
                    "rate (req/s)",
                    "replicas",
                    "requests",
                    *[x.name for x in res.slos],
                    "meets SLO",
                ],
                probe_rows,
                numeric={2, 3, 4, *range(5, 5 + len(res.slos))},
            )
        ],
    )
    return rep


def write_plan(res: PlanResult, out: Path, *, plots: bool = True, force: bool = False) -> dict[str, Path]:
    """The plan directory, written atomically: report.html, report.md, plan.json,
    configurations.csv, probes.csv, plots/. `force` lets it replace a folder infersim did not write."""
    out = Path(out)
    with staged_dir(out, command="plan", force=force) as tmp:
        images = _plots(res, tmp / "plots") if plots else []
        write_json(tmp / "plan.json", to_json(res))
        candidates_table(res).to_csv(tmp / "configurations.csv", index=False)
        probes_table(res).to_csv(tmp / "probes.csv", index=False)
        build_report(res, images).write(tmp)
    return {
        "html": out / "report.html",
        "md": out / "report.md",
        "json": out / "plan.json",
        "csv": out / "configurations.csv",
        "probes": out / "probes.csv",
        "plots": out / "plots",
    }


def probe_once(
    workload: str, overrides: dict[str, Any], rate: float, requests: int, seed: int, replicas: int = 1
) -> dict:
    """One probe as the search runs it (for checks and tests): the summary of a simulation of
    `requests` Poisson arrivals at `rate` with the candidate's overrides."""
    spec, wl_path = load_workload(workload)
    arr = spec.requests.arrival
    arrival = (
        arr.model_dump(mode="json") if arr is not None and arr.type in ("poisson", "gamma") else {"type": "poisson"}
    )
    c = Candidate("probe", dict(overrides), "", 1, None)
    s = _Search(
        c, spec.model_dump(mode="json"), str(wl_path.parent), [], SearchSection(requests=requests), None, seed, arrival
    )
    res = run_config(s.task(Probe(rate, replicas, requests)))
    if res["status"] != "ok":
        raise InfersimError(res["error"])
    return res["summary"]


__all__ = [
    "SLO",
    "parse_slo",
    "parse_duration",
    "parse_prices",
    "PlanFile",
    "load_plan_file",
    "plan",
    "write_plan",
    "rank",
    "verdict",
    "meets",
    "probe_once",
    "config_key",
]
