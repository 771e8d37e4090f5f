"""Goodput of colocated and disaggregated deployments of the same GPUs (`sim plan` with a
`disaggregation:` section or `--disaggregation GPUS`).

Goodput follows DistServe (Zhong et al., OSDI 2024, arXiv:2401.09670): the highest request
rate at which at least `attainment` (e.g. 90%) of the requests meet every SLO at once (each
request's own TTFT, TPOT, ...), divided by the GPUs the deployment uses. The SLOs' names give
the per-request metric and its limit; their percentile suffix is not used, the attainment
target takes its place (an aborted request meets no SLO).

The deployments: `gpus / tensor_parallel` colocated replicas, and every prefill:decode split of
as many replicas (or the `splits` given), each pool at `tensor_parallel`, with the section's
KV link (its unset fields: the cluster's per-GPU adapters, simulator/disaggregation/link.py).
Each deployment's goodput is searched like `sim plan`'s: Poisson arrivals at a probed rate
with a fixed seed, doubling or halving from the start rate to a passing and a failing rate,
then geometric bisection until failing/passing <= 1 + tolerance."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from infersim.simulator.disaggregation.link import describe_kv_link, resolve_kv_link
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.plots import REPRODUCIBLE_PNG, finish_figure, pyplot
from infersim.simulator.metrics.rundir import staged_dir, write_json
from infersim.simulator.metrics.summary import derived_columns
from infersim.simulator.parallel.config import ClusterSection
from infersim.simulator.preflight import check_workload
from infersim.simulator.progress import ProgressBar
from infersim.simulator.simulation import Simulation, simulate
from infersim.simulator.workload.builder import build_requests, load_workload
from infersim.simulator.workload.schema import WorkloadSpec
from infersim.simulator.yamlio import validate

from .goodput_config import GoodputSection
from .plan import _safe, fmt_time, probe_duration_s
from .sweep import resolve_config
from .sweep_backends import BackendOptions

# per-request columns (metrics/summary.py derived_columns) an attainment SLO may name
PER_REQUEST = ("ttft_s", "tpot_s", "e2e_s", "queueing_s", "normalized_latency_s")


@dataclass
class Deployment:
    label: str
    kind: str  # colocated | disaggregated
    gpus: int
    overrides: dict  # dotted workload paths


@dataclass
class DeploymentGoodput:
    label: str
    kind: str
    gpus: int
    status: str = "ok"  # ok | infeasible | failed
    error: Optional[str] = None
    goodput_rps: float = 0.0  # the deployment's, all its GPUs together
    fail_rate_rps: Optional[float] = None
    probes: list[dict] = field(default_factory=list)  # rate, attainment, requests

    @property
    def goodput_per_gpu(self) -> float:
        return self.goodput_rps / self.gpus


@dataclass
class GoodputComparison:
    workload: str
    model: str
    slos: list
    section: GoodputSection
    seed: int
    deployments: list[DeploymentGoodput]
    kv_link: dict = field(default_factory=dict)  # the disaggregated deployments' ResolvedKVLink.record()
    wall_s: float = 0.0

    def best(self, kind: str) -> Optional[DeploymentGoodput]:
        ok = [d for d in self.deployments if d.kind == kind and d.status == "ok"]
        return max(ok, key=lambda d: d.goodput_per_gpu, default=None)

    def winner(self) -> str:
        """colocated, disaggregated, or tie (within the search's tolerance) on goodput per GPU."""
        c, d = self.best("colocated"), self.best("disaggregated")
        gc = c.goodput_per_gpu if c else 0.0
        gd = d.goodput_per_gpu if d else 0.0
        if gc == gd:
            return "tie"
        return "disaggregated" if gd > gc else "colocated"


def build_deployments(section: GoodputSection, source: str = "plan file") -> list[Deployment]:
    tp = section.tensor_parallel or 1
    if section.gpus % tp:
        raise InfersimError(
            f"{source}: field 'disaggregation.gpus': {section.gpus} GPUs do not split into replicas of "
            f"tensor_parallel {tp}"
        )
    n = section.gpus // tp
    if n < 2:
        raise InfersimError(
            f"{source}: field 'disaggregation.gpus': a disaggregated deployment needs two replicas or more"
        )
    splits = [tuple(int(x) for x in s.split(":")) for s in section.splits] or [(p, n - p) for p in range(1, n)]
    for p, d in splits:
        if p + d != n:
            raise InfersimError(f"{source}: field 'disaggregation.splits': {p}:{d} is not {n} replicas of {tp} GPUs")
    out = [
        Deployment(
            f"colocated {n}x tp{tp}",
            "colocated",
            section.gpus,
            {"hardware.replicas": n, "hardware.tensor_parallel": tp, "hardware.router": "least_outstanding"},
        )
    ]
    link = section.link.model_dump(mode="json", exclude_none=True)  # unset fields: the cluster's adapters
    for p, d in splits:
        pools = {
            "prefill": {"replicas": p, "tensor_parallel": tp, "router": "least_outstanding"},
            "decode": {"replicas": d, "tensor_parallel": tp, "router": "least_outstanding"},
            "link": link,
            "layerwise_streaming": section.layerwise_streaming,
        }
        out.append(
            Deployment(
                f"disaggregated {p}P:{d}D tp{tp}",
                "disaggregated",
                section.gpus,
                # the pools give replicas and tensor parallelism; the workload's own must step aside
                {
                    "hardware.disaggregated": pools,
                    "hardware.replicas": 1,
                    "hardware.tensor_parallel": 1,
                    "hardware.pipeline_parallel": 1,
                },
            )
        )
    return out


def slo_attainment(requests: dict, limits: dict[str, float]) -> float:
    """Fraction of all requests that met every per-request limit (column -> seconds); a TPOT of
    a one-token request (none) meets its limit, an aborted request meets none."""
    cols = derived_columns(requests)
    ok = requests["aborted"] == 0
    for col, limit in limits.items():
        v = cols[col]
        ok &= (v <= limit) | (np.isnan(v) & (col == "tpot_s"))
    return float(ok.mean()) if ok.size else 0.0


def _probe(task: dict, rate: float) -> dict:
    s = task["search"]
    count = min(s["max_requests"], max(s["requests"], math.ceil(rate * s["min_duration_s"])))
    over = {
        "requests.arrival": {"type": "poisson", "rate": float(rate)},
        "requests.count": count,
        "requests.duration_s": None,
        "seed": task["seed"],
    }
    spec = WorkloadSpec.model_validate(resolve_config(task["config"], over))
    res = simulate(spec, build_requests(spec, task["base_dir"]))
    att = slo_attainment(res.requests, task["limits"])
    return {"rate": float(rate), "requests": count, "attainment": att, "ok": att >= task["attainment"]}


def search_goodput(task: dict) -> dict:
    """One deployment's goodput search, every probe in this process (a backend worker runs it).
    Never raises: a failure is returned."""
    t0 = time.perf_counter()
    s, probes = task["search"], []

    def passes(rate: float) -> bool:
        probes.append(_probe(task, rate))
        return probes[-1]["ok"]

    try:
        lo, hi = None, None
        rate = min(max(s["start_rate"], s["min_rate"]), s["max_rate"])
        if passes(rate):
            lo = rate
        else:
            hi = rate
        while lo is None or hi is None:
            nxt = lo * 2 if hi is None else hi / 2
            if not s["min_rate"] <= nxt <= s["max_rate"]:
                break
            if passes(nxt):
                lo = nxt
            else:
                hi = nxt
        if lo is None:
            return {
                "status": "infeasible",
                "goodput_rps": 0.0,
                "fail_rate_rps": hi,
                "probes": probes,
                "error": f"misses the attainment even at {s['min_rate']:g} req/s",
                "wall_s": time.perf_counter() - t0,
            }
        while hi is not None and hi / lo > 1 + s["tolerance"]:
            mid = math.sqrt(lo * hi)
            if passes(mid):
                lo = mid
            else:
                hi = mid
        return {
            "status": "ok",
            "goodput_rps": lo,
            "fail_rate_rps": hi,
            "probes": probes,
            "error": None,
            "wall_s": time.perf_counter() - t0,
        }
    except InfersimError as exc:
        return {
            "status": "failed",
            "goodput_rps": 0.0,
            "fail_rate_rps": None,
            "probes": probes,
            "error": str(exc),
            "wall_s": time.perf_counter() - t0,
        }


def _check_deployment(config: dict, wl_path: Path, label: str) -> None:
    """Refuse before the search a deployment that cannot run: the workload's checks, and its
    replicas built on one request, which plans their memory (weights that do not fit a pool's
    GPUs are refused there)."""
    where = f"{wl_path} as {label}"
    spec = validate(WorkloadSpec, config, where)
    check_workload(spec, where, allow_large=True)
    one = WorkloadSpec.model_validate(resolve_config(config, {"requests.count": 1, "requests.duration_s": None}))
    Simulation(one, build_requests(one, wl_path.parent), source=where)


def compare_goodput(
    workload: str,
    *,
    slos: list,
    section: GoodputSection,
    search,
    seed: Optional[int] = None,
    run: BackendOptions = BackendOptions(),
    source: str = "plan file",
) -> GoodputComparison:
    """Every deployment's goodput (see the module docstring); `search` is the plan's
    SearchSection (requests per probe, start rate, bounds, tolerance, min_duration_s)."""
    t0 = time.perf_counter()
    limits = {}
    for s in slos:
        col = s.metric.split(".")[0]
        if col not in PER_REQUEST:
            raise InfersimError(
                f"SLO '{s.name}' is not a per-request metric: goodput needs {', '.join(c[:-2] for c in PER_REQUEST)}"
            )
        limits[col] = min(s.limit_s, limits.get(col, math.inf))
    spec, wl_path = load_workload(workload)
    seed = spec.seed if seed is None else seed
    base = spec.model_dump(mode="json")
    if section.tensor_parallel is None:  # the workload's degree, as sized for its model
        section = section.model_copy(update={"tensor_parallel": spec.hardware.tensor_parallel})
    deps = build_deployments(section, source)
    for d in deps:
        _check_deployment(resolve_config(base, d.overrides), wl_path, d.label)
    rate = spec.requests.arrival.rate if getattr(spec.requests.arrival, "rate", None) else 1.0
    s = search.model_dump()
    s.update(start_rate=search.start_rate or rate, min_duration_s=probe_duration_s(search, slos))
    tasks = [
        {
            "config": resolve_config(base, d.overrides),
            "base_dir": str(wl_path.parent),
            "limits": limits,
            "attainment": section.attainment,
            "search": s,
            "seed": seed,
        }
        for d in deps
    ]
    be = run.make()
    results = []
    try:
        with ProgressBar("goodput", quiet=run.quiet, total=len(tasks), fields="deployments") as bar:
            futs = [be.submit(search_goodput, t) for t in tasks]
            for f in futs:
                results.append(_safe(f))
                bar.update(advance=1)
    finally:
        be.close()
    out = []
    for d, r in zip(deps, results):
        out.append(
            DeploymentGoodput(
                d.label,
                d.kind,
                d.gpus,
                r["status"],
                r.get("error"),
                r.get("goodput_rps", 0.0),
                r.get("fail_rate_rps"),
                r.get("probes", []),
            )
        )
    tp = section.tensor_parallel
    inter_node = (spec.hardware.cluster or ClusterSection()).inter_node
    link = resolve_kv_link(section.link, inter_node, tp, tp).record()
    return GoodputComparison(spec.name, spec.model, slos, section, seed, out, link, time.perf_counter() - t0)


def goodput_table(res: GoodputComparison):
    return pd.DataFrame(
        [
            {
                "deployment": d.label,
                "kind": d.kind,
                "gpus": d.gpus,
                "goodput_rps": d.goodput_rps,
                "goodput_per_gpu_rps": d.goodput_per_gpu,
                "fail_rate_rps": d.fail_rate_rps,
                "status": d.status,
                "error": d.error or "",
            }
            for d in res.deployments
        ]
    )


def _markdown(res: GoodputComparison, image: Optional[str]) -> str:
    sec = res.section
    slos = ", ".join(f"{s.name.rsplit('_', 1)[0].upper()} ≤ {fmt_time(s.limit_s)}" for s in res.slos)
    lines = [
        f"# Goodput: colocated vs disaggregated ({res.workload}, {res.model})",
        "",
        f"{sec.gpus} GPUs per deployment; SLOs per request: {slos}; goodput = the highest Poisson rate at which "
        f"at least {sec.attainment:.0%} of the requests meet every SLO, per GPU (DistServe's definition). "
        f"KV link {describe_kv_link(res.kv_link)}"
        f"{', layer-wise streaming' if sec.layerwise_streaming else ''}; seed {res.seed}.",
        "",
        "| deployment | goodput (req/s) | per GPU (req/s) | first failing rate | status |",
        "|---|---:|---:|---:|---|",
    ]
    for d in res.deployments:
        fail = f"{d.fail_rate_rps:.3g}" if d.fail_rate_rps else "-"
        lines.append(f"| {d.label} | {d.goodput_rps:.3g} | {d.goodput_per_gpu:.3g} | {fail} | {d.status} |")
    lines += ["", f"**Higher goodput per GPU: {res.winner()}.**", ""]
    if image:
        lines += [f"![attainment against rate]({image})", ""]
    return "\n".join(lines)


def _plot(res: GoodputComparison, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for d in res.deployments:
        pts = sorted((p["rate"] / d.gpus, p["attainment"]) for p in d.probes)
        if pts:
            ax.plot(
                *zip(*pts),
                marker="o",
                ms=3,
                lw=1.2 if d.kind == "colocated" else 0.9,
                ls="-" if d.kind == "colocated" else "--",
                label=d.label,
            )
    ax.axhline(res.section.attainment, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("request rate per GPU (req/s)")
    ax.set_ylabel("fraction meeting every SLO")
    ax.set_title(f"{res.workload}: {res.section.gpus} GPUs, colocated and disaggregated", fontsize=10)
    ax.legend(fontsize=8)
    finish_figure(fig, path, **REPRODUCIBLE_PNG)


def write_goodput(res: GoodputComparison, out: Path, *, plots: bool = True, force: bool = False) -> dict[str, Path]:
    """goodput.md, goodput.json, goodput.csv and goodput.png in `out`, written atomically."""
    out = Path(out)
    with staged_dir(out, command="plan", force=force) as tmp:
        image = None
        if plots:
            _plot(res, tmp / "goodput.png")
            image = "goodput.png"
        (tmp / "goodput.md").write_text(_markdown(res, image))
        goodput_table(res).to_csv(tmp / "goodput.csv", index=False)
        write_json(
            tmp / "goodput.json",
            {
                "workload": res.workload,
                "model": res.model,
                "slos": {s.name: s.limit_s for s in res.slos},
                "section": res.section.model_dump(mode="json"),
                "kv_link": res.kv_link,
                "seed": res.seed,
                "winner": res.winner(),
                "deployments": [asdict(d) for d in res.deployments],
                "wall_s": res.wall_s,
            },
        )
    return {
        "md": out / "goodput.md",
        "json": out / "goodput.json",
        "csv": out / "goodput.csv",
        "png": out / "goodput.png",
    }
