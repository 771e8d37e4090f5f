"""The run summary: event mode and step mode agree on every field of summary.json (time-weighted
means do not depend on how the timeline is cut into segments), the time integrals hold against
hand sums, and aborted requests are counted with their reason."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from infersim.simulator.metrics.collector import MetricsCollector, TimeIntegrals, exact_partials
from infersim.simulator.metrics.rundir import json_clean
from infersim.simulator.metrics.summary import CORE_METRICS, FEATURE_SECTIONS, summarize
from infersim.simulator.simulation import simulate
from infersim.simulator.workload.builder import build_requests, load_workload
from infersim.simulator.workload.schema import WorkloadSpec
from tests.utils import requests_section


def _summary_json(spec, step_mode: bool) -> dict:
    # the file's own encoding: what summary.json would hold
    return json.loads(json.dumps(json_clean(summarize(simulate(spec, build_requests(spec, "."), step_mode=step_mode)))))


def _builtin(name: str, n: int) -> WorkloadSpec:
    spec, _ = load_workload(name)
    return spec.model_copy(update={"requests": spec.requests.model_copy(update={"count": n})})


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


@pytest.mark.parametrize(
    "case", ["finance-500", "chatbot-300", "preempt-swap", "preempt-recompute-3-replicas", "prefix-caching-swap"]
)
def test_step_mode_and_event_mode_summaries_are_identical(small_workload, case):
    if case == "finance-500":
        spec = _builtin("finance", 500)
    elif case == "chatbot-300":
        spec = _builtin("chatbot", 300)
    elif case == "preempt-swap":
        spec = small_workload(preemption="swap")
    elif case == "prefix-caching-swap":
        data = small_workload(preemption="swap", prefix_caching=True, gpu_blocks=120, cpu_blocks=120).model_dump()
        data["requests"]["sharing"] = {"conversations": 6, "system_prompt_tokens": 40, "max_turns": 4}
        spec = WorkloadSpec.model_validate(data)
    else:
        data = small_workload(preemption="recompute").model_dump()
        data["hardware"].update(replicas=3, router="least_outstanding")
        data["requests"].update(count=200, arrival={"type": "poisson", "rate": 2000.0})
        spec = WorkloadSpec.model_validate(data)
    a, b = _summary_json(spec, False), _summary_json(spec, True)
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    assert {k: (fa[k], fb[k]) for k in fa if fa[k] != fb[k]} == {}
    assert a["kv_utilization"]["mean_busy"] > 0
    if case.startswith(("preempt", "prefix")):
        assert a["preemptions"]["swap"] + a["preemptions"]["recompute"] > 0
    if case.startswith("prefix"):
        assert a["prefix_cache"]["hit_rate_tokens"] > 0.3 and a["prefix_cache"]["evictions"] > 0


def test_time_integrals_merge_equal_pieces_and_match_hand_sums():
    one, many = TimeIntegrals(), TimeIntegrals()
    one.add(0.0, 0.3, (2, 10, 0))
    one.add(0.3, 0.5, (2, 12, 0))
    for t0, t1, v in ((0.0, 0.1, 10), (0.1, 0.2, 10), (0.2, 0.3, 10), (0.3, 0.4, 12), (0.4, 0.5, 12)):
        many.add(t0, t1, (2, v, 0))
    assert one.totals() == many.totals()
    time_s, batch, blocks, cpu = one.totals()
    assert time_s == pytest.approx(0.5) and batch == pytest.approx(1.0)
    assert blocks == pytest.approx(0.3 * 10 + 0.2 * 12) and cpu == 0.0


def test_decode_stretch_counts_blocks_step_by_step():
    """Blocks grow inside a stretch: the integral weighs each step with its own count."""
    m = MetricsCollector(4)
    ends = np.array([1.0, 2.0, 3.0, 4.0])
    m.segment((0.0, 4.0, 0, 4, 1, 1, 0, 7, 0, 0, 0, 0.0, 0.0), gpu_blocks_steps=(ends, np.array([5, 5, 6, 7])))
    assert m.tw["gpu_blocks_used"] == 5 + 5 + 6 + 7
    assert m.tw["time_s"] == 4.0 and m.peak["gpu_blocks_used"] == 7


def test_exact_partials_do_not_depend_on_grouping():
    rng = np.random.default_rng(0)
    v = rng.lognormal(-4, 1, 1000)
    grouped = exact_partials([*(v[:500] * 3).tolist(), *exact_partials((v[500:] * 3).tolist())])
    ungrouped = exact_partials(np.repeat(v, 3).tolist())
    assert math.fsum(grouped) == math.fsum(ungrouped)


@pytest.mark.parametrize("prompt,reason", [(1200, "exceeds_context"), (600, "exceeds_kv_pool"), (100, None)])
def test_aborted_requests_are_counted_with_their_reason(prompt, reason):
    # 20 blocks of 16 tokens hold 320 tokens; the context is 1000 tokens
    spec = WorkloadSpec.model_validate(
        {
            "name": "abort",
            "model": "opt-1.3b",
            "hardware": {"profile": "a100-80gb-pcie"},
            "serving": {"gpu_blocks": 20, "block_size": 16, "max_model_len": 1000},
            "requests": requests_section(30, prompt, 4),
            "seed": 1,
        }
    )
    s = summarize(simulate(spec, build_requests(spec, ".")))
    assert s["aborted_by_reason"] == ({reason: 30} if reason else {})
    assert s["aborted"] == (30 if reason else 0) and s["finished"] == 30 - s["aborted"]


def test_requests_parquet_column_types(small_workload, tmp_path):
    import pandas as pd

    from infersim.simulator.metrics.summary import write_result_files

    spec = small_workload(preemption="swap")
    result = simulate(spec, build_requests(spec, "."))
    write_result_files(tmp_path, result)
    df = pd.read_parquet(tmp_path / "requests.parquet")
    for col in ("prompt_tokens", "output_tokens", "replica", "preempt_recompute", "preempt_swap"):
        assert df[col].dtype == "int64", col
        assert np.array_equal(df[col].to_numpy(), result.requests[col]), col
    assert df["aborted"].dtype == bool
    for col in ("arrival_s", "first_token_s", "finish_s", "ttft_s", "e2e_s"):
        assert df[col].dtype == "float64", col
    assert df["preempt_swap"].sum() == summarize(result)["preemptions"]["swap"] > 0


def test_config_records_the_measured_gemm_table_by_name_not_by_install_path():
    """A calibrated profile's GEMM table is found through the installed package, but the run's
    record names it as the profile file does, so config.yaml is the same on every install."""
    from infersim.simulator.hardware.catalog import load_hardware

    hw = load_hardware("a100-80gb-sxm")
    assert Path(hw.calibration.gemm.measured_shapes.file).is_absolute()  # what the cost model reads
    record = hw.record()
    assert record["calibration"]["gemm"]["measured_shapes"]["file"] == "a100-80gb-sxm.gemm-shapes.csv.gz"
    assert {k: v for k, v in record.items() if k != "calibration"} == {
        k: v for k, v in hw.model_dump(mode="json").items() if k != "calibration"
    }
    assert load_hardware("a100-80gb-sxm:datasheet").record() == load_hardware("a100-80gb-sxm:datasheet").model_dump(
        mode="json"
    )


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_core_metric_names_are_the_summarys_own(small_workload, prefix_caching):
    """CORE_METRICS (what `sim sweep` checks an objective against before it runs) are exactly the
    flattened names of a summary outside the sections a feature adds."""
    spec = small_workload(preemption="swap", prefix_caching=prefix_caching)
    names = set(_flat(_summary_json(spec, step_mode=False)))
    assert {n.split(".")[0] for n in names if n not in CORE_METRICS} <= set(FEATURE_SECTIONS)
    assert CORE_METRICS <= names
    assert any(n.startswith("prefix_cache.") for n in names) == prefix_caching
