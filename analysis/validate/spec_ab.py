"""Before/after for the acceptance model on finished `sim validate` speculative cases: the same
executor run and the same round fit, simulated with the pooled acceptance (each round i.i.d.
from the run's histogram; Medusa: independent heads from the measured accuracies) and with
what `simulator_updates` gives now (per request; Medusa: the empirical accepted depths), so the
difference is the acceptance model alone.

    python -m infersim.analysis.validate.spec_ab runs/validate-spec-draft [more case folders]

Prints one line per (case, variant) and writes ab.json in each case folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import infersim.executor.medusa.validate_hooks as mh
import infersim.executor.speculative.validate_hooks as sh
from infersim.simulator.costmodel.speculative_fit import SpecFit
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import write_json

from .cases import get_case
from .measured import load_run
from .modes import MODES
from .spec_compare import ExecutedSpec, compare_spec, spread, tokens_per_round_per_request
from .spec_simulate import simulate_spec_run

METRICS = (
    "throughput (output tok/s)",
    "mean end-to-end latency",
    "TTFT p99",
    "TPOT p99",
    "end-to-end p99",
    "acceptance rate",
    "tokens per step",
)


def variants(stats: dict) -> dict:
    if stats.get("method") == "medusa":
        return {
            "independent heads": mh.simulator_updates(stats, empirical=False),
            "empirical pooled": mh.simulator_updates(stats, per_request=False),
            "empirical per request": mh.simulator_updates(stats),
        }
    return {"pooled": sh.simulator_updates(stats, per_request=False), "per request": sh.simulator_updates(stats)}


def ab_case(folder: Path) -> dict:
    folder = Path(folder)
    vpath = folder / "validation.json"
    if not vpath.is_file():
        raise InfersimError(f"{folder}: no validation.json (not a finished `sim validate` case folder)")
    val = json.loads(vpath.read_text())
    case = get_case(val["case"])
    mode = MODES.get(case.mode)
    stats = mode.recorded(folder / "exec")
    executed = ExecutedSpec.load(folder / "exec", pipelined=bool(stats.get("pipelined")))
    exec_run = executed.run
    fit = SpecFit.load(folder / "calibration" / "speculative-fit.json")
    cv_exec = spread(tokens_per_round_per_request(exec_run)).get("cv")
    out = {}
    for name, upd in variants(stats).items():
        sim_dir = folder / ("ab-" + name.replace(" ", "-"))
        simulate_spec_run(exec_run, sim_dir, fit, updates=upd, seed=val["seed"])
        sim_run = load_run(sim_dir)
        cmp = compare_spec(case.name, executed, sim_run, fit, case.compare)
        row = {c["metric"]: c["value"] for c in cmp.checks if c["metric"] in METRICS}
        row["TTFT mean"] = cmp.requests["ttft_s"]["mean_error"]
        row["tokens per round per request, cv (simulated / measured)"] = [
            spread(tokens_per_round_per_request(sim_run)).get("cv"),
            cv_exec,
        ]
        out[name] = row
    write_json(folder / "ab.json", out)
    return out


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m infersim.analysis.validate.spec_ab CASE_FOLDER [...]", file=sys.stderr)
        return 2
    try:
        for f in args:
            for name, row in ab_case(Path(f)).items():
                cells = ", ".join(f"{k} {v:+.1%}" for k, v in row.items() if isinstance(v, float))
                cv = row["tokens per round per request, cv (simulated / measured)"]
                cvs = " / ".join("-" if x is None else f"{x:.3f}" for x in cv)
                print(f"{Path(f).name} [{name}]: {cells}; cv {cvs}")
    except InfersimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
