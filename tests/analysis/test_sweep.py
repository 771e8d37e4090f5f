"""`sim sweep`: spaces, grid and Optuna sweeps, failures recorded, Pareto fronts, resuming a
killed sweep without losing or duplicating a configuration, and the Ray backend."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infersim.analysis.sweep import (
    SweepOptions,
    SweepSpace,
    build_params,
    config_key,
    grid_points,
    load_results,
    pareto_mask,
    resolve_config,
    run_sweep,
    set_dotted,
)
from infersim.analysis.sweep_backends import BackendOptions
from infersim.cli.main import main
from infersim.simulator.errors import InfersimError

WORKLOAD = """\
name: sweep-test
model: llama-2-7b
hardware: {profile: a100-80gb-pcie}
serving: {gpu_blocks: 400, cpu_blocks: 200}
requests:
  count: 120
  arrival: {type: poisson, rate: 6.0}
  prompt_tokens: {type: lognormal, mean: 300, cv: 0.8, max: 1500}
  output_tokens: {type: lognormal, mean: 120, cv: 0.8, max: 600}
seed: 1
"""


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    p = tmp_path_factory.mktemp("wl") / "sweep-test.yaml"
    p.write_text(WORKLOAD)
    return str(p)


def _space(**kw) -> SweepSpace:
    return SweepSpace.model_validate(kw)


def test_dotted_paths():
    d = {"serving": {"preemption": "recompute"}, "speculation": None}
    set_dotted(d, "serving.preemption", "swap")
    set_dotted(d, "speculation.s", 4)  # a null section becomes a mapping
    set_dotted(d, "a.b.c", 1)
    set_dotted(d, "offload.policy", None)  # null under an absent section: left absent
    assert d == {"serving": {"preemption": "swap"}, "speculation": {"s": 4}, "a": {"b": {"c": 1}}}
    base = {"x": {"y": 1}}
    assert resolve_config(base, {"x.y": 2}) == {"x": {"y": 2}} and base == {"x": {"y": 1}}
    # a number steps into a list: one draft's acceptance among several
    drafts = {"speculation": {"drafts": [{"acceptance": {"alpha": 0.8}}, {"acceptance": {"alpha": 0.6}}]}}
    swept = resolve_config(drafts, {"speculation.drafts.1.acceptance.alpha": 0.5})
    assert [x["acceptance"]["alpha"] for x in swept["speculation"]["drafts"]] == [0.8, 0.5]
    with pytest.raises(InfersimError, match="'2' is not an index of the 2 items"):
        set_dotted(drafts, "speculation.drafts.2.acceptance.alpha", 0.5)
    assert config_key({"a": 1, "b": 2}) == config_key({"b": 2, "a": 1}) != config_key({"a": 1, "b": 3})


def test_params_and_grid_size():
    space = _space(
        parameters={
            "serving.scheduler": ["fcfs", "fairness"],
            "serving.max_batch_size": {"low": 8, "high": 64, "num": 4, "log": True},
            "requests.arrival.rate": {"low": 1.0, "high": 2.0, "step": 0.5},
            "serving.block_size": {"values": [16]},
            "hardware.tensor_parallel": {"low": 1, "high": 2},
        }
    )
    params = {p.path: p for p in build_params(space)}
    assert params["serving.max_batch_size"].values == [8, 16, 32, 64] and params["serving.max_batch_size"].kind == "int"
    assert params["requests.arrival.rate"].values == [1.0, 1.5, 2.0] and params["requests.arrival.rate"].kind == "float"
    assert params["hardware.tensor_parallel"].values == [1, 2]
    pts = grid_points(list(params.values()))
    assert len(pts) == 2 * 4 * 3 * 1 * 2
    assert len({json.dumps(p, sort_keys=True) for p in pts}) == len(pts)
    as_written = build_params(_space(parameters={"a": {"low": 4.0, "high": 24.0}, "b": {"low": 4, "high": 24}}))
    assert [p.kind for p in as_written] == ["float", "int"]
    with pytest.raises(InfersimError, match="optuna"):
        grid_points(build_params(_space(parameters={"requests.arrival.rate": {"low": 1.0, "high": 2.5}})))


def test_grid_sweep_table_and_plots(workload, tmp_path):
    space = _space(
        name="g",
        parameters={
            "serving.scheduler": ["fcfs", "fairness"],
            "serving.preemption": ["recompute", "swap", "cost_aware"],
            "serving.max_batch_size": [8, 64],
        },
    )
    res = run_sweep(workload, space, tmp_path / "s", run=BackendOptions(workers=2))
    df = res.table
    assert len(df) == 2 * 3 * 2 == res.computed and res.cached == 0 and res.failed == 0
    assert df["key"].is_unique and (df["status"] == "ok").all()
    combos = set(zip(df["serving.scheduler"], df["serving.preemption"], df["serving.max_batch_size"]))
    assert len(combos) == 12
    assert {"throughput_output_tokens_per_s", "e2e_s.p99", "ttft_s.p99", "preemptions.recompute"} <= set(df.columns)
    pq = pd.read_parquet(tmp_path / "s" / "results.parquet")
    assert len(pq) == 12 and list(pq["key"]) == list(df["key"])
    assert len(pd.read_csv(tmp_path / "s" / "results.csv")) == 12
    for f in ("plots/pareto.png", "plots/sensitivity.png", "pareto.csv", "sensitivity.csv", "report.md"):
        assert (tmp_path / "s" / f).stat().st_size > 100
    # results are those of `sim run` with the same settings (the sweep adds no noise)
    from infersim.analysis.sweep import run_config

    row = df.iloc[5]
    cfg = resolve_config(
        json.loads((tmp_path / "s" / "sweep.json").read_text())["base"],
        {
            "serving.scheduler": row["serving.scheduler"],
            "serving.preemption": row["serving.preemption"],
            "serving.max_batch_size": int(row["serving.max_batch_size"]),
        },
    )
    direct = run_config({"config": cfg, "base_dir": str(Path(workload).parent)})
    assert direct["summary"]["e2e_s"]["p99"] == pytest.approx(row["e2e_s.p99"], rel=1e-12)
    # the front written is non-dominated among the rows
    front = pd.read_csv(tmp_path / "s" / "pareto.csv")
    for _, f in front.iterrows():
        better = df[
            (df["throughput_output_tokens_per_s"] >= f["throughput_output_tokens_per_s"])
            & (df["e2e_s.p99"] <= f["e2e_s.p99"])
            & (
                (df["throughput_output_tokens_per_s"] > f["throughput_output_tokens_per_s"])
                | (df["e2e_s.p99"] < f["e2e_s.p99"])
            )
        ]
        assert better.empty


def test_failed_configurations_are_recorded_and_the_sweep_goes_on(workload, tmp_path):
    space = _space(
        parameters={
            "serving.preemption": ["recompute", "swap"],
            "speculation.s": [None, 4],
            "hardware.profile": ["a100-80gb-pcie", "tpu-v9"],
        }
    )
    res = run_sweep(workload, space, tmp_path / "f", run=BackendOptions(workers=1))
    df = res.table
    assert len(df) == 8
    ok = df[df["status"] == "ok"]  # speculation.s: null leaves the workload without speculation
    assert len(ok) == 2 and set(ok["hardware.profile"]) == {"a100-80gb-pcie"} and ok["speculation.s"].isna().all()
    bad_hw = df[(df["hardware.profile"] == "tpu-v9") & df["speculation.s"].isna()]
    assert (bad_hw["status"] == "failed").all() and bad_hw["error"].str.contains("tpu-v9").all()
    spec_rows = df[df["speculation.s"].notna() & (df["hardware.profile"] == "a100-80gb-pcie")]
    assert (spec_rows["status"] == "failed").all() and spec_rows["error"].str.contains("speculation").all()
    # failures are results too: a rerun computes nothing, --retry-failed recomputes only them
    again = run_sweep(workload, space, tmp_path / "f", run=BackendOptions(workers=1))
    assert again.computed == 0 and again.cached == 8
    retry = run_sweep(
        workload, space, tmp_path / "f", run=BackendOptions(workers=1), options=SweepOptions(retry_failed=True)
    )
    assert retry.computed == res.failed and len(retry.table) == 8


def test_other_sweep_in_the_same_folder_is_refused(workload, tmp_path):
    run_sweep(
        workload,
        _space(parameters={"serving.max_batch_size": [8]}),
        tmp_path / "x",
        run=BackendOptions(workers=1),
        options=SweepOptions(plots=False),
    )
    with pytest.raises(InfersimError, match="different sweep"):
        run_sweep(
            workload, _space(parameters={"serving.max_batch_size": [16]}), tmp_path / "x", run=BackendOptions(workers=1)
        )


def _dominates(a, b, maximize):
    s = np.where(maximize, -1.0, 1.0)
    a, b = a * s, b * s
    return bool(np.all(a <= b) and np.any(a < b))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6), st.integers(0, 3)), min_size=1, max_size=25),
    st.lists(st.booleans(), min_size=3, max_size=3),
)
def test_pareto_front_is_non_dominated_and_covers_the_rest(points, maximize):
    v = np.array(points, dtype=float)
    mask = pareto_mask(v, maximize)
    assert mask.any()
    for i in np.flatnonzero(mask):
        assert not any(_dominates(v[j], v[i], maximize) for j in range(len(v)))
    for i in np.flatnonzero(~mask):
        assert any(_dominates(v[j], v[i], maximize) for j in np.flatnonzero(mask))


def test_pareto_hand_example_and_nan():
    # (throughput up, latency down)
    v = np.array([[10, 5], [12, 6], [9, 4], [11, 7], [12, 6], [np.nan, 1]])
    assert pareto_mask(v, [True, False]).tolist() == [True, True, True, False, True, False]


def _space_file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "space.yaml"
    p.write_text(text)
    return p


KILL_SPACE = """\
name: kill-test
parameters:
  serving.max_batch_size: [8, 16, 32, 64]
  serving.preemption: [recompute, swap]
  serving.scheduler: [fcfs, fairness]
fixed: {requests.count: 400}
"""


def _sweep_started(workload: str, space_path: Path, out: Path, done: int) -> subprocess.Popen:
    """`sim sweep` on two workers in its own process group (as a terminal runs it), returned
    once `done` configurations are written and more are running."""
    cmd = [sys.executable, "-m", "infersim.cli.main", "sweep", "-w", workload, "-s", str(space_path)]
    cmd += ["-o", str(out), "--workers", "2", "-q", "--no-plots"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    results = out / "results"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if results.is_dir() and len([p for p in results.glob("*.json") if not p.name.startswith(".")]) >= done:
            break
        time.sleep(0.02)
    if proc.poll() is not None:
        raise AssertionError("the sweep finished before it could be stopped: " + proc.stderr.read().decode()[-500:])
    return proc


def test_killed_sweep_resumes_without_loss_or_duplicates(workload, tmp_path):
    space_path = _space_file(tmp_path, KILL_SPACE)
    out = tmp_path / "k"
    proc = _sweep_started(workload, space_path, out, done=3)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its worker processes
    proc.wait()
    results = out / "results"
    before = {p.name: p.read_bytes() for p in results.glob("*.json") if not p.name.startswith(".")}
    total = 16
    assert 3 <= len(before) < total
    print("finished before the kill:", len(before))
    assert not (out / "results.parquet").exists()  # killed before the table: it is rebuilt on resume

    res = run_sweep(workload, space_path, out, run=BackendOptions(workers=2), options=SweepOptions(plots=False))
    after = {p.name: p.read_bytes() for p in results.glob("*.json") if not p.name.startswith(".")}
    df = res.table
    # nothing missing, nothing twice
    params = build_params(SweepSpace.model_validate(__import__("yaml").safe_load(KILL_SPACE)))
    base = json.loads((out / "sweep.json").read_text())["base"]
    expected = {config_key(resolve_config(base, pt)) for pt in grid_points(params)}
    assert len(expected) == total
    assert len(df) == total and df["key"].is_unique and set(df["key"]) == expected
    assert set(p[:-5] for p in after) == expected
    # finished ones were not recomputed: same bytes (their run id and time included)
    for name, data in before.items():
        assert after[name] == data
    assert res.cached == len(before) and res.computed == total - len(before)
    run_ids = {json.loads(d)["run_id"] for d in before.values()}
    new_ids = {r["run_id"] for k, r in load_results(out).items() if f"{k}.json" not in before}
    assert len(run_ids) == 1 and len(new_ids) == 1 and run_ids != new_ids
    # a third run has nothing left to do
    assert (
        run_sweep(workload, space_path, out, run=BackendOptions(workers=1), options=SweepOptions(plots=False)).computed
        == 0
    )


def test_ctrl_c_stops_the_driver_and_its_workers_at_once(workload, tmp_path):
    """Ctrl-C in a terminal signals the whole process group, workers included: the sweep ends
    with exit 130 and one line, no process of it left, the finished results kept."""
    out = tmp_path / "k"
    proc = _sweep_started(workload, _space_file(tmp_path, KILL_SPACE), out, done=1)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    err = proc.stderr.read().decode()
    assert err.count("\n") == 1 and "interrupted (SIGINT)" in err, err
    with pytest.raises(ProcessLookupError):  # no worker is left in the group
        os.killpg(proc.pid, 0)
    assert 1 <= len(list((out / "results").glob("*.json"))) < 16


def _worker_pid(_) -> int:
    return os.getpid()


def test_local_workers_leave_sigint_to_the_driver_which_ends_them_on_cancel():
    from infersim.analysis.sweep_backends import LocalBackend

    be = LocalBackend(1)
    assert be.submit(signal.getsignal, signal.SIGINT).result() == signal.SIG_IGN
    pid = be.submit(_worker_pid, None).result()
    be.submit(time.sleep, 120)
    be.close(cancel=True)  # an interrupted sweep: the running simulation ends now
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_pareto_plots_legend_hides_no_configuration(tmp_path, monkeypatch):
    """The worst configurations (slow and low throughput) sit lower right, where the legend was."""
    import infersim.analysis.sweep as sweep

    figures = []
    monkeypatch.setattr(sweep, "finish_figure", lambda fig, path, **kw: figures.append(fig) or path)
    df = pd.DataFrame({"status": "ok", "tp": [1060.0, 1071.0, 930.0, 597.0, 588.0], "lat": [84, 100, 102, 196, 221]})
    front = df.iloc[:2]
    sweep._plot_pareto(sweep.pyplot(), df, front, [], "tp", "lat", tmp_path / "pareto.png")
    fig = figures[0]
    fig.canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    points = ax.transData.transform(df[["lat", "tp"]].to_numpy(float))
    assert not any(legend.contains(x, y) for x, y in points)
    assert legend.y0 >= ax.get_window_extent().y1  # above the plotting area


OPTUNA_SPACE = """\
name: opt
method: optuna
parameters:
  serving.scheduler: [fcfs, fairness]
  serving.preemption: [recompute, swap, cost_aware]
  serving.max_batch_size: {low: 4, high: 128, log: true}
  requests.arrival.rate: {low: 2.0, high: 12.0}
optuna:
  trials: 8
  seed: 3
  objectives:
    - {metric: throughput_output_tokens_per_s, direction: maximize}
    - {metric: e2e_s.p99, direction: minimize}
"""


def test_optuna_multi_objective_and_resume(workload, tmp_path):
    pytest.importorskip("optuna")
    space_path = _space_file(tmp_path, OPTUNA_SPACE)
    out = tmp_path / "o"
    res = run_sweep(workload, space_path, out, run=BackendOptions(workers=2))
    df = res.table
    assert len(df) == 8 and df["key"].is_unique and (df["status"] == "ok").all()
    assert df["serving.max_batch_size"].between(4, 128).all()
    assert df["requests.arrival.rate"].between(2.0, 12.0).all()
    assert (df["serving.max_batch_size"] == df["serving.max_batch_size"].round()).all()
    # a larger budget continues the same study: the first 8 are reused
    more = run_sweep(workload, space_path, out, run=BackendOptions(workers=2), options=SweepOptions(trials=11))
    assert more.cached == 8 and more.computed == 3 and len(more.table) == 11 and more.table["key"].is_unique
    assert set(df["key"]) <= set(more.table["key"])


def test_optuna_single_objective(workload, tmp_path):
    pytest.importorskip("optuna")
    space = _space(
        method="optuna",
        parameters={"serving.max_batch_size": [4, 8, 16, 32, 64], "serving.preemption": ["recompute", "swap"]},
        optuna={"trials": 6, "objectives": [{"metric": "e2e_s.p99", "direction": "minimize"}]},
    )
    res = run_sweep(workload, space, tmp_path / "o1", run=BackendOptions(workers=1))
    assert len(res.table) == 6 and res.table["key"].is_unique


def test_an_unknown_metric_is_refused_before_anything_is_written(workload, tmp_path, capsys):
    """A misspelt objective or Pareto axis is refused in one line naming the space file and the
    field, with no folder written, so the corrected command runs into the same --out."""
    out = tmp_path / "o"
    objective = "optuna:\n  trials: 2\n  objectives: [{metric: e2e.p99, direction: minimize}]\n"
    bad = _space_file(tmp_path, f"method: optuna\nparameters:\n  serving.max_batch_size: [4, 8]\n{objective}")
    assert main(["sweep", "-w", workload, "-s", str(bad), "-o", str(out), "--workers", "1", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"sim sweep: error: {bad}: field 'optuna.objectives.0.metric': unknown metric 'e2e.p99'; "
        "did you mean 'e2e_s.p99'?"
    )
    assert not out.exists()
    axis = "pareto: {throughput: happiness}\n"
    bad.write_text(f"parameters:\n  serving.max_batch_size: [4, 8]\n{axis}")
    assert main(["sweep", "-w", workload, "-s", str(bad), "-o", str(out), "--workers", "1", "-q"]) == 2
    assert f"{bad}: field 'pareto.throughput': unknown metric 'happiness'; known: aborted," in capsys.readouterr().err
    bad.write_text(
        objective.replace("e2e.p99", "e2e_s.p99") + "method: optuna\nparameters:\n  serving.max_batch_size: [4, 8]\n"
    )
    assert main(["sweep", "-w", workload, "-s", str(bad), "-o", str(out), "--workers", "1", "-q"]) == 0
    assert len(load_results(out)) == 2


def test_the_same_sweep_twice_gives_byte_identical_tables(workload, tmp_path):
    space = _space(parameters={"serving.preemption": ["recompute", "swap"], "serving.max_batch_size": [8, 32]})
    for folder, workers in (("a", 1), ("b", 2)):
        run_sweep(workload, space, tmp_path / folder, run=BackendOptions(workers=workers))
    for name in ("results.csv", "results.parquet", "pareto.csv", "sensitivity.csv", "report.md", "plots/pareto.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_an_optuna_sweep_on_two_workers_is_reproducible(workload, tmp_path):
    """Trials are told in the order they were asked, whichever finished first: past TPE's 10
    random start-up trials, two runs on two workers propose the same configurations."""
    pytest.importorskip("optuna")
    space = _space(
        method="optuna",
        parameters={"serving.max_batch_size": {"low": 4, "high": 64}, "serving.preemption": ["recompute", "swap"]},
        optuna={"trials": 14, "seed": 3},
    )
    for folder in ("a", "b"):
        run_sweep(workload, space, tmp_path / folder, run=BackendOptions(workers=2), options=SweepOptions(plots=False))
    assert (tmp_path / "a" / "results.csv").read_bytes() == (tmp_path / "b" / "results.csv").read_bytes()
    assert len(load_results(tmp_path / "a")) == 14


def test_a_list_index_out_of_range_is_refused_before_anything_is_written(tmp_path, capsys):
    draft = str(Path(__file__).resolve().parents[2] / "examples/speculative/draft.yaml")  # one draft
    space = _space_file(tmp_path, "parameters:\n  speculation.drafts.1.acceptance.alpha: [0.6, 0.8]\n")
    out = tmp_path / "s"
    assert main(["sweep", "-w", draft, "-s", str(space), "-o", str(out), "--workers", "1", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        f"{space}: field 'parameters.speculation.drafts.1.acceptance.alpha': '1' is not an index of the 1 items "
        "at this point of 'speculation.drafts.1.acceptance.alpha' (0-based)"
    )
    assert not out.exists()


def test_a_trace_too_large_for_memory_is_refused_before_the_sweep_starts(tmp_path, capsys, monkeypatch):
    """The trace's 200,000 rows are counted: 256 MiB + 200,000 x 512 B + 2 configurations x 4 KB
    = 0.371 GB on one worker, more than the 0.3 GB this test makes available; twice that on
    64 workers, which run at most the 2 configurations at once."""
    monkeypatch.setattr("infersim.simulator.validation.host_available_bytes", lambda: 300_000_000)
    (tmp_path / "big.csv").write_text("ts,p,o\n" + "0,5,6\n" * 200_000)
    wl = tmp_path / "wl.yaml"
    wl.write_text(
        "model: llama-2-7b\nhardware: {profile: a100-80gb-pcie}\nrequests:\n"
        "  trace: {file: big.csv, arrival_column: ts, prompt_column: p, output_column: o}\n"
    )
    space = _space_file(tmp_path, "parameters:\n  serving.preemption: [recompute, swap]\n")
    out = tmp_path / "s"
    assert main(["sweep", "-w", str(wl), "-s", str(space), "-o", str(out), "--workers", "1", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{space}: field 'parameters': 2 configurations on 1 worker would need about 0.371 GB of memory" in err
    # more workers than configurations: only two simulations can run at once (2 x 0.371 GB)
    assert main(["sweep", "-w", str(wl), "-s", str(space), "-o", str(out), "--workers", "64", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{space}: field 'parameters': 2 configurations on 2 workers would need about 0.742 GB" in err
    assert not out.exists()


def test_a_sweep_whose_every_configuration_failed_exits_3(workload, tmp_path, capsys):
    space = _space_file(tmp_path, "parameters:\n  serving.shceduler: [fcfs, fairness]\n")
    argv = ["sweep", "-w", workload, "-s", str(space), "-o", str(tmp_path / "s"), "--workers", "1"]
    assert main([*argv, "-q"]) == 3
    err = capsys.readouterr().err.strip()
    assert err == (
        "every configuration failed (2); the first reason: configuration: field 'serving.shceduler': "
        "Extra inputs are not permitted"
    )
    assert main(argv) == 3 and "failed (2): configuration: field 'serving.shceduler'" in capsys.readouterr().out


@pytest.mark.parametrize("width", [80, 200])
def test_the_pareto_front_keeps_every_name_and_value_whole(workload, tmp_path, capsys, monkeypatch, width):
    """At 80 columns the table became 'throughput_output_tok…' and 'recomp…'; now it is a table
    where every cell fits whole, else one block per configuration."""
    monkeypatch.setenv("COLUMNS", str(width))
    space = _space_file(
        tmp_path,
        "parameters:\n  serving.preemption: [recompute, cost_aware]\n  serving.scheduler: [fcfs]\n"
        "  serving.max_batch_size: [16]\n  serving.chunked_prefill: [false]\n",
    )
    argv = ["sweep", "-w", workload, "-s", str(space), "-o", str(tmp_path / "s"), "--workers", "1", "--no-plots"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "throughput_output_tokens_per_s" in out and "cost_aware" in out and "…" not in out
    assert max(len(line) for line in out.splitlines()) <= width


def test_a_summary_without_plots_leaves_no_earlier_figures(workload, tmp_path):
    """An Optuna sweep extended with --no-plots kept the figures of its first trials beside a
    table of more; a summary without plots removes them."""
    space = _space(parameters={"serving.preemption": ["recompute", "swap"]})
    out = tmp_path / "s"
    run_sweep(workload, space, out, run=BackendOptions(workers=1))
    assert (out / "plots" / "pareto.png").is_file() and "pareto.png" in (out / "report.md").read_text()
    run_sweep(workload, space, out, run=BackendOptions(workers=1), options=SweepOptions(plots=False))
    assert not list((out / "plots").glob("*.png")) and "png" not in (out / "report.md").read_text()


def test_pareto_table_headings_tell_parameters_apart():
    from infersim.cli.sweep import _heading

    params = [
        "serving.max_batch_size",
        "speculation.drafts.0.acceptance.alpha",
        "speculation.drafts.1.acceptance.alpha",
    ]
    assert [_heading(p, params) for p in params] == ["max_batch_size", "0.acceptance.alpha", "1.acceptance.alpha"]
    assert _heading("e2e_s.p99", params) == "e2e_s.p99"  # a metric keeps its name


def test_cli_sweep(workload, tmp_path, capsys):
    space_path = _space_file(tmp_path, "parameters:\n  serving.preemption: [recompute, swap]\n")
    out = tmp_path / "c"
    assert main(["sweep", "-w", workload, "-s", str(space_path), "-o", str(out), "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert "2 configurations" in text and "Pareto front" in text
    assert len(pd.read_parquet(out / "results.parquet")) == 2
    bad = _space_file(tmp_path, "parameters:\n  serving.preemption: [recompute]\nmethod: annealing\n")
    assert main(["sweep", "-w", workload, "-s", str(bad), "-o", str(tmp_path / "d"), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert "method" in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert main(["sweep", "-w", workload, "-s", str(space_path), "-o", str(out), "--workers", "0", "-q"]) == 2


def test_a_profile_file_given_as_a_sweep_value_is_found_beside_the_space_or_the_workload(tmp_path, monkeypatch, capsys):
    """`hardware.profile: [card.yaml]` in a space resolves as a workload's own profile does:
    from the current folder first, then beside the space file, then beside the workload."""
    from infersim.simulator.paths import hwprofiles_dir

    (tmp_path / "spaces").mkdir(), (tmp_path / "wl").mkdir(), (tmp_path / "here").mkdir()
    h100 = (hwprofiles_dir() / "h100-pcie.yaml").read_text()
    (tmp_path / "spaces" / "card.yaml").write_text(h100)
    (tmp_path / "wl" / "wcard.yaml").write_text(h100)
    (tmp_path / "wl" / "w.yaml").write_text(WORKLOAD)
    space = "parameters:\n  hardware.profile: [card.yaml, wcard.yaml, h100-pcie, a100-80gb-pcie]\n"
    (tmp_path / "spaces" / "space.yaml").write_text(space + "fixed: {requests.count: 20}\n")
    monkeypatch.chdir(tmp_path / "here")
    argv = ["sweep", "-w", "../wl/w.yaml", "-s", "../spaces/space.yaml", "--workers", "1", "-q"]
    assert main(argv + ["-o", "a"]) == 0, capsys.readouterr().err
    table = pd.read_parquet("a/results.parquet").set_index("hardware.profile")
    assert (table["status"] == "ok").all(), table["error"].tolist()
    assert set(table.index) == {"../spaces/card.yaml", "../wl/wcard.yaml", "h100-pcie", "a100-80gb-pcie"}
    tput = table["throughput_output_tokens_per_s"]
    assert tput["../spaces/card.yaml"] == tput["../wl/wcard.yaml"] == tput["h100-pcie"] != tput["a100-80gb-pcie"]
    # a file of that name in the current folder wins
    (tmp_path / "here" / "card.yaml").write_text((hwprofiles_dir() / "a100-80gb-pcie.yaml").read_text())
    assert main(argv + ["-o", "b"]) == 0, capsys.readouterr().err
    table = pd.read_parquet("b/results.parquet").set_index("hardware.profile")
    assert table["throughput_output_tokens_per_s"]["card.yaml"] == tput["a100-80gb-pcie"]


def test_ray_backend_matches_local(workload, tmp_path):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        space = _space(parameters={"serving.preemption": ["recompute", "swap"], "serving.max_batch_size": [8, 32]})
        r = run_sweep(
            workload, space, tmp_path / "ray", run=BackendOptions(backend="ray"), options=SweepOptions(plots=False)
        )
        assert r.backend.startswith("ray")
        local = run_sweep(
            workload, space, tmp_path / "local", run=BackendOptions(workers=1), options=SweepOptions(plots=False)
        )
        a, b = r.table.set_index("key"), local.table.set_index("key")
        assert sorted(a.index) == sorted(b.index) and len(a) == 4
        for col in ("e2e_s.p99", "throughput_output_tokens_per_s", "ttft_s.p99"):
            assert np.allclose(a.loc[b.index, col].astype(float), b[col].astype(float), rtol=1e-12)
        workers = [rec["worker"] for rec in load_results(tmp_path / "ray").values()]
        assert all(not w.endswith(f":{os.getpid()}") for w in workers)  # ran in Ray workers
    finally:
        ray.shutdown()


def _dies_on_16(task):
    from infersim.analysis import sweep

    if task["config"]["serving"]["max_batch_size"] == 16:
        os._exit(1)  # a worker killed mid-configuration (out of memory, say)
    return sweep._real_run_config(task)


def test_dead_worker_stops_the_sweep_without_recording_false_failures(workload, tmp_path, monkeypatch):
    from infersim.analysis import sweep

    monkeypatch.setattr(sweep, "_real_run_config", sweep.run_config, raising=False)
    monkeypatch.setattr(sweep, "run_config", _dies_on_16)  # the forked workers see the patched module
    space = _space(parameters={"serving.max_batch_size": [8, 16, 32, 64]})
    with pytest.raises(InfersimError, match="worker process died"):
        run_sweep(workload, space, tmp_path / "w", run=BackendOptions(workers=2), options=SweepOptions(plots=False))
    assert all(r["status"] == "ok" for r in load_results(tmp_path / "w").values())
    monkeypatch.setattr(sweep, "run_config", sweep._real_run_config)
    res = run_sweep(workload, space, tmp_path / "w", run=BackendOptions(workers=2), options=SweepOptions(plots=False))
    assert len(res.table) == 4 and (res.table["status"] == "ok").all()
