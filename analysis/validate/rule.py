"""The pass rule of the validation benchmark: how a validated case's errors are judged against
the targets (compare.TARGETS).

- Per-iteration latency MAPE: on a CPU run, at the run's local speed (the cost model's
  predictions scaled by the machine's speed around each iteration, read from the speed ticks
  timed inside the run: `compare.within_run_speed`'s `mape_at_local_speed`) against its 10%
  target, the raw MAPE reported beside it. A shared CPU's speed moves by tens of percent within a
  second; pricing each iteration at the speed the machine ran it takes that out of the cost
  model's error without reading the iteration's own time. A run without enough ticks, and any
  GPU (cuda) run, is judged on the raw MAPE.
- Aggregate targets (throughput and mean end-to-end within 10%, TTFT, TPOT and end-to-end p99
  within 20%, swap and recompute cost within 5%, acceptance and tokens per step within 5%): on
  the median over the repeats (the validated requests served `repeats` times, each run's errors
  against the same simulation: `compare.aggregate_errors`), on every device.
- Every other check (KV bytes, selector decisions) keeps its own verdict."""

from __future__ import annotations

import numpy as np

ITERATION_METRIC = "per-iteration latency MAPE"

RULE = (
    "per-iteration MAPE at the run's local speed (its speed ticks) on CPU, raw on GPU, ≤ 10%; throughput "
    "and mean end-to-end ≤ 10%, TTFT/TPOT/end-to-end p99 ≤ 20%, swap and recompute cost ≤ 5% on the median "
    "of the repeats"
)


def judge(result: dict) -> dict:
    """The rule's verdict on a validation result (run.validate_case's dict: its `checks`, `device`,
    `comparison.cost_model.within_run` and `repeat_errors`): {"rule", "passed", "checks"}, each
    check with the judged `value`, its `raw` value (the median run's), `judged_on` and `ok`."""
    device = str(result.get("device", "cpu"))
    within = ((result.get("comparison") or {}).get("cost_model") or {}).get("within_run") or {}
    repeats = result.get("repeat_errors") or []
    checks = [
        _judge_iteration(c, device, within) if c["metric"] == ITERATION_METRIC else _judge_aggregate(c, repeats)
        for c in result.get("checks", [])
    ]
    return {"rule": RULE, "passed": all(c["ok"] for c in checks), "checks": checks}


def _within(value, target: float) -> bool:
    return value is not None and bool(np.isfinite(value)) and abs(value) <= target


def _judge_iteration(check: dict, device: str, within: dict) -> dict:
    local = within.get("mape_at_local_speed")
    if device.startswith("cuda") or local is None or not np.isfinite(local):
        return {
            **check,
            "raw": check["value"],
            "judged_on": "raw" if device.startswith("cuda") else "raw (no speed ticks)",
        }
    ok = _within(local, check["target"])
    component = "" if ok else (check["component"] or f"cost model (MAPE {local:.1%} at the run's local speed)")
    return {
        **check,
        "value": local,
        "raw": check["value"],
        "judged_on": "local speed",
        "ok": ok,
        "component": component,
        "kind": "" if ok else (check.get("kind") or "cost model"),
    }


def _judge_aggregate(check: dict, repeats: list[dict]) -> dict:
    values = [
        r[check["metric"]] for r in repeats if r.get(check["metric"]) is not None and np.isfinite(r[check["metric"]])
    ]
    if not values:
        return {**check, "raw": check["value"], "judged_on": "one run"}
    median = float(np.median(values))
    ok = _within(median, check["target"])
    component = (
        ""
        if ok
        else (
            check["component"]
            or f"timing noise (the median of the repeats {median:+.1%}, "
            f"their values {', '.join(f'{v:+.1%}' for v in values)})"
        )
    )
    return {
        **check,
        "value": median,
        "raw": check["value"],
        "repeats": values,
        "judged_on": f"median of {len(values)} repeats" if len(values) > 1 else "one run",
        "ok": ok,
        "component": component,
        "kind": "" if ok else (check.get("kind") or "timing noise"),
    }


def apply_rule(result: dict) -> dict:
    """result with the rule's verdict added (`judged`) and `passed` set by it; the raw checks stay."""
    result["judged"] = judge(result)
    result["passed"] = result["judged"]["passed"]
    return result
