"""The profiler (`sim profile`), its stored regressors and the cost models built on a measured
profile: format and round trips, the eight-regressor table, portable storage and its hash
check, monotone iteration times, order-of-magnitude agreement of fresh measurements with the
committed reference, and the CUDA path as far as a CPU-only machine allows."""
from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest
import yaml

from simulator.costmodel import BatchShape, RooflineCostModel, build_cost_model
from simulator.costmodel.regression import (HASH_KEY, PATH_KEY, SOURCE_KEY, PortableRegressor, RegressionCostModel,
                                            calibration_for, load_calibration, sha256_file)
from simulator.errors import InfersimError
from simulator.hardware.catalog import load_hardware
from simulator.hardware.profile import HardwareProfile
from simulator.models.catalog import load_model
from simulator.paths import hwprofiles_dir

REF = "cpu-reference"


def _ref_paths():
    d = hwprofiles_dir()
    return d / f"{REF}.yaml", d / f"{REF}.calib.json"


def _copy_ref(tmp_path, name="copied", absolute=True):
    """The reference profile under another name in tmp_path, its sidecar beside it (named by
    its absolute path as `sim profile` does outside the catalog, or relative only)."""
    y, c = _ref_paths()
    data = yaml.safe_load(y.read_text())
    side = tmp_path / f"{name}.calib.json"
    shutil.copy(c, side)
    data["name"] = name
    data["sources"][SOURCE_KEY] = side.name
    if absolute:
        data["sources"][PATH_KEY] = str(side)
    ypath = tmp_path / f"{name}.yaml"
    ypath.write_text(yaml.safe_dump(data, sort_keys=False))
    return ypath, side


def _ratio_ok(a: float, b: float, factor: float = 10.0) -> bool:
    return a > 0 and b > 0 and 1.0 / factor <= a / b <= factor


# ---- the committed reference profile ------------------------------------------------------------
def test_reference_profile_validates_and_round_trips(tmp_path):
    ypath, cpath = _ref_paths()
    raw = yaml.safe_load(ypath.read_text())
    hw = HardwareProfile.model_validate(raw)
    assert load_hardware(REF) == hw
    # load -> dump -> load is the identity
    out = tmp_path / "again.yaml"
    out.write_text(yaml.safe_dump(hw.model_dump(mode="json"), sort_keys=False))
    assert load_hardware(str(out)) == hw
    # what it says about itself: when, on what, with which torch; the sidecar and its hash
    for key in ("measured_on", "machine", "torch", SOURCE_KEY, HASH_KEY):
        assert hw.sources.get(key), key
    assert "measured by `sim profile" in hw.source and hw.sources["machine"] in hw.source
    assert hw.sources[SOURCE_KEY] == cpath.name and hw.sources[HASH_KEY] == sha256_file(cpath)
    assert {"linear", "attention", "elementwise"} <= set(hw.efficiency)
    assert all(0 < e.compute <= 1.5 and 0 < e.memory <= 1.5 for e in hw.efficiency.values())
    assert hw.peak_tflops["fp32"] > 0 and hw.memory_bandwidth_gbps > 0 and hw.host_link.h2d_gbps > 0


def test_reference_sidecar_holds_table_and_best():
    cal = calibration_for(load_hardware(REF))
    sm = cal["step_model"]
    assert set(sm["predictors"]) == {"prefill", "decode"}
    for kind, comp in sm["comparison"].items():
        table = comp["table"]
        assert len(table) == 8 and all(len(row) == 5 for row in table.values())
        best = comp["best"]
        assert best["mape"] == pytest.approx(min(v for row in table.values() for v in row.values()))
        assert sm["predictors"][kind]["estimator"] == best["estimator"]
        assert sm["predictors"][kind]["degree"] == best["degree"]
    for key in ("gemm", "stream", "attention", "elementwise", "copy"):
        assert any(r["kind"] == key for r in cal["curves"]), key
    v = cal["validation"]
    assert v["swap"]["rows"] and v["recompute"]["rows"]


# ---- regressors: the table, portable storage ------------------------------------------------------
def _synthetic(n=150, seed=0):
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.integers(1, 5, n), rng.choice([128, 256, 512], n), np.exp(rng.uniform(np.log(8), np.log(512), n)).round(),
                         rng.integers(1, 17, n)]).astype(float)
    y = 1e-4 * X[:, 0] * (X[:, 1] / 128) ** 1.6 * (X[:, 2] * X[:, 3]) ** 0.9 + 2e-4
    return X, y * np.exp(rng.normal(0, 0.02, n))


def test_regressor_table_is_8x5_and_keeps_the_minimum():
    from executor.profiler.regress import REGRESSORS, compare

    X, y = _synthetic()
    comp = compare(X, y, target="prefill", seed=0)
    assert list(comp.table) == list(REGRESSORS) and len(comp.table) == 8
    assert all(sorted(row) == [1, 2, 3, 4, 5] for row in comp.table.values())
    best = min(v for row in comp.table.values() for v in row.values())
    assert comp.best_mape == best
    assert comp.portable["held_out"]["mape"] == pytest.approx(best, abs=1e-4)
    assert comp.conversion_max_rel < 1e-9  # the stored form predicts what scikit-learn predicts


@pytest.mark.parametrize("name", ["linear", "decision_tree", "random_forest", "ridge", "lasso", "elastic_net",
                                  "gradient_boosting", "knn"])
def test_stored_regressor_reloads_with_identical_predictions(name, tmp_path):
    import warnings

    from executor.profiler.regress import make_regressor, to_portable, transform_for
    from simulator.costmodel.regression import design_matrix, poly_powers

    X, y = _synthetic(120, seed=1)
    mean, scale = transform_for(X)
    powers = poly_powers(4, 2)
    D = design_matrix(X, mean, scale, powers)
    est = make_regressor(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(D, np.log(y))
    spec = to_portable(name, 2, est, mean, scale, powers, target="prefill", mape=0.0, n_train=120, n_test=0)
    path = tmp_path / "reg.json"
    path.write_text(json.dumps(spec))
    before = PortableRegressor(spec).predict(X)
    after = PortableRegressor(json.loads(path.read_text())).predict(X)
    assert np.array_equal(before, after)
    np.testing.assert_allclose(after, np.exp(est.predict(D)), rtol=1e-12)


@pytest.mark.parametrize("absolute", [True, False])
def test_tampered_sidecar_is_refused_in_one_line(tmp_path, monkeypatch, absolute):
    ypath, cpath = _copy_ref(tmp_path, absolute=absolute)
    if not absolute:
        monkeypatch.chdir(tmp_path)  # a relative sidecar name is looked up in the catalog, then here
    hw = load_hardware(str(ypath))
    assert RegressionCostModel(load_model("llama-68m"), hw, dtype="fp32").prefill_time_s(100) > 0
    data = cpath.read_bytes()
    cpath.write_bytes(data.replace(b'"version": 1', b'"version":  1', 1))  # same JSON, other bytes
    with pytest.raises(InfersimError) as err:
        build_cost_model("regression", load_model("llama-68m"), load_hardware(str(ypath)), dtype="fp32")
    msg = str(err.value)
    assert "sha256" in msg and "refusing" in msg and "\n" not in msg
    # and through the CLI: one line on stderr, exit status 2
    from simulator.cli.main import main

    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump({"model": "opt-125m", "hardware": {"profile": str(ypath)},
                                  "serving": {"cost_model": "regression", "gpu_blocks": 60, "cpu_blocks": 10},
                                  "requests": {"count": 5, "arrival": {"type": "poisson", "rate": 1.0},
                                               "prompt_tokens": {"type": "fixed", "value": 10},
                                               "output_tokens": {"type": "fixed", "value": 5}}}))
    assert main(["run", "--workload", str(wl), "--out", str(tmp_path / "r"), "-q", "--no-plots"]) == 2
    # a file with no recorded hash is not read either
    with pytest.raises(InfersimError, match="no recorded sha256"):
        load_calibration(cpath, None)


def test_profile_without_calibration_gives_one_line_error():
    with pytest.raises(InfersimError) as err:
        build_cost_model("regression", load_model("llama-7b"), load_hardware("a100"))
    assert "sim profile" in str(err.value) and "\n" not in str(err.value)


# ---- cost models on the reference profile -------------------------------------------------------------
@pytest.mark.parametrize("model", ["llama-68m", "opt-125m", "llama-7b"])
def test_cost_models_on_reference_are_positive_and_monotone(model):
    hw = load_hardware(REF)
    spec = load_model(model)
    for cm in (RegressionCostModel(spec, hw, dtype="fp32"), RooflineCostModel(spec, hw, dtype="fp32")):
        prefill = np.array([cm.prefill_time_s(t) for t in range(1, 6000, 23)])
        assert (prefill > 0).all() and (np.diff(prefill) >= 0).all(), cm.name
        for batch in (1, 7, 64):
            ctx = np.arange(batch) * 37 % 900 + 5
            steps = cm.decode_step_times_s(ctx, 1500)
            assert (steps > 0).all() and (np.diff(steps) >= 0).all(), (cm.name, batch)
            one = np.array([cm.iteration_time_s(BatchShape.decode(ctx + j)) for j in (0, 700, 1499)])
            assert np.array_equal(one, steps[[0, 700, 1499]])
        grow = [cm.iteration_time_s(BatchShape.prefill([t] * 4)) for t in (16, 64, 256)]
        assert grow == sorted(grow)
        assert cm.transfer_time_s(1e8, "d2h") > cm.transfer_time_s(1e6, "d2h") > 0


def test_simulator_uses_a_profile_by_path_with_the_regression_model(tmp_path):
    from simulator.cli.main import main

    ypath, _ = _copy_ref(tmp_path)
    wl = tmp_path / "w.yaml"
    wl.write_text(yaml.safe_dump({
        "name": "cpu", "model": "opt-125m", "hardware": {"profile": str(ypath)},
        "serving": {"cost_model": "regression", "preemption": "cost_aware", "dtype": "fp32", "gpu_blocks": 60,
                    "cpu_blocks": 40},
        "requests": {"count": 40, "arrival": {"type": "poisson", "rate": 20.0},
                     "prompt_tokens": {"type": "uniform", "low": 50, "high": 400},
                     "output_tokens": {"type": "uniform", "low": 10, "high": 60}},
        "seed": 1}))
    assert main(["run", "--workload", str(wl), "--out", str(tmp_path / "run"), "-q", "--no-plots"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["finished"] == 40
    cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert "regression" in json.dumps(cfg)


# ---- fresh measurements against the reference ----------------------------------------------------------
def _bench(threads=1):
    import torch

    from executor.profiler.device import Repeats, make_timer, select_device
    from executor.profiler.kernels import Bench

    torch.set_num_threads(threads)
    dev = select_device("cpu")
    return Bench(device=dev, timer=make_timer(dev), dtype="fp32", rep=Repeats(1, 5, 15, 0.05))


def test_tiny_fresh_measurement_agrees_with_reference_in_order_of_magnitude():
    from executor.profiler.kernels import copy_sweep, gemm_sweep, stream_sweep

    hw = load_hardware(REF)
    cal = calibration_for(hw)
    ref_gemm = {(r["m"], r["k"], r["n"]): r for r in cal["curves"] if r["kind"] == "gemm" and r["dtype"] == "fp32"}
    shapes = [s for s in ((128, 768, 3072), (1, 3072, 768), (32, 2048, 2048)) if s in ref_gemm]
    assert shapes
    b = _bench()
    fresh = gemm_sweep(b, [(m, k, n, "t") for m, k, n in shapes])
    for r in fresh:
        ref = ref_gemm[(r["m"], r["k"], r["n"])]
        assert _ratio_ok(r["median_s"], ref["median_s"]), (r["m"], r["k"], r["n"], r["median_s"], ref["median_s"])
    assert _ratio_ok(max(r["achieved_flops"] for r in fresh), hw.peak_tflops["fp32"] * 1e12, 20)
    stream = stream_sweep(b, [64 << 20])
    assert _ratio_ok(max(r["achieved_bytes"] for r in stream), hw.memory_bandwidth_gbps * 1e9)
    copies = copy_sweep(b, [("h2d", "plain", False, 16 << 20), ("d2h", "plain", False, 16 << 20)])
    for r in copies:
        link = hw.host_link.h2d_gbps if r["direction"] == "h2d" else hw.host_link.d2h_gbps
        assert _ratio_ok(r["achieved_bytes"], link * 1e9)


def test_sim_profile_quick_writes_a_consistent_profile(tmp_path):
    from simulator.cli.main import main

    out = tmp_path / "fresh.yaml"
    t0 = time.perf_counter()
    assert main(["profile", "--quick", "--threads", "1", "--out", str(out), "-q"]) == 0
    assert time.perf_counter() - t0 < 120
    hw = load_hardware(str(out))
    side = tmp_path / "fresh.calib.json"
    assert side.is_file() and hw.sources[HASH_KEY] == sha256_file(side)
    assert hw.name == "fresh" and out.read_text().startswith("# Hardware profile measured by `sim profile`")
    ref = load_hardware(REF)
    assert _ratio_ok(hw.peak_tflops["fp32"], ref.peak_tflops["fp32"])
    assert _ratio_ok(hw.memory_bandwidth_gbps, ref.memory_bandwidth_gbps)
    assert _ratio_ok(hw.host_link.h2d_gbps, ref.host_link.h2d_gbps)
    assert _ratio_ok(hw.host_link.d2h_gbps, ref.host_link.d2h_gbps)
    cal = calibration_for(hw)
    for comp in cal["step_model"]["comparison"].values():
        assert len(comp["table"]) == 8 and all(len(r) == 5 for r in comp["table"].values())
    spec = load_model("llama-68m")
    fresh_t = RegressionCostModel(spec, hw, dtype="fp32").prefill_time_s(256)
    ref_t = RegressionCostModel(spec, ref, dtype="fp32").prefill_time_s(256)
    assert _ratio_ok(fresh_t, ref_t)


# ---- the CUDA path on a machine without CUDA ---------------------------------------------------------------
def test_device_flag_selects_cuda_and_fails_in_one_line_without_it(capsys):
    import torch

    from executor.profiler.device import CpuTimer, CudaEventTimer, select_device, timer_class_for
    from simulator.cli.main import main

    assert timer_class_for("cuda") is CudaEventTimer and timer_class_for("cpu") is CpuTimer
    assert select_device("cpu").type == "cpu"
    with pytest.raises(InfersimError):
        select_device("tpu")
    if torch.cuda.is_available():
        assert select_device("cuda").type == "cuda"
        return
    with pytest.raises(InfersimError) as err:
        select_device("cuda")
    assert "CUDA is not available" in str(err.value) and "\n" not in str(err.value)
    assert select_device("auto").type == "cpu"
    assert main(["profile", "--device", "cuda", "--quick", "--out", "/nonexistent/x.yaml", "-q"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "CUDA is not available" in lines[0]


def test_cuda_copy_plan_has_pinned_and_pageable_buffers():
    from executor.profiler.device import copy_variants, host_buffer
    from executor.profiler.kernels import copy_plan

    assert copy_variants("cuda") == [("pinned", True), ("pageable", False)]
    assert copy_variants("cpu") == [("plain", False)]
    plan = copy_plan("cuda", quick=True)
    assert {(d, v, p) for d, v, p, _ in plan} == {("h2d", "pinned", True), ("h2d", "pageable", False),
                                                  ("d2h", "pinned", True), ("d2h", "pageable", False)}
    assert all(not p for _, _, p, _ in copy_plan("cpu", quick=True))
    with pytest.raises(InfersimError, match="pinned host memory needs a CUDA device"):
        host_buffer(1024, pinned=True, device_type="cpu")
    assert host_buffer(1024, pinned=False, device_type="cpu").numel() == 1024


def test_cuda_event_timer_records_and_synchronizes():
    """The event timer's protocol, on a stand-in for torch.cuda: synchronize, record start, run,
    record end, wait for the end event, read the elapsed milliseconds."""
    from executor.profiler.device import CudaEventTimer

    calls = []

    class _Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.name = f"e{len([c for c in calls if c[0] == 'new'])}"
            calls.append(("new", self.name))

        def record(self):
            calls.append(("record", self.name))

        def synchronize(self):
            calls.append(("wait", self.name))

        def elapsed_time(self, end):
            calls.append(("elapsed", self.name, end.name))
            return 2.5

    class Cuda:
        Event = _Event

        @staticmethod
        def synchronize(device=None):
            calls.append(("sync",))

    class FakeTorch:
        cuda = Cuda

    timer = CudaEventTimer.__new__(CudaEventTimer)
    timer.torch, timer.device = FakeTorch, "cuda:0"
    timer._start, timer._end = _Event(enable_timing=True), _Event(enable_timing=True)
    calls.clear()
    assert timer.time(lambda: calls.append(("work",))) == pytest.approx(2.5e-3)
    assert calls == [("sync",), ("record", "e0"), ("work",), ("record", "e1"), ("wait", "e1"), ("elapsed", "e0", "e1")]
