"""Fuzz: plan files (`sim plan --plan`), sweep spaces (`sim sweep --space`) and their flags.

Plan files are mutated with values no field accepts (or a key deleted, which may leave a valid
plan: its search is kept to a few probes of ten requests); sweep spaces are mutated freely over
a workload of six requests, so valid ones run to a complete folder in a fraction of a second."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

from fuzz_harness import FUZZ, TINY_WORKLOAD, check, digest, invoke, write_yaml
from fuzz_values import OTHERS, STRINGS, mutated
from hypothesis import given
from hypothesis import strategies as st

PLAN = {
    "slo": {"ttft_p99": "2s", "tpot_p99": "100ms"},
    "hardware": ["a100-80gb-pcie"],
    "tensor_parallel": [1],
    "options": {"serving.max_batch_size": [16]},
    "prices": {"a100-80gb-pcie": 1.8},
    "price_source": "example",
    "target_rate": 2.0,
    "search": {"requests": 10, "max_requests": 20, "min_duration_s": 1.0, "max_replicas": 2, "curve_points": []},
}
# the defaults of these (3000 requests a probe, a load curve) would make a valid case take a minute
FAST_SEARCH = ("search", "search.requests", "search.max_requests", "search.min_duration_s", "search.curve_points")
# values no field of a plan file accepts
NEVER_VALID = st.sampled_from([math.nan, math.inf, -math.inf, [[]], {"x": {"y": []}}])


def _file_case(command: str, flag: str, name: str, data: dict, outputs: tuple, blame: list[str], *extra: str) -> None:
    """`sim COMMAND -w wl.yaml FLAG NAME`: a complete folder, or a refusal that leaves none."""
    with tempfile.TemporaryDirectory() as tmp:
        wl = write_yaml(Path(tmp) / "wl.yaml", TINY_WORKLOAD)
        given_file = write_yaml(Path(tmp) / name, data)
        out = Path(tmp) / "out"
        before = digest([wl, given_file])
        res = invoke([command, "-w", wl, flag, given_file, "-o", out, "-q", "--no-plots", "--workers", "1", *extra])
        check(res, blame=blame, inputs=[wl, given_file], before=before)
        if res.rc in (0, 3):
            assert all((out / f).is_file() for f in outputs), f"incomplete folder: {sorted(out.iterdir())}"
        else:
            assert not out.exists(), f"a refused {command} left its folder"


@FUZZ
@given(mutated(PLAN, ("search.seed", "search.tolerance", "search.start_rate"), values=NEVER_VALID, keep=FAST_SEARCH))
def test_mutated_plan_file(plan):
    # a deleted key may leave a valid plan; a missing SLO is reported against the flag that gives one
    _file_case("plan", "--plan", "plan.yaml", plan, ("report.md", "configurations.csv"), ["plan.yaml", "--slo"])


PLAN_FLAGS = {
    "--target-rate": st.sampled_from(["nan", "inf", "-inf", "-1", "0", "x"]),
    "--seed": st.sampled_from(["-1", str(2**64), "x"]),
    "--requests": st.sampled_from(["0", "-5", "1e3"]),
    "--tp": st.sampled_from(["3", "0", "x", "1,3"]),
    "--tolerance": st.sampled_from(["nan", "0", "1.5", "-0.1"]),
    "--slo": st.sampled_from(["ttft_p99=abc", "x=1s", "ttft_p99", "ttft_p99=-1s"]),
    "--workers": st.sampled_from(["0", "-1"]),
}


@FUZZ
@given(st.lists(st.sampled_from(sorted(PLAN_FLAGS)), min_size=1, max_size=3, unique=True), st.data())
def test_plan_flags(flags, data):
    """Each flag's values here are all invalid: the plan is refused before any probe."""
    argv = []
    for flag in flags:
        argv += [flag, data.draw(PLAN_FLAGS[flag], label=flag)]
    if "--slo" not in flags:
        argv += ["--slo", "ttft_p99=2s"]
    with tempfile.TemporaryDirectory() as tmp:
        wl = write_yaml(Path(tmp) / "wl.yaml", TINY_WORKLOAD)
        out = Path(tmp) / "report"
        before = digest([wl])
        res = invoke(["plan", "-w", wl, "-o", out, "-q", "--no-plots", *argv])
        assert res.rc != 0
        check(res, blame=[*flags, "wl.yaml"], inputs=[wl], before=before, run_dir=out)


SPACE = {
    "name": "fuzz",
    "parameters": {"serving.max_batch_size": [8, 16], "serving.scheduler": ["fcfs"]},
    "fixed": {"requests.count": 4},
}
# no mid-sized numbers: a trial budget or grid of 50 is valid but slow for a fuzz case
SPACE_VALUES = st.one_of(
    st.sampled_from([-1, 0, 1, 2, 10**12, 2**63, 10**30, 0.5, math.nan, math.inf]),
    STRINGS,
    OTHERS,
    st.just({"low": 1, "high": 10**12, "num": 10**12}),
    st.just({"values": []}),
    st.just("optuna"),
)


@FUZZ
@given(mutated(SPACE, ("method", "optuna.trials", "pareto.latency", "description"), values=SPACE_VALUES))
def test_mutated_sweep_space(space):
    _file_case(
        "sweep",
        "--space",
        "space.yaml",
        space,
        ("sweep.json", "results.parquet"),
        ["space.yaml", "wl.yaml"],
        "--trials",
        "2",
    )
