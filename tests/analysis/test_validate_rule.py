"""The validation benchmark's pass rule (analysis/validate/rule.py) on synthetic results with
known errors: per-iteration MAPE judged at the run's local speed on CPU and raw on cuda, the
aggregate targets on the median of the repeats, including results that must fail."""

import pytest

from infersim.analysis.validate.compare import TARGETS
from infersim.analysis.validate.rule import RULE, apply_rule, judge

ITER = "per-iteration latency MAPE"
THR = "throughput (output tok/s)"
E2E = "mean end-to-end latency"
P99 = "end-to-end p99"
SWAP = "swap cost (total copy time)"
RECOMPUTE = "recompute cost (re-prefill time)"
TARGET = {
    ITER: TARGETS["iteration_mape"],
    THR: TARGETS["throughput"],
    E2E: TARGETS["e2e_mean"],
    P99: TARGETS["p99"],
    SWAP: TARGETS["swap_cost"],
    RECOMPUTE: TARGETS["recompute_cost"],
}


def _check(metric: str, value: float) -> dict:
    """A check as check_targets writes it (its own verdict on the run of median busy time)."""
    ok = abs(value) <= TARGET[metric]
    return {
        "metric": metric,
        "value": value,
        "target": TARGET[metric],
        "ok": ok,
        "component": "" if ok else "cost model (synthetic)",
        "kind": "" if ok else "cost model",
    }


def _result(
    *,
    raw_mape: float = 0.05,
    local_mape: float | None = 0.05,
    device: str = "cpu",
    repeats: list[dict] | None = None,
    **errors: float,
) -> dict:
    """A validation result: the median run's checks, its speed ticks' local-speed MAPE and each
    repeat's aggregate errors. errors: metric keyword -> the median run's error."""
    names = {"thr": THR, "e2e": E2E, "p99": P99, "swap": SWAP, "recompute": RECOMPUTE}
    checks = [_check(ITER, raw_mape)] + [_check(names[k], v) for k, v in errors.items()]
    within = (
        {} if local_mape is None else {"mape_at_local_speed": local_mape, "correlation": 0.8, "tick_range": [0.9, 1.1]}
    )
    if repeats is None:
        repeats = [{names[k]: v for k, v in errors.items()}]
    return {
        "case": "synthetic",
        "device": device,
        "status": "ran",
        "checks": checks,
        "comparison": {"cost_model": {"mape": raw_mape, "within_run": within}},
        "repeat_errors": repeats,
    }


def _by_metric(verdict: dict) -> dict:
    return {c["metric"]: c for c in verdict["checks"]}


def test_every_target_met_passes_and_says_the_rule():
    v = judge(_result(thr=0.04, e2e=-0.03, p99=0.15))
    assert v["passed"] and v["rule"] == RULE
    assert [c["metric"] for c in v["checks"]] == [ITER, THR, E2E, P99]


def test_throughput_12_percent_off_fails():
    v = judge(_result(thr=0.12, e2e=0.02))
    assert not v["passed"]
    c = _by_metric(v)[THR]
    assert not c["ok"] and c["value"] == pytest.approx(0.12) and c["component"]
    assert c["judged_on"] == "one run"  # `sim validate`'s default: a single run, no repeats


def test_local_speed_mape_of_11_percent_fails_on_cpu_even_with_a_raw_8_percent():
    v = judge(_result(raw_mape=0.08, local_mape=0.11, thr=0.0))
    c = _by_metric(v)[ITER]
    assert not v["passed"] and not c["ok"]
    assert c["value"] == pytest.approx(0.11) and c["raw"] == pytest.approx(0.08) and c["judged_on"] == "local speed"


def test_raw_15_with_local_8_passes_on_cpu_and_fails_on_cuda():
    cpu = judge(_result(raw_mape=0.15, local_mape=0.08, thr=0.01))
    c = _by_metric(cpu)[ITER]
    assert cpu["passed"] and c["ok"] and c["value"] == pytest.approx(0.08) and c["raw"] == pytest.approx(0.15)
    assert c["component"] == ""  # the raw check's miss is not carried into a pass
    gpu = judge(_result(raw_mape=0.15, local_mape=0.08, device="cuda:0", thr=0.01))
    g = _by_metric(gpu)[ITER]
    assert not gpu["passed"] and not g["ok"] and g["value"] == pytest.approx(0.15) and g["judged_on"] == "raw"


def test_a_run_without_speed_ticks_is_judged_on_the_raw_mape():
    v = judge(_result(raw_mape=0.12, local_mape=None, thr=0.0))
    c = _by_metric(v)[ITER]
    assert not v["passed"] and c["value"] == pytest.approx(0.12) and c["judged_on"] == "raw (no speed ticks)"
    assert judge(_result(raw_mape=0.09, local_mape=float("nan"), thr=0.0))["passed"]


def test_aggregates_are_judged_on_the_median_of_the_repeats():
    # the run of median busy time missed throughput (+11%), but the median of the three repeats is +6%
    reps = [{THR: 0.11, E2E: 0.02}, {THR: 0.06, E2E: 0.03}, {THR: -0.02, E2E: 0.01}]
    v = judge(_result(thr=0.11, e2e=0.02, repeats=reps))
    c = _by_metric(v)[THR]
    assert v["passed"] and c["ok"] and c["value"] == pytest.approx(0.06) and c["raw"] == pytest.approx(0.11)
    assert c["repeats"] == [0.11, 0.06, -0.02] and c["judged_on"] == "median of 3 repeats"
    # and the other way: the median run met the target, the median of the repeats does not
    reps = [{THR: 0.02, E2E: -0.12}, {THR: 0.01, E2E: -0.11}, {THR: 0.0, E2E: -0.05}]
    v = judge(_result(thr=0.02, e2e=-0.05, repeats=reps))
    c = _by_metric(v)[E2E]
    assert not v["passed"] and not c["ok"] and c["value"] == pytest.approx(-0.11)
    assert c["component"].startswith("timing noise") and "-11.0%" in c["component"]


def test_aggregate_targets_at_their_bounds():
    """p99 within 20%, swap and recompute cost within 5%, mean end-to-end within 10%: at the bound
    passes, past it fails."""
    assert judge(_result(p99=0.20, swap=-0.05, recompute=0.05, e2e=0.10))["passed"]
    for kw in ({"p99": -0.21}, {"swap": 0.051}, {"recompute": -0.06}, {"e2e": 0.101}):
        v = judge(_result(**kw))
        assert not v["passed"], kw
        assert [c["metric"] for c in v["checks"] if not c["ok"]] == [
            {"p99": P99, "swap": SWAP, "recompute": RECOMPUTE, "e2e": E2E}[next(iter(kw))]
        ]


def test_even_repeats_take_the_mean_of_the_middle_two_and_skip_missing_values():
    reps = [{THR: 0.04}, {THR: 0.14}, {}, {THR: float("nan")}]
    c = _by_metric(judge(_result(thr=0.04, repeats=reps)))[THR]
    assert c["value"] == pytest.approx(0.09) and c["ok"] and c["judged_on"] == "median of 2 repeats"


def test_checks_the_rule_does_not_cover_keep_their_own_verdict():
    r = _result(thr=0.0)
    r["checks"].append(
        {
            "metric": "KV bytes loaded (total)",
            "value": 0.2,
            "target": 0.05,
            "ok": False,
            "component": "cost model (policy)",
            "kind": "cost model",
        }
    )
    v = judge(r)
    c = _by_metric(v)["KV bytes loaded (total)"]
    assert not v["passed"] and not c["ok"] and c["judged_on"] == "one run" and c["raw"] == 0.2


def test_apply_rule_sets_passed_by_the_rule_and_keeps_the_raw_checks():
    r = _result(raw_mape=0.15, local_mape=0.07, thr=0.03)
    raw = [dict(c) for c in r["checks"]]
    out = apply_rule(r)
    assert out is r and r["passed"] and r["judged"]["passed"] and r["checks"] == raw and not raw[0]["ok"]


def test_results_file_opens_with_the_summary_and_shows_judged_and_raw(tmp_path):
    from infersim.analysis.validate.matrix import write_results

    good = apply_rule({**_result(raw_mape=0.15, local_mape=0.08, thr=0.01), "case": "good", "title": "t"})
    bad = apply_rule({**_result(raw_mape=0.05, local_mape=0.04, thr=0.12), "case": "bad", "title": "t"})
    meta = {
        "date": "D",
        "model": "zoo-target",
        "device": "cpu",
        "wall_s": 1.0,
        "load_start": "0",
        "load_end": "0",
        "repeats": 3,
        "fits": {},
    }
    machine = {"CPU": "Some CPU", "cores": 2, "CPU vector instructions (torch)": "AVX2"}
    text = write_results([good, bad], meta, machine, tmp_path).read_text()
    first = text.splitlines()[0]
    assert first == (
        "# 1 of 2 validation cases met every target under the rule (per-iteration MAPE at local speed, "
        "aggregates on the median of 3 repeats) — `zoo-target` on cpu, Some CPU (2 cores, AVX2), D"
    )
    assert RULE in text
    rows = {line.split(" | ")[0].strip("|* "): line for line in text.splitlines() if line.startswith("| ")}
    assert " pass " in rows["good"] and "8.0% (15.0%)" in rows["good"]  # judged at local speed, raw beside
    assert " miss " in rows["bad"] and "+12.0% ✗" in rows["bad"]
