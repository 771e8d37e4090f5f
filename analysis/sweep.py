"""`sim sweep`: explore a space of serving configurations, as a grid or with Optuna.

A parameter is any dotted path into the workload file (`serving.preemption`,
`hardware.profile`, `hardware.tensor_parallel`, `serving.max_batch_size`,
`requests.arrival.rate`, `speculation.s`, ...). A configuration is the workload with one value
per parameter set; its key is a hash of that resolved configuration. Each configuration's
result (metrics, or the error that stopped it) is written atomically as its own file,
`<sweep dir>/results/<key>.json`, by the driver alone; the table (results.parquet/.csv) and
the plots are rebuilt from those files. A sweep that is killed and started again skips every
configuration that has a file, so nothing finished is recomputed, lost or counted twice. A
configuration whose override fails validation, or whose simulation raises, is recorded as
failed with its error, and the sweep goes on.

The space file:

    name: policy-search
    method: grid                # grid | optuna
    parameters:
      serving.scheduler: [fcfs, fairness]                   # a list: categorical values
      serving.preemption: {values: [recompute, swap]}       # the same, spelled out
      serving.max_batch_size: {low: 32, high: 256, num: 4, log: true}  # a numeric range
      requests.arrival.rate: {low: 2.0, high: 12.0, step: 2.0}   # 4.0 is a float range, 4 an int one
    fixed: {requests.count: 400}                            # set in every configuration
    optuna: {trials: 40, sampler: tpe, seed: 0,
             objectives: [{metric: throughput_output_tokens_per_s, direction: maximize},
                          {metric: e2e_s.p99, direction: minimize}]}
    pareto: {throughput: throughput_output_tokens_per_s, latency: e2e_s.p99}
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import itertools
import json
import math
import os
import socket
import time
import uuid
from collections import deque
from concurrent.futures import FIRST_COMPLETED, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Optional, Union

import numpy as np
import pandas as pd
from pydantic import BaseModel, Discriminator, Field, PositiveInt, Tag, ValidationError, field_validator

from infersim.simulator.errors import InfersimError, pydantic_error_line
from infersim.simulator.metrics.plots import REPRODUCIBLE_PNG, finish_figure, pyplot
from infersim.simulator.metrics.rundir import StagedFiles, claim_dir, held_signals, staged_files
from infersim.simulator.metrics.summary import CORE_METRICS, FEATURE_SECTIONS
from infersim.simulator.preflight import traced_requests
from infersim.simulator.progress import ProgressBar
from infersim.simulator.validation import STRICT_CONFIG, check_memory, expected_requests, in_field, simulation_bytes
from infersim.simulator.workload.builder import FILE_FIELDS, find_beside, load_workload
from infersim.simulator.workload.schema import WorkloadSpec
from infersim.simulator.yamlio import load_model_file, validate, write_atomic

from .report_html import md_table
from .sweep_backends import BackendOptions

# ---------------------------------------------------------------------------------------------
# configurations: dotted overrides, keys, evaluation (shared with `sim plan`)


def set_dotted(d: dict, path: str, value: Any) -> None:
    """Set `a.b.c` in nested dicts, creating (or replacing a null with) a dict on the way; a
    number steps into a list (`speculation.drafts.0.acceptance.alpha`). A null value under a
    section that is absent or null leaves it so: `speculation.s: null` means "no speculation",
    not an empty speculation section."""
    parts = path.split(".")
    if not all(parts):
        raise InfersimError(f"bad parameter path '{path}'")
    cur = d
    for p in parts[:-1]:
        if isinstance(cur, list):
            cur = cur[_list_index(cur, p, path)]
            continue
        nxt = cur.get(p)
        if not isinstance(nxt, (dict, list)):
            if value is None:
                return
            nxt = cur[p] = {}
        cur = nxt
    if isinstance(cur, list):
        cur[_list_index(cur, parts[-1], path)] = value
    else:
        cur[parts[-1]] = value


def _list_index(items: list, part: str, path: str) -> int:
    if not part.isdigit() or int(part) >= len(items):
        raise InfersimError(f"'{part}' is not an index of the {len(items)} items at this point of '{path}' (0-based)")
    return int(part)


def get_dotted(d: dict, path: str, default: Any = None) -> Any:
    cur: Any = d
    for p in path.split("."):
        if isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
            cur = cur[int(p)]
        elif isinstance(cur, dict) and p in cur:
            cur = cur[p]
        else:
            return default
    return cur


def resolve_config(base: dict, overrides: dict[str, Any]) -> dict:
    """The workload (as a plain dict) with the dotted overrides applied, in order."""
    cfg = copy.deepcopy(base)
    for path, value in overrides.items():
        set_dotted(cfg, path, value)
    return cfg


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def config_key(config: dict) -> str:
    """A short stable hash of a resolved configuration: the name of its result file."""
    return hashlib.sha256(_canonical(config).encode()).hexdigest()[:20]


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'ttft_s': {'p99': 1}} -> {'ttft_s.p99': 1}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, name + "."))
        else:
            out[name] = v
    return out


def _clean_number(v):
    if isinstance(v, (np.floating, float)):
        return None if not math.isfinite(float(v)) else float(v)
    if isinstance(v, np.integer):
        return int(v)
    return v


def run_config(task: dict) -> dict:
    """Validate and simulate one configuration; never raises. `task`: {'config': workload dict,
    'base_dir': folder for relative paths}. Returns {'status': 'ok'|'failed', 'summary' or
    'error', 'wall_s', 'worker'}."""
    t0 = time.perf_counter()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    try:
        from infersim.simulator.metrics.summary import summarize
        from infersim.simulator.simulation import simulate
        from infersim.simulator.workload.builder import build_requests
        from infersim.simulator.workload.schema import WorkloadSpec

        try:
            spec = WorkloadSpec.model_validate(task["config"])
        except ValidationError as exc:
            raise InfersimError(pydantic_error_line("configuration", exc)) from None
        requests = build_requests(spec, task.get("base_dir") or ".")
        summary = summarize(simulate(spec, requests))
        return {
            "status": "ok",
            "summary": json.loads(json.dumps(summary, default=_clean_number)),
            "error": None,
            "wall_s": time.perf_counter() - t0,
            "worker": worker,
        }
    except InfersimError as exc:
        err = str(exc)
    except Exception as exc:  # a bug or an unexpected input: recorded, the sweep goes on
        first = str(exc).splitlines()[0] if str(exc) else ""
        err = f"{exc.__class__.__name__}: {first}"
    return {"status": "failed", "summary": None, "error": err, "wall_s": time.perf_counter() - t0, "worker": worker}


# ---------------------------------------------------------------------------------------------
# the space


class _Strict(BaseModel):
    model_config = STRICT_CONFIG


class ValuesParam(_Strict):
    values: list[Any] = Field(min_length=1)


class RangeParam(_Strict):
    # int or float as written: `low: 4` is an integer range, `low: 4.0` a real one
    low: Union[int, float]
    high: Union[int, float]
    num: Optional[PositiveInt] = None  # grid: this many points, evenly spaced (geometric if log)
    step: Optional[Union[int, float]] = Field(None, gt=0)
    log: bool = False
    integer: Optional[bool] = None  # None: integers when low, high (and step) are written as integers

    @field_validator("high")
    @classmethod
    def _order(cls, v, info):
        if "low" in info.data and v < info.data["low"]:
            raise ValueError("high must be >= low")
        return v


def _param_kind(v: Any) -> str | None:
    """Which form a parameter is written in, so an error speaks of that form alone."""
    if isinstance(v, (list, ValuesParam, RangeParam)):
        return {list: "list", ValuesParam: "values", RangeParam: "range"}[type(v)]
    if isinstance(v, dict):
        return "values" if "values" in v else "range"
    return None


ParamSpec = Annotated[
    Union[
        Annotated[ValuesParam, Tag("values")], Annotated[RangeParam, Tag("range")], Annotated[list[Any], Tag("list")]
    ],
    Discriminator(
        _param_kind,
        custom_error_type="parameter_form",
        custom_error_message="give a list of values, {values: [...]}, or a range {low, high} (with num or step)",
    ),
]


class Objective(_Strict):
    metric: str
    direction: Literal["maximize", "minimize"]


def _default_objectives():
    return [
        Objective(metric="throughput_output_tokens_per_s", direction="maximize"),
        Objective(metric="e2e_s.p99", direction="minimize"),
    ]


class OptunaSection(_Strict):
    trials: PositiveInt = 30
    objectives: list[Objective] = Field(default_factory=_default_objectives, min_length=1)
    sampler: Literal["tpe", "nsga2", "random"] = "tpe"
    seed: int = Field(0, ge=0, le=2**32 - 1)  # Optuna samplers take numpy's legacy 32-bit seeds


class ParetoSection(_Strict):
    throughput: str = "throughput_output_tokens_per_s"  # maximised
    latency: str = "e2e_s.p99"  # minimised


class SweepSpace(_Strict):
    name: Optional[str] = None
    description: str = ""
    method: Literal["grid", "optuna"] = "grid"
    parameters: dict[str, ParamSpec] = Field(min_length=1)
    fixed: dict[str, Any] = Field(default_factory=dict)
    optuna: OptunaSection = OptunaSection()
    pareto: ParetoSection = ParetoSection()

    @field_validator("parameters", mode="before")
    @classmethod
    def _values_given(cls, v):
        empty = [k for k, x in v.items() if isinstance(x, list) and not x] if isinstance(v, dict) else []
        if empty:
            raise ValueError(f"parameter '{empty[0]}' has no values; give at least one")
        return v


@dataclass
class Param:
    path: str
    kind: str  # categorical | int | float
    values: list = field(default_factory=list)  # categorical, or the grid points of a range
    low: float = 0.0
    high: float = 0.0
    step: float | None = None
    log: bool = False


def build_params(space: SweepSpace) -> list[Param]:
    out = []
    for path, spec in space.parameters.items():
        if isinstance(spec, list):
            spec = ValuesParam(values=spec)
        if isinstance(spec, ValuesParam):
            if not spec.values:
                raise InfersimError(f"parameter '{path}': give at least one value")
            out.append(Param(path, "categorical", list(spec.values)))
            continue
        integer = (
            spec.integer
            if spec.integer is not None
            else all(isinstance(x, int) and not isinstance(x, bool) for x in (spec.low, spec.high, spec.step or 1))
        )
        if spec.log and spec.low <= 0:
            raise InfersimError(f"parameter '{path}': a log range needs low > 0")
        if spec.num is not None:
            pts = (
                np.geomspace(spec.low, spec.high, spec.num) if spec.log else np.linspace(spec.low, spec.high, spec.num)
            )
        elif spec.step is not None:
            pts = np.arange(spec.low, spec.high + spec.step * 1e-9, spec.step)
        elif integer and spec.high - spec.low <= 64 and not spec.log:
            pts = np.arange(spec.low, spec.high + 1)
        else:
            pts = None  # continuous: Optuna only
        values = []
        if pts is not None:
            conv = (lambda x: int(round(x))) if integer else (lambda x: float(round(x, 12)))
            values = list(dict.fromkeys(conv(x) for x in pts))
        out.append(Param(path, "int" if integer else "float", values, spec.low, spec.high, spec.step, spec.log))
    return out


def grid_points(params: list[Param]) -> list[dict[str, Any]]:
    """Every combination, in the order the parameters are listed (the last varies fastest)."""
    for p in params:
        if not p.values:
            raise InfersimError(
                f"parameter '{p.path}': a grid needs values, or num or step for a range "
                f"(a continuous range is for method: optuna)"
            )
    return [dict(zip([p.path for p in params], combo)) for combo in itertools.product(*[p.values for p in params])]


# A queued configuration holds its resolved workload (2.3 KB measured with tracemalloc on the
# examples' workload); rounded up for its result record and table row.
BYTES_PER_CONFIGURATION = 4096


def _range_size(spec: RangeParam, integer: bool) -> int:
    """Grid points of a range, counted without building them (0: continuous, Optuna only)."""
    if spec.num is not None:
        return spec.num
    if spec.step is not None:
        return int(math.floor((spec.high - spec.low) / spec.step + 1e-9)) + 1
    if integer and spec.high - spec.low <= 64 and not spec.log:
        return int(spec.high - spec.low) + 1
    return 0


def space_size(space: SweepSpace, source: str) -> int:
    """Configurations the space asks for: the grid's product, or Optuna's trials."""
    if space.method == "optuna":
        return space.optuna.trials
    total = 1
    for path, spec in space.parameters.items():
        if isinstance(spec, RangeParam):
            integer = (
                spec.integer
                if spec.integer is not None
                else all(isinstance(x, int) and not isinstance(x, bool) for x in (spec.low, spec.high, spec.step or 1))
            )
            n = _range_size(spec, integer)
            if n == 0:
                raise InfersimError(
                    f"{source}: parameter '{path}': a grid needs values, or num or step for a range "
                    f"(a continuous range is for method: optuna)"
                )
        else:
            n = len(spec if isinstance(spec, list) else spec.values)
        total *= n
    return total


def check_space(space: SweepSpace, spec, source: str, run: BackendOptions, base_dir: Path) -> list[Param]:
    """Refuse, before anything is written, a space that cannot run: a grid over a continuous
    range, an unknown metric, or more configurations than memory holds (the requests of a trace
    in `base_dir` counted). Returns the parameters. (A configuration the workload schema rejects
    is a result: it is recorded as failed and the sweep goes on.)"""
    check_metrics(space, source)
    for path in space.parameters:  # a list index out of range, before anything is written
        in_field(source, f"parameters.{path}", resolve_config, spec.model_dump(mode="json"), {path: 0})
    n = space_size(space, source)
    parallel = min(run.workers or os.cpu_count() or 1, n)  # no more simulations at once than configurations
    requests = max(expected_requests(spec), traced_requests(spec, base_dir) or 0)
    check_memory(
        n * BYTES_PER_CONFIGURATION + simulation_bytes(requests, parallel),
        f"{source}: field '{'optuna.trials' if space.method == 'optuna' else 'parameters'}': "
        f"{n:,} configurations on {parallel} worker{'s' if parallel != 1 else ''}",
        run.allow_large,
    )
    return build_params(space)


def check_metrics(space: SweepSpace, source: str) -> None:
    """Refuse an Optuna objective or a Pareto axis that names no metric of a run summary (a
    name in a section a feature adds, `speculation.*`, is checked when its first run ends)."""
    named = [(f"pareto.{axis}", getattr(space.pareto, axis)) for axis in ("throughput", "latency")]
    if space.method == "optuna":
        named += [(f"optuna.objectives.{i}.metric", o.metric) for i, o in enumerate(space.optuna.objectives)]
    for field_name, metric in named:
        if metric in CORE_METRICS or metric.split(".")[0] in FEATURE_SECTIONS:
            continue
        close = difflib.get_close_matches(metric, sorted(CORE_METRICS), n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(sorted(CORE_METRICS))}"
        raise InfersimError(f"{source}: field '{field_name}': unknown metric '{metric}'; {hint}")


def load_space(path: str | Path) -> SweepSpace:
    """The space file, its `model` / `hardware.profile` files found beside it (`files_beside`)."""
    return files_beside(load_model_file(SweepSpace, path), Path(path).parent)


def files_beside(space: SweepSpace, folder: Path) -> SweepSpace:
    """The space with each `model` / `hardware.profile` value (a parameter's or a `fixed` one)
    that names a file the current folder lacks but `folder` holds named by its path from here:
    the rule a workload's own fields follow (the current folder's file wins)."""

    def found(path: str, value: Any) -> Any:
        return find_beside(value, folder) if path in FILE_FIELDS and isinstance(value, str) else value

    parameters = {}
    for path, spec in space.parameters.items():
        if isinstance(spec, list):
            spec = [found(path, v) for v in spec]
        elif isinstance(spec, ValuesParam):
            spec = ValuesParam(values=[found(path, v) for v in spec.values])
        parameters[path] = spec
    fixed = {path: found(path, v) for path, v in space.fixed.items()}
    return space.model_copy(update={"parameters": parameters, "fixed": fixed})


# ---------------------------------------------------------------------------------------------
# the sweep directory: one file per configuration


RESULTS = "results"


def _result_path(sweep_dir: Path, key: str) -> Path:
    return sweep_dir / RESULTS / f"{key}.json"


def load_results(sweep_dir: Path) -> dict[str, dict]:
    """Every finished configuration's record, by key (temporary and unreadable files skipped)."""
    out = {}
    folder = Path(sweep_dir) / RESULTS
    if not folder.is_dir():
        return out
    for p in sorted(folder.glob("*.json")):
        if p.name.startswith("."):
            continue
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("key") == p.stem:
            out[p.stem] = rec
    return out


def _write_record(sweep_dir: Path, rec: dict) -> None:
    write_atomic(_result_path(sweep_dir, rec["key"]), json.dumps(rec, indent=1, sort_keys=True, default=str) + "\n")


def _identity(base: dict, space: SweepSpace) -> dict:
    """What makes two invocations the same sweep (the trial budget may grow between them)."""
    return {
        "workload": config_key(base),
        "method": space.method,
        "parameters": json.loads(
            _canonical({k: (v.model_dump() if isinstance(v, BaseModel) else v) for k, v in space.parameters.items()})
        ),
        "objectives": [o.model_dump() for o in space.optuna.objectives] if space.method == "optuna" else None,
    }


@dataclass
class SweepOutcome:
    sweep_dir: Path
    table: Any  # pandas DataFrame, one row per configuration
    computed: int  # configurations simulated by this invocation
    cached: int  # configurations found already finished
    failed: int  # rows with status 'failed'
    wall_s: float
    backend: str
    files: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class SweepOptions:
    """How one invocation of a sweep treats its folder and what it writes, apart from where the
    simulations run (BackendOptions)."""

    retry_failed: bool = field(default=False, metadata={"help": "simulate again the configurations that failed"})
    trials: int | None = field(default=None, metadata={"help": "optuna trial budget; None: the space file's"})
    plots: bool = field(default=True, metadata={"help": "draw the sweep's plots"})
    on_record: Callable[[dict], None] | None = field(
        default=None, metadata={"help": "called with each new result record after its file is written"}
    )
    force: bool = field(
        default=False, metadata={"help": "use an output folder infersim did not write (rundir.check_out_dir)"}
    )


def run_sweep(
    workload: str,
    space: SweepSpace | str | Path,
    out: str | Path | None = None,
    *,
    run: BackendOptions = BackendOptions(),
    options: SweepOptions = SweepOptions(),
    source: str = "space",
) -> SweepOutcome:
    """Run (or resume) a sweep and rebuild its table and plots. The folder must be new, empty or
    an infersim folder (`options.force` allows any other; rundir.check_out_dir)."""
    t0 = time.perf_counter()
    if not isinstance(space, SweepSpace):
        space = load_space(space)
    if options.trials is not None:
        space = space.model_copy(update={"optuna": space.optuna.model_copy(update={"trials": options.trials})})
    spec, wl_path = load_workload(workload)
    space = files_beside(space, wl_path.parent)  # after the space file's folder (load_space)
    base = resolve_config(spec.model_dump(mode="json"), space.fixed)
    base_spec = validate(WorkloadSpec, base, f"{wl_path} with the space's 'fixed' overrides")
    params = check_space(space, base_spec, source, run, wl_path.parent)  # before anything is written
    name = space.name or spec.name
    sweep_dir = Path(out) if out is not None else Path("sweeps") / name
    claim_dir(sweep_dir, command="sweep", force=options.force)
    (sweep_dir / RESULTS).mkdir(parents=True, exist_ok=True)
    identity = _identity(base, space)
    manifest_path = sweep_dir / "sweep.json"
    if manifest_path.exists():
        try:
            old = json.loads(manifest_path.read_text()).get("identity")
        except (OSError, ValueError):
            old = None
        if old is not None and old != identity:
            raise InfersimError(
                f"{sweep_dir} holds a different sweep (other workload, parameters or "
                f"objectives); give another --out or remove that folder"
            )
    write_atomic(
        manifest_path,
        json.dumps(
            {"identity": identity, "space": space.model_dump(mode="json"), "workload_file": str(wl_path), "base": base},
            indent=1,
            sort_keys=True,
            default=str,
        )
        + "\n",
    )
    records = load_results(sweep_dir)
    if options.retry_failed:
        records = {k: r for k, r in records.items() if r.get("status") == "ok"}
    run_id = uuid.uuid4().hex[:12]
    ctx = _Ctx(sweep_dir, base, str(wl_path.parent), records, run_id, options.on_record)

    be = run.make()
    cancel = True
    try:
        with _Progress(run.quiet, name, be.describe()) as prog:
            if space.method == "grid":
                _run_grid(ctx, be, params, prog)
            else:
                _run_optuna(ctx, be, params, space.optuna, prog)
        cancel = False
    finally:
        be.close(cancel=cancel)
    table = build_table(sweep_dir, params)
    files = write_outputs(sweep_dir, table, params, space, plots=options.plots)
    failed = int((table["status"] == "failed").sum()) if len(table) else 0
    return SweepOutcome(
        sweep_dir, table, ctx.computed, ctx.cached, failed, time.perf_counter() - t0, be.describe(), files
    )


@dataclass
class _Ctx:
    sweep_dir: Path
    base: dict
    base_dir: str
    records: dict
    run_id: str
    on_record: Any
    computed: int = 0
    cached: int = 0

    def task(self, params: dict) -> tuple[str, dict]:
        cfg = resolve_config(self.base, params)
        return config_key(cfg), {"config": cfg, "base_dir": self.base_dir}

    def finish(self, key: str, index: int, params: dict, task: dict, res: dict) -> dict:
        metrics = flatten(res["summary"]) if res.get("summary") else {}
        rec = {
            "key": key,
            "index": index,
            "params": params,
            "status": res["status"],
            "error": res["error"],
            "metrics": metrics,
            "wall_s": res["wall_s"],
            "worker": res["worker"],
            "run_id": self.run_id,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "config": task["config"],
        }
        _write_record(self.sweep_dir, rec)
        self.records[key] = rec
        self.computed += 1
        if self.on_record:
            self.on_record(rec)
        return rec


def _future_result(fut) -> dict:
    try:
        return fut.result()
    except BrokenProcessPool:
        # the pool is gone with every pending configuration: record none of them as failed
        raise InfersimError(
            "a worker process died (out of memory or killed); finished results are kept: "
            "run the same command again to resume (fewer --workers use less memory)"
        ) from None
    except Exception as exc:  # a Ray task whose worker died
        return {
            "status": "failed",
            "summary": None,
            "error": f"worker failed: {exc.__class__.__name__}: " f"{str(exc).splitlines()[0] if str(exc) else ''}",
            "wall_s": 0.0,
            "worker": "?",
        }


def _run_grid(ctx: _Ctx, be, params: list[Param], prog) -> None:
    fn = run_config
    points = grid_points(params)
    todo = []
    seen = set()
    for i, pt in enumerate(points):
        key, task = ctx.task(pt)
        if key in seen:
            continue  # two grid points resolving to the same configuration are one configuration
        seen.add(key)
        if key in ctx.records:
            ctx.cached += 1
        else:
            todo.append((i, pt, key, task))
    prog.start(len(seen), ctx.cached)
    pending = {}
    it = iter(todo)
    # a few queued per worker keeps a pool busy; in process, one at a time (each written at once)
    limit = 1 if getattr(be, "inline", False) else max(1, be.workers) * 2
    while True:
        while len(pending) < limit:
            nxt = next(it, None)
            if nxt is None:
                break
            pending[be.submit(fn, nxt[3])] = nxt
        if not pending:
            break
        done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
        for fut in done:
            i, pt, key, task = pending.pop(fut)
            rec = ctx.finish(key, i, pt, task, _future_result(fut))
            prog.advance(rec)


def _optuna_distributions(params: list[Param]):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    dists, codecs = {}, {}
    for p in params:
        if p.kind == "categorical":
            primitive = all(v is None or isinstance(v, (bool, int, float, str)) for v in p.values)
            choices = p.values if primitive else [_canonical(v) for v in p.values]
            dists[p.path] = CategoricalDistribution(choices)
            codecs[p.path] = (lambda v: v) if primitive else (lambda v, _m=dict(zip(choices, p.values)): _m[v])
        elif p.kind == "int":
            step = int(p.step) if p.step else 1
            dists[p.path] = IntDistribution(int(p.low), int(p.high), log=p.log and step == 1, step=step)
            codecs[p.path] = int
        else:
            dists[p.path] = FloatDistribution(
                float(p.low), float(p.high), log=p.log and not p.step, step=float(p.step) if p.step else None
            )
            codecs[p.path] = float
    return dists, codecs


def _encode(params: list[Param], values: dict) -> dict:
    out = {}
    for p in params:
        v = values.get(p.path)
        if p.kind == "categorical" and not all(x is None or isinstance(x, (bool, int, float, str)) for x in p.values):
            v = _canonical(v)
        out[p.path] = v
    return out


def _objective_values(rec: dict, objectives) -> list[float] | None:
    if rec.get("status") != "ok":
        return None
    vals = []
    for o in objectives:
        v = rec["metrics"].get(o.metric)
        if o.metric not in rec["metrics"]:
            known = ", ".join(sorted(k for k, x in rec["metrics"].items() if isinstance(x, (int, float))))
            raise InfersimError(f"unknown objective metric '{o.metric}'; known: {known}")
        if v is None or not math.isfinite(float(v)):
            return None
        vals.append(float(v))
    return vals


def _run_optuna(ctx: _Ctx, be, params: list[Param], opt: OptunaSection, prog) -> None:
    try:
        import optuna
    except ImportError:
        raise InfersimError("method: optuna needs Optuna: pip install 'infersim[search]'") from None
    from optuna.trial import TrialState, create_trial

    fn = run_config
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists, codecs = _optuna_distributions(params)
    sampler = {
        "tpe": lambda: optuna.samplers.TPESampler(seed=opt.seed),
        "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=opt.seed),
        "random": lambda: optuna.samplers.RandomSampler(seed=opt.seed),
    }[opt.sampler]()
    study = optuna.create_study(directions=[o.direction for o in opt.objectives], sampler=sampler)
    # a resumed sweep: what is on disk becomes the study's history
    for rec in sorted(ctx.records.values(), key=lambda r: r.get("index", 0)):
        enc = _encode(params, rec["params"])
        if not all(k in enc and _contains(dists[k], enc[k]) for k in dists):
            continue  # a record outside the current distributions: kept in the table, not taught
        vals = _objective_values(rec, opt.objectives)
        try:
            study.add_trial(
                create_trial(params=enc, distributions=dists, values=vals)
                if vals is not None
                else create_trial(params=enc, distributions=dists, state=TrialState.FAIL)
            )
        except ValueError:
            pass  # a record outside the current distributions: kept in the table, not taught
    ctx.cached = len(ctx.records)
    target = opt.trials
    prog.start(max(target, ctx.cached), ctx.cached)
    next_index = max([r.get("index", -1) for r in ctx.records.values()], default=-1) + 1
    trials = _OrderedTrials(ctx, study, opt.objectives, prog)
    workers = max(1, be.workers)
    attempts, max_attempts = 0, target * 20 + 100
    while True:
        while trials.started() < target and attempts < max_attempts:
            if len(trials.inflight) >= workers:
                trials.tell_oldest()
                continue
            attempts += 1
            trial = study.ask(dists)
            pt = {k: codecs[k](v) for k, v in trial.params.items()}
            key, task = ctx.task(pt)
            if trials.holds(key):
                study.tell(trial, state=TrialState.PRUNED)
            elif key in ctx.records:  # the sampler proposed a configuration already measured
                trials.tell(trial, ctx.records[key])
            else:
                trials.inflight.append((trial, pt, key, task, next_index, be.submit(fn, task)))
                next_index += 1
        if not trials.inflight:
            break
        trials.tell_oldest()


@dataclass
class _OrderedTrials:
    """Optuna trials in flight, told to the study in the order they were asked: each proposal
    knows exactly the trials asked `workers` before it, whichever finished first, so a sweep
    on several workers is as reproducible as one on one. Results are written as they finish."""

    ctx: _Ctx
    study: Any
    objectives: list
    prog: Any
    inflight: deque = field(default_factory=deque)  # (trial, params, key, task, index, future)
    results: dict = field(default_factory=dict)  # future -> its record, once finished

    def started(self) -> int:
        """Configurations simulated or in flight (a finished one awaiting its turn counts once)."""
        return len(self.ctx.records) - len(self.results) + len(self.inflight)

    def holds(self, key: str) -> bool:
        return any(t[2] == key for t in self.inflight)

    def tell(self, trial, rec: dict) -> None:
        from optuna.trial import TrialState

        vals = _objective_values(rec, self.objectives)
        self.study.tell(trial, vals) if vals is not None else self.study.tell(trial, state=TrialState.FAIL)

    def tell_oldest(self) -> None:
        trial, fut = self.inflight[0][0], self.inflight[0][5]
        while fut not in self.results:
            self._collect()
        self.inflight.popleft()
        self.tell(trial, self.results.pop(fut))

    def _collect(self) -> None:
        running = {t[5]: t for t in self.inflight if t[5] not in self.results}
        done, _ = wait(list(running), return_when=FIRST_COMPLETED)
        for fut in done:
            _, pt, key, task, idx, _ = running[fut]
            self.results[fut] = rec = self.ctx.finish(key, idx, pt, task, _future_result(fut))
            self.prog.advance(rec)


def _contains(dist, value) -> bool:
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except Exception:
        return False


# ---------------------------------------------------------------------------------------------
# the table and the plots


def build_table(sweep_dir: Path, params: list[Param] | None = None):
    """One row per configuration, rebuilt from the result files: key, index, status, error,
    one column per parameter (its dotted path), every metric (flattened summary names). Where
    and how long each ran stays in its result file, so the same sweep gives the same table
    byte for byte."""
    records = sorted(load_results(sweep_dir).values(), key=lambda r: (r.get("index", 0), r["key"]))
    param_names = (
        [p.path for p in params] if params else list(dict.fromkeys(k for r in records for k in r.get("params", {})))
    )
    rows = []
    for r in records:
        row = {"key": r["key"], "index": r.get("index"), "status": r["status"], "error": r.get("error") or ""}
        for k in param_names:
            row[k] = r.get("params", {}).get(k)
        for k, v in (r.get("metrics") or {}).items():
            if k not in row:
                row[k] = v
        rows.append(row)
    df = pd.DataFrame(rows, columns=None if rows else ["key", "index", "status", "error", *param_names])
    for col in param_names:
        df[col] = _uniform_column(df[col])
    return df


def _uniform_column(s):
    """Parquet needs one type per column: numbers stay numbers, anything else becomes text."""
    vals = [v for v in s if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if vals and all(isinstance(v, bool) for v in vals):
        return s.astype("boolean")
    if vals and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return s.astype(float) if any(isinstance(v, float) for v in vals) else s.astype("Int64")
    return s.map(lambda v: None if v is None else (v if isinstance(v, str) else _canonical(v)))


def pareto_mask(values: np.ndarray, maximize: list[bool]) -> np.ndarray:
    """Rows not dominated by any other row. `values` (n, k); a row with a NaN is never on the
    front. Row a dominates b when a is at least as good in every objective and better in one."""
    v = np.asarray(values, dtype=float)
    if v.ndim != 2:
        raise ValueError("values must be 2-D")
    signs = np.where(np.asarray(maximize), -1.0, 1.0)  # turn everything into minimisation
    m = v * signs
    ok = np.all(np.isfinite(m), axis=1)
    mask = np.zeros(len(m), dtype=bool)
    idx = np.flatnonzero(ok)
    sub = m[idx]
    for j, i in enumerate(idx):
        le = np.all(sub <= sub[j], axis=1)
        lt = np.any(sub < sub[j], axis=1)
        mask[i] = not np.any(le & lt)
    return mask


def sensitivity(df, params: list[Param], metrics: dict[str, bool]):
    """Per parameter and metric (name -> True when higher is better): the spread (max - min)
    of the metric's mean over the parameter's values, among successful configurations, that
    spread relative to the metric's overall mean, and the best and worst value by mean.
    Continuous parameters are cut into 5 quantile bins."""
    ok = df[df["status"] == "ok"] if len(df) else df
    rows = []
    for p in params:
        if p.path not in ok.columns:
            continue
        col = ok[p.path]
        if p.kind != "categorical" and col.nunique() > 8:
            col = pd.qcut(col.astype(float), 5, duplicates="drop")
        for m, up in metrics.items():
            if m not in ok.columns or len(ok) == 0:
                continue
            means = ok[m].astype(float).groupby(col.astype(str)).mean().dropna()
            overall = float(ok[m].astype(float).mean())
            spread = float(means.max() - means.min()) if len(means) else float("nan")
            hi, lo = (means.idxmax(), means.idxmin()) if len(means) else (None, None)
            rows.append(
                {
                    "parameter": p.path,
                    "metric": m,
                    "values": int(len(means)),
                    "spread": spread,
                    "relative_spread": spread / abs(overall) if overall else float("nan"),
                    "best_value_by_mean": hi if up else lo,
                    "worst_value_by_mean": lo if up else hi,
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "parameter",
            "metric",
            "values",
            "spread",
            "relative_spread",
            "best_value_by_mean",
            "worst_value_by_mean",
        ],
    )


def _short(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _label(row, params: list[Param]) -> str:
    return ", ".join(f"{p.path.split('.')[-1]}={_short(row[p.path])}" for p in params)


def write_outputs(sweep_dir: Path, df, params: list[Param], space: SweepSpace, plots: bool = True) -> list[Path]:
    """results.parquet, results.csv, sensitivity.csv, pareto.csv, plots/, report.md: staged and
    moved into place together (staged_files), so an interrupted summary leaves the previous
    one whole, the report last."""
    sweep_dir = Path(sweep_dir)
    names = ("results.parquet", "results.csv", "pareto.csv", "sensitivity.csv", "plots/pareto.png")
    targets = [sweep_dir / n for n in (*names, "plots/sensitivity.png", "report.md")]
    with staged_files(*targets) as staged:
        front, sens, imgs = _summaries(staged, df, params, space, plots)
        staged.path(staged.main).write_text(_markdown(df, front, sens, params, space, imgs, sweep_dir))
        files = staged.written()
    if not imgs:  # an earlier summary's figures would show other configurations than the table
        with held_signals():
            for png in (sweep_dir / "plots/pareto.png", sweep_dir / "plots/sensitivity.png"):
                png.unlink(missing_ok=True)
    return files


def _summaries(staged: StagedFiles, df, params: list[Param], space: SweepSpace, plots: bool):
    """The tables and figures of write_outputs into their staged files: (the Pareto front, the
    sensitivity table, the figures' final paths)."""
    parquet, csv, pareto, sensitivity_csv, pareto_png, sensitivity_png, _ = staged.targets
    df.to_parquet(staged.path(parquet), index=False)
    df.to_csv(staged.path(csv), index=False)
    tp, lat = space.pareto.throughput, space.pareto.latency
    have = len(df) and tp in df.columns and lat in df.columns
    front = df.iloc[0:0]
    if have:
        mask = pareto_mask(df[[tp, lat]].astype(float).to_numpy(), [True, False])
        front = df[mask].sort_values(lat)
        front.to_csv(staged.path(pareto), index=False)
    sens = sensitivity(df, params, {m: up for m, up in ((tp, True), (lat, False)) if m in df.columns})
    sens.to_csv(staged.path(sensitivity_csv), index=False)
    imgs = []
    if plots and have and (df["status"] == "ok").any():
        plt = pyplot()
        _plot_pareto(plt, df, front, params, tp, lat, staged.path(pareto_png))
        _plot_sensitivity(plt, df, params, tp, lat, staged.path(sensitivity_png))
        imgs = [pareto_png, sensitivity_png]
    return front, sens, imgs


def _plot_pareto(plt, df, front, params, tp, lat, path: Path) -> Path:
    ok = df[df["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    ax.scatter(ok[lat].astype(float), ok[tp].astype(float), s=22, color="#9aa5b1", label="configuration", zorder=2)
    f = front.sort_values(lat)
    ax.plot(
        f[lat].astype(float),
        f[tp].astype(float),
        "-o",
        color="#d1495b",
        ms=6,
        lw=1.6,
        label=f"Pareto front ({len(f)} configurations)",
        zorder=3,
    )
    # configurations with identical metrics share one point: number the distinct points and
    # list them under the plot
    groups: dict = {}
    for _, row in f.iterrows():
        groups.setdefault((round(float(row[lat]), 9), round(float(row[tp]), 9)), []).append(row)
    notes = []
    for n, ((x, y), rows) in enumerate(groups.items(), 1):
        ax.annotate(
            f"#{n}", (x, y), fontsize=8, color="#d1495b", fontweight="bold", xytext=(5, 4), textcoords="offset points"
        )
        if n <= 10:
            more = f"  (+{len(rows) - 1} with the same metrics)" if len(rows) > 1 else ""
            notes.append(f"#{n}: {_label(rows[0], params)}{more}")
    if len(groups) > 10:
        notes.append(f"... {len(groups) - 10} more points in pareto.csv")
    fig.text(0.01, -0.01, "\n".join(notes), fontsize=8, va="top", ha="left", family="monospace")
    finite = ok[lat].astype(float)
    if len(finite) and finite.max() / max(finite.min(), 1e-12) > 50:
        ax.set_xscale("log")
    ax.set_xlabel(f"{lat} (s)" if lat.endswith(("_s.p99", "_s.p90", "_s.p50", "_s.mean")) else lat)
    ax.set_ylabel(tp)
    ax.set_title("throughput against tail latency (up and left is better)", pad=24)
    # above the axes: inside, any corner can hide configurations (the worst ones sit lower right)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, fontsize=8, frameon=False)
    return finish_figure(fig, path, **REPRODUCIBLE_PNG)


def _plot_sensitivity(plt, df, params, tp, lat, path: Path) -> Path:
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    ok = df[df["status"] == "ok"]
    n = len(params)
    ncols = min(n, 3)
    blocks = math.ceil(n / ncols)
    fig, axes = plt.subplots(2 * blocks, ncols, figsize=(max(4.5, 3.9 * ncols), 5.2 * blocks), squeeze=False)
    for k in range(n, blocks * ncols):  # unused panels of the last block
        axes[2 * (k // ncols)][k % ncols].axis("off")
        axes[2 * (k // ncols) + 1][k % ncols].axis("off")
    rng = np.random.default_rng(0)
    for j, p in enumerate(params):
        for i, m in enumerate((tp, lat)):
            ax = axes[2 * (j // ncols) + i][j % ncols]
            y = ok[m].astype(float).to_numpy()
            col = ok[p.path]
            if p.kind != "categorical" and col.nunique() > 8:
                ax.scatter(col.astype(float), y, s=12, color="#2e86ab", alpha=0.8)
                if p.log:
                    ax.set_xscale("log")
                    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                    ax.xaxis.set_major_formatter(ScalarFormatter())
                    ax.xaxis.set_minor_formatter(NullFormatter())
            else:
                cats = list(dict.fromkeys(_short(v) for v in (p.values or sorted(col.dropna().unique()))))
                pos = {c: k for k, c in enumerate(cats)}
                xs = np.array([pos.get(_short(v), np.nan) for v in col], dtype=float)
                ax.scatter(xs + rng.uniform(-0.12, 0.12, len(xs)), y, s=12, color="#2e86ab", alpha=0.7)
                means = [np.nanmean(y[xs == k]) if np.any(xs == k) else np.nan for k in range(len(cats))]
                ax.plot(range(len(cats)), means, "_", color="#d1495b", ms=22, mew=2.5)
                ax.set_xticks(range(len(cats)))
                ax.set_xticklabels(
                    cats,
                    rotation=30 if max(map(len, cats), default=0) > 6 else 0,
                    fontsize=8,
                    ha="right" if max(map(len, cats), default=0) > 6 else "center",
                )
                ax.set_xlim(-0.5, len(cats) - 0.5)
            if i == 1:
                ax.set_xlabel(p.path, fontsize=9)
            if j % ncols == 0:
                ax.set_ylabel(m, fontsize=9)
            ax.tick_params(labelsize=8)
    fig.suptitle("sensitivity: each point a configuration, red bar the mean per value")
    return finish_figure(fig, path, **REPRODUCIBLE_PNG)


def _markdown(df, front, sens, params, space, imgs, sweep_dir: Path) -> str:
    n_ok = int((df["status"] == "ok").sum()) if len(df) else 0
    lines = [
        f"# Sweep {space.name or ''}".rstrip(),
        "",
        f"{len(df)} configurations ({n_ok} ok, {len(df) - n_ok} failed), method {space.method}; "
        f"parameters: {', '.join(p.path for p in params)}. Table: `results.parquet` / `results.csv`.",
        "",
    ]
    tp, lat = space.pareto.throughput, space.pareto.latency
    if len(front):
        lines += [f"## Pareto front ({tp} up, {lat} down)", ""]
        cols = [p.path for p in params] + [tp, lat]
        lines += md_table(cols, [[_short(r[c]) for c in cols] for _, r in front.iterrows()]) + [""]
    for img in imgs:
        lines += [f"![{img.stem}]({img.relative_to(sweep_dir).as_posix()})", ""]
    if len(sens):
        lines += ["## Sensitivity (spread of the mean over each parameter's values)", ""]
        lines += md_table(
            ["parameter", "metric", "spread", "relative", "best by mean"],
            [
                [
                    r.parameter,
                    r.metric,
                    _short(r.spread),
                    f"{r.relative_spread:.1%}" if r.relative_spread == r.relative_spread else "-",
                    str(r.best_value_by_mean),
                ]
                for r in sens.itertuples()
            ],
        ) + [""]
    failed = df[df["status"] == "failed"] if len(df) else df
    if len(failed):
        lines += ["## Failed configurations", ""]
        lines += md_table(
            [p.path for p in params] + ["error"],
            [[_short(r[p.path]) for p in params] + [str(r["error"])[:200]] for _, r in failed.iterrows()],
        )
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# progress


class _Progress(ProgressBar):
    """Counts new results, ok and failed; the total is known once the cached ones are."""

    def __init__(self, quiet: bool, name: str, where: str):
        super().__init__(f"sweep {name} [dim]({where})[/]", quiet=quiet, fields="{task.fields[note]}")
        self.ok = self.failed = 0

    def start(self, total: int, cached: int) -> None:
        super().start(total, completed=cached, note=f"{cached} already done" if cached else "")

    def advance(self, rec: dict) -> None:
        if rec["status"] == "ok":
            self.ok += 1
        else:
            self.failed += 1
        note = f"{self.ok} new ok" + (f", [red]{self.failed} failed[/]" if self.failed else "")
        self.update(advance=1, note=note)
