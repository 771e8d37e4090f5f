"""The profiler (`sim profile`), its stored regressors and the cost models built on a measured
profile: format and round trips, the eight-regressor table, portable storage and its hash
check, monotone iteration times, order-of-magnitude agreement of fresh measurements with the
committed reference, and the CUDA path as far as a CPU-only machine allows."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import yaml

from infersim.simulator.costmodel import BatchShape, RooflineCostModel, build_cost_model
from infersim.simulator.costmodel.calibration_file import (
    HASH_KEY,
    PATH_KEY,
    SOURCE_KEY,
    calibration_for,
    load_calibration,
    sha256_file,
)
from infersim.simulator.costmodel.regression import PortableRegressor, RegressionCostModel
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.hardware.profile import HardwareProfile
from infersim.simulator.models.catalog import load_model
from infersim.simulator.paths import hwprofiles_dir
from tests.utils import poisson, requests_section

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
    X = np.column_stack(
        [
            rng.integers(1, 5, n),
            rng.choice([128, 256, 512], n),
            np.exp(rng.uniform(np.log(8), np.log(512), n)).round(),
            rng.integers(1, 17, n),
        ]
    ).astype(float)
    y = 1e-4 * X[:, 0] * (X[:, 1] / 128) ** 1.6 * (X[:, 2] * X[:, 3]) ** 0.9 + 2e-4
    return X, y * np.exp(rng.normal(0, 0.02, n))


def test_regressor_table_is_8x5_and_keeps_the_minimum():
    from infersim.executor.profiler.regress import REGRESSORS, Candidates, compare

    X, y = _synthetic()
    comp = compare(X, y, target="prefill", candidates=Candidates(seed=0))
    assert list(comp.table) == list(REGRESSORS) and len(comp.table) == 8
    assert all(sorted(row) == [1, 2, 3, 4, 5] for row in comp.table.values())
    best = min(v for row in comp.table.values() for v in row.values())
    assert comp.best_mape == best
    assert comp.portable["held_out"]["mape"] == pytest.approx(best, abs=1e-4)
    assert comp.conversion_max_rel < 1e-9  # the stored form predicts what scikit-learn predicts


@pytest.mark.parametrize(
    "name", ["linear", "decision_tree", "random_forest", "ridge", "lasso", "elastic_net", "gradient_boosting", "knn"]
)
def test_stored_regressor_reloads_with_identical_predictions(name, tmp_path):
    import warnings

    from infersim.executor.profiler.regress import FitRecord, make_regressor, to_portable, transform_for
    from infersim.simulator.costmodel.regression import design_matrix, poly_powers

    X, y = _synthetic(120, seed=1)
    mean, scale = transform_for(X)
    powers = poly_powers(4, 2)
    D = design_matrix(X, mean, scale, powers)
    est = make_regressor(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(D, np.log(y))
    spec = to_portable(name, 2, est, mean, scale, powers, FitRecord("prefill", mape=0.0, n_train=120, n_test=0))
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
    from infersim.cli.main import main

    wl = tmp_path / "w.yaml"
    wl.write_text(
        yaml.safe_dump(
            {
                "model": "opt-125m",
                "hardware": {"profile": str(ypath)},
                "serving": {"cost_model": "regression", "gpu_blocks": 60, "cpu_blocks": 10},
                "requests": requests_section(5, 10, 5, poisson(1.0)),
            }
        )
    )
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
    from infersim.cli.main import main

    ypath, _ = _copy_ref(tmp_path)
    wl = tmp_path / "w.yaml"
    wl.write_text(
        yaml.safe_dump(
            {
                "name": "cpu",
                "model": "opt-125m",
                "hardware": {"profile": str(ypath)},
                "serving": {
                    "cost_model": "regression",
                    "preemption": "cost_aware",
                    "dtype": "fp32",
                    "gpu_blocks": 60,
                    "cpu_blocks": 40,
                },
                "requests": requests_section(40, (50, 400), (10, 60), poisson(20.0)),
                "seed": 1,
            }
        )
    )
    assert main(["run", "--workload", str(wl), "--out", str(tmp_path / "run"), "-q", "--no-plots"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["finished"] == 40
    cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert "regression" in json.dumps(cfg)


# ---- fresh measurements against the reference ----------------------------------------------------------
def _bench(threads=1):
    import torch

    from infersim.executor.profiler.device import Repeats, make_timer, select_device
    from infersim.executor.profiler.kernels import Bench

    torch.set_num_threads(threads)
    dev = select_device("cpu")
    return Bench(device=dev, timer=make_timer(dev), dtype="fp32", rep=Repeats(1, 5, 15, 0.05))


def test_class_errors_report_the_median_ratio_beside_the_mape():
    """Three benchmarks at 1, 2 and 4 us against a roof of 1 us each: the roofline's ratios are 1,
    0.5, 0.25 (MAPE 41.7%, median 0.5); priced at 2 us each (ratios 2, 1, 0.5): MAPE 50.0% though
    the median ratio is 1. The profile's source gives both, so a fit in log time that centres
    the ratios does not read as worse than the roofline."""
    from infersim.executor.profiler import fit as F

    recs = [{"flops": 1e6, "bytes": 0.0, "median_s": t} for t in (1e-6, 2e-6, 4e-6)]
    peak = 1e12  # 1e6 FLOPs at 1e12 FLOP/s: 1 us
    assert F.class_mape(recs, peak, 1e12, 1.0, 1.0, 0.0) == pytest.approx(100 * (0 + 0.5 + 0.75) / 3)
    assert F.class_median_ratio(recs, peak, 1e12, 1.0, 1.0, 0.0) == pytest.approx(0.5)
    assert F.class_mape(recs, peak, 1e12, 0.5, 1.0, 0.0) == pytest.approx(50.0)
    assert F.class_median_ratio(recs, peak, 1e12, 0.5, 1.0, 0.0) == pytest.approx(1.0)


def test_tiny_fresh_measurement_records_work_and_rates_consistently():
    """A fresh GEMM, stream and copy measurement on this machine: each record carries its work
    (2mkn FLOPs for a GEMM; bytes moved) and the rate it reports is that work over the median
    time. How fast this machine is, is not the test's: it depends on what else runs on it."""
    from infersim.executor.profiler.kernels import copy_sweep, gemm_sweep, stream_sweep

    b = _bench()
    fresh = gemm_sweep(b, [(128, 768, 3072, "t"), (1, 3072, 768, "t")])
    assert [(r["m"], r["k"], r["n"]) for r in fresh] == [(128, 768, 3072), (1, 3072, 768)]
    for r in fresh:
        assert r["flops"] == 2 * r["m"] * r["k"] * r["n"]
        assert 0 < r["median_s"] < float("inf") and r["achieved_flops"] == pytest.approx(r["flops"] / r["median_s"])
    stream = stream_sweep(b, [64 << 20])
    copies = copy_sweep(b, [("h2d", "plain", False, 16 << 20), ("d2h", "plain", False, 16 << 20)])
    assert [r["direction"] for r in copies] == ["h2d", "d2h"]
    for r in stream + copies:
        assert r["bytes"] > 0 and 0 < r["median_s"] < float("inf")
        assert r["achieved_bytes"] == pytest.approx(r["bytes"] / r["median_s"])


def test_sim_profile_quick_writes_a_consistent_profile(tmp_path):
    from infersim.cli.main import main

    out = tmp_path / "fresh.yaml"
    assert main(["profile", "--quick", "--threads", "1", "--out", str(out), "-q"]) == 0
    hw = load_hardware(str(out))
    side = tmp_path / "fresh.calib.json"
    assert side.is_file() and hw.sources[HASH_KEY] == sha256_file(side)
    assert hw.name == "fresh" and out.read_text().startswith("# Hardware profile measured by `sim profile`")
    for rate in (hw.peak_tflops["fp32"], hw.memory_bandwidth_gbps, hw.host_link.h2d_gbps, hw.host_link.d2h_gbps):
        assert 0 < rate < float("inf")
    cal = calibration_for(hw)
    for comp in cal["step_model"]["comparison"].values():
        assert len(comp["table"]) == 8 and all(len(r) == 5 for r in comp["table"].values())
    # the GEMM micro-benchmarks went through sim calibrate's kernel fit
    gemm_rows = [r for r in cal["curves"] if r["kind"] == "gemm" and r["dtype"] == cal["dtype"]]
    assert hw.calibration.status == "measured" and hw.calibration.gemm.rows == len(gemm_rows)
    # and its measured GEMM table, as sim calibrate writes one, in the profile's dtype
    shapes = hw.calibration.gemm.measured_shapes
    assert (tmp_path / "fresh.gemm-shapes.csv.gz").is_file() and shapes.dtype == "fp32"
    assert (
        yaml.safe_load(out.read_text())["calibration"]["gemm"]["measured_shapes"]["file"] == "fresh.gemm-shapes.csv.gz"
    )
    assert shapes.rows == len({(r["m"], r["k"], r["n"]) for r in gemm_rows})
    spec = load_model("llama-68m")
    assert 0 < RegressionCostModel(spec, hw, dtype="fp32").prefill_time_s(256) < float("inf")


def test_the_report_names_every_file_the_profile_needs_beside_it(tmp_path):
    """A profile copied elsewhere loads only with its sidecar and its measured GEMM table: the
    last line of `sim profile` names all three."""
    from infersim.executor.profiler.run import written_files

    out = tmp_path / "p.yaml"
    result = {"profile": out, "sidecar": tmp_path / "p.calib.json", "hardware": {"calibration": None}}
    assert written_files(result) == [out, tmp_path / "p.calib.json"]
    result["hardware"] = {"calibration": {"gemm": {"measured_shapes": {"file": "p.gemm-shapes.csv.gz"}}}}
    assert written_files(result) == [out, tmp_path / "p.calib.json", tmp_path / "p.gemm-shapes.csv.gz"]


# ---- the CUDA path on a machine without CUDA ---------------------------------------------------------------
def test_device_flag_selects_cuda_and_fails_in_one_line_without_it(capsys):
    import torch

    from infersim.cli.main import main
    from infersim.executor.profiler.device import CpuTimer, CudaEventTimer, select_device, timer_class_for

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
    from infersim.executor.profiler.device import copy_variants, host_buffer
    from infersim.executor.profiler.kernels import copy_plan

    assert copy_variants("cuda") == [("pinned", True), ("pageable", False)]
    assert copy_variants("cpu") == [("plain", False)]
    plan = copy_plan("cuda", quick=True)
    assert {(d, v, p) for d, v, p, _ in plan} == {
        ("h2d", "pinned", True),
        ("h2d", "pageable", False),
        ("d2h", "pinned", True),
        ("d2h", "pageable", False),
    }
    assert all(not p for _, _, p, _ in copy_plan("cpu", quick=True))
    with pytest.raises(InfersimError, match="pinned host memory needs a CUDA device"):
        host_buffer(1024, pinned=True, device_type="cpu")
    assert host_buffer(1024, pinned=False, device_type="cpu").numel() == 1024


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_swap_check_copy_sentinel_times_copies_the_sweep_measured(device_type):
    """The swap check's drift sentinel and its reference are the same host<->device copies (on
    CUDA a pinned host buffer and the GPU, both directions), copies the copy sweep measures in
    quick and full profiles alike: a device-to-device sentinel against a host-link reference
    read a 20-30x 'drift' on an H100 and an H200."""
    from infersim.executor.profiler.kernels import copy_plan, copy_reference_plan

    ref = copy_reference_plan(device_type)
    assert {d for d, *_ in ref} == {"h2d", "d2h"} and {n for *_, n in ref} == {64 << 20}
    assert all(p for _, _, p, _ in ref) == (device_type == "cuda")
    for quick in (True, False):
        assert set(ref) <= set(copy_plan(device_type, quick=quick))
    from infersim.executor.profiler.run import _copy_reference

    records = [
        {"kind": "copy", "direction": d, "variant": label, "size_bytes": n, "median_s": t}
        for (d, label, _, n), t in zip(copy_plan(device_type, quick=True), range(1, 100))
    ]
    wanted = {(d, label, n) for d, label, _, n in ref}
    picked = [r["median_s"] for r in records if (r["direction"], r["variant"], r["size_bytes"]) in wanted]
    assert len(picked) == 2 and _copy_reference(records, device_type) == sum(picked) / 2


def test_cuda_event_timer_records_and_synchronizes():
    """The event timer's protocol, on a stand-in for torch.cuda: synchronize, record start, run,
    record end, wait for the end event, read the elapsed milliseconds."""
    from infersim.executor.profiler.device import CudaEventTimer

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


# ---- per-model predictors (sim profile --model) ------------------------------------------------------------
def _synthetic_prefills(coef, n=60, seed=3):
    """Prefill batches of 1-4 prompts and their exact affine + quadratic times."""
    from infersim.simulator.costmodel.regression import model_features

    rng = np.random.default_rng(seed)
    qs = [tuple(int(x) for x in rng.integers(8, 1500, size=int(rng.integers(1, 5)))) for _ in range(n)]
    X = np.array([model_features(q) for q in qs])
    c0, c = coef
    return qs, X, c0 + X @ np.asarray(c)


def test_physical_recompute_predictor_recovers_an_exact_affine_quadratic():
    from infersim.executor.profiler.regress import PHYSICAL, Candidates, compare_sets, fit_physical
    from infersim.simulator.costmodel.regression import MODEL_FEATURES

    coef = (4e-4, np.array([3e-5, 2e-4, 1.5e-8]))  # per iteration, per token, per sequence, per token^2
    _, X, y = _synthetic_prefills(coef)
    c0, c = fit_physical(X, y)
    assert c0 == pytest.approx(coef[0], rel=1e-6)
    assert np.allclose(c, coef[1], rtol=1e-6)
    _, Xh, yh = _synthetic_prefills(coef, n=12, seed=9)  # other batches: held out
    comp = compare_sets(
        X,
        y,
        Xh,
        yh,
        target="prefill",
        features=MODEL_FEATURES,
        candidates=Candidates(degrees=(1, 2), regressors=("linear", "random_forest")),
    )
    # exact data: the physical model has zero validation error, so it is kept, and predicts the held-out set
    assert comp["chosen"]["estimator"] == PHYSICAL and comp["chosen"]["held_out_mape"] < 1e-6
    port = PortableRegressor(comp["portable"])
    assert np.allclose(port.predict(Xh), yh, rtol=1e-9)
    assert set(comp["table"]) == {PHYSICAL, "linear", "random_forest"} and comp["n_held_out"] == 12


def _per_model_calibration(
    spec, *, dtype="fp32", name="zoo-target", coef=(4e-4, (3e-5, 2e-4, 1.5e-8)), swap=None, key=None
):
    """The reference sidecar plus one per-model entry with a physical predictor."""
    from infersim.executor.profiler.regress import FitRecord, physical_portable
    from infersim.simulator.costmodel.regression import (
        MODEL_FEATURES,
        MODEL_PREDICTORS_FORMAT,
        MODEL_PREDICTORS_VERSION,
        model_config_hash,
        model_key,
    )

    h = model_config_hash(spec)
    entry = {
        "name": name,
        "config_hash": h,
        "dtype": dtype,
        "recompute": {
            "predictor": physical_portable(coef[0], np.array(coef[1]), FitRecord("prefill", 0.0, 1, 1, MODEL_FEATURES)),
            "domain": {"tokens": [8, 2048], "batch": [1, 4], "max_batched_tokens": 4096},
        },
    }
    if swap:
        entry["swap"] = {"fit": swap}
    cal = calibration_for(load_hardware(REF))
    cal["per_model"] = {
        "format": MODEL_PREDICTORS_FORMAT,
        "version": MODEL_PREDICTORS_VERSION,
        "models": {key or model_key(name, h): entry},
    }
    return cal, entry


def test_per_model_predictor_is_used_for_its_model_only():
    from types import SimpleNamespace

    from infersim.simulator.costmodel.regression import model_config_hash
    from infersim.simulator.policies.preemption import CostAwarePreemption

    hw = load_hardware(REF)
    spec = load_model("llama-68m")
    swap = {
        "d2h": {"latency_us": 5.0, "per_copy_us": 2.0, "gbps": 4.0},
        "h2d": {"latency_us": 3.0, "per_copy_us": 1.0, "gbps": 5.0},
    }
    cal, _ = _per_model_calibration(spec, name="llama-68m", swap=swap)
    cm = RegressionCostModel(spec, hw, dtype="fp32", calibration=cal)
    assert cm.model_predictor_key == f"llama-68m@{model_config_hash(spec)[:16]}"
    # recompute of one sequence of t tokens: c0 + c_tok t + c_seq + c_sq t^2, by hand
    for t in (8, 300, 2048):
        assert cm.prefill_time_s(t) == pytest.approx(4e-4 + 3e-5 * t + 2e-4 + 1.5e-8 * t * t, rel=1e-12)
    q = [100, 30, 7 + 1, 400]
    want = 4e-4 + 3e-5 * sum(q) + 2e-4 * 4 + 1.5e-8 * sum(x * x for x in q)
    assert cm.iteration_time_s(BatchShape.prefill(q)) == pytest.approx(want, rel=1e-12)
    # the cost-aware preemption reads it through the one cost-model interface
    seq = SimpleNamespace(num_tokens=300)
    assert CostAwarePreemption().recompute_cost_s(seq, SimpleNamespace(cost_model=cm)) == cm.prefill_time_s(300)
    # swaps: the executor fit (latency + two slice copies + bytes / bandwidth)
    assert cm.kv_transfer_time_s(4e6, "d2h") == pytest.approx(9e-6 + 4e6 / 4e9, rel=1e-12)
    assert cm.transfer_time_s(5e6, "h2d") == pytest.approx(5e-6 + 5e6 / 5e9, rel=1e-12)
    # decode and chunked prefills stay on the generic model
    generic = RegressionCostModel(spec, hw, dtype="fp32")
    assert generic.model_predictor_key is None
    dec = BatchShape.decode([100, 200])
    assert cm.iteration_time_s(dec) == generic.iteration_time_s(dec)
    chunk = BatchShape.of([64], [128])
    assert cm.iteration_time_s(chunk) == generic.iteration_time_s(chunk)
    # another model, or the same model in another dtype or split over devices: the generic predictor
    other = load_model("llama-160m")
    assert RegressionCostModel(other, hw, dtype="fp32", calibration=cal).model_predictor_key is None
    assert RegressionCostModel(other, hw, dtype="fp32", calibration=cal).prefill_time_s(300) == RegressionCostModel(
        other, hw, dtype="fp32"
    ).prefill_time_s(300)
    assert RegressionCostModel(spec, hw, dtype="fp16", calibration=cal).model_predictor_key is None
    # a renamed copy of the same shape matches (the hash is of the shape, not the name)
    renamed = spec.model_copy(update={"name": "my-llama"})
    assert RegressionCostModel(renamed, hw, dtype="fp32", calibration=cal).model_predictor_key is not None
    # outside the measured domain: the nearest setting inside, carried by the roofline (monotone, positive)
    assert cm.prefill_time_s(8192) > cm.prefill_time_s(2048) > cm.prefill_time_s(2047)


def test_per_model_entries_are_checked():
    hw = load_hardware(REF)
    spec = load_model("llama-68m")
    cal, _ = _per_model_calibration(spec, name="llama-68m", key="llama-68m@0000000000000000")
    with pytest.raises(InfersimError, match="does not carry its config hash"):
        RegressionCostModel(spec, hw, dtype="fp32", calibration=cal)
    cal, _ = _per_model_calibration(spec, name="llama-68m")
    cal["per_model"]["version"] = 99
    with pytest.raises(InfersimError, match="per_model section format"):
        RegressionCostModel(spec, hw, dtype="fp32", calibration=cal)


def test_per_model_sidecar_round_trips_and_its_hash_is_checked(tmp_path):
    from infersim.executor.profiler.run import profile_files, write_profile

    spec = load_model("llama-68m")
    cal, _ = _per_model_calibration(spec, name="llama-68m")
    y, _ = _ref_paths()
    hw_dict = yaml.safe_load(y.read_text())
    for k in (SOURCE_KEY, HASH_KEY, PATH_KEY):
        hw_dict["sources"].pop(k, None)
    hw_dict["name"] = "pm"
    out = tmp_path / "pm.yaml"
    with profile_files(out) as staged:
        write_profile(staged, hw_dict, cal)
    hw = load_hardware(str(out))
    back = calibration_for(hw)
    assert back["per_model"] == json.loads(json.dumps(cal["per_model"]))
    cm = RegressionCostModel(spec, hw, dtype="fp32")
    assert cm.model_predictor_key is not None
    assert cm.prefill_time_s(100) == pytest.approx(4e-4 + 3e-3 + 2e-4 + 1.5e-4, rel=1e-12)
    # an edited entry (another model's hash swapped in) changes the file: refused before it is read
    side = tmp_path / "pm.calib.json"
    data = json.loads(side.read_text())
    entry = next(iter(data["per_model"]["models"].values()))
    entry["config_hash"] = "f" * 64
    side.write_text(json.dumps(data))
    with pytest.raises(InfersimError, match="sha256"):
        RegressionCostModel(spec, load_hardware(str(out)), dtype="fp32")


@pytest.mark.torch
def test_sim_profile_model_measures_zoo_target_into_a_profile(tmp_path, zoo_dir):
    """`sim profile --refit P --models-only --model zoo-target --quick`: the real executor's
    prefills and swaps of the zoo's trained model, fitted and held out, into the sidecar."""
    from infersim.cli.main import main
    from infersim.simulator.costmodel.regression import model_config_hash

    ypath, _ = _copy_ref(tmp_path)
    out = tmp_path / "with-model.yaml"
    assert (
        main(
            [
                "profile",
                "--refit",
                str(ypath),
                "--models-only",
                "--model",
                "zoo-target",
                "--quick",
                "--threads",
                "1",
                "--out",
                str(out),
                "-q",
            ]
        )
        == 0
    )
    hw = load_hardware(str(out))
    cal = calibration_for(hw)
    spec = load_model("zoo-target")
    h = model_config_hash(spec)
    ((key, entry),) = cal["per_model"]["models"].items()
    assert key == f"zoo-target@{h[:16]}" and entry["config_hash"] == h and entry["dtype"] == "fp32"
    rows = entry["recompute"]["rows"]
    fitted1 = {r["prompts"][0] for r in rows if r["role"] == "fit" and r["batch"] == 1}
    held1 = {r["prompts"][0] for r in rows if r["role"] == "held" and r["batch"] == 1}
    assert held1 and not held1 & fitted1  # held-out lengths are never fitted,
    assert not held1 & {t for r in rows if r["role"] == "fit" for t in r["prompts"]}  # not even inside a batch
    assert all(r["measured_s"] > 0 and np.isfinite(r["err_cost_model_pct"]) for r in rows)
    assert entry["recompute"]["mape_recompute"] == pytest.approx(
        np.mean([r["err_cost_model_pct"] for r in rows if r["role"] == "held" and r["batch"] == 1])
    )
    # the executor's swap check: both layouts, copies counted, out/in/total per formula
    sw = entry["swap"]
    lay = {(r["tokens"], r["layout"]): r for r in sw["rows"]}
    assert lay[(64, "contiguous")]["copies"] == 2 and lay[(64, "fragmented")]["copies"] == 2 * 4
    assert set(sw["held_out_mape"]) == {"model_fit", "link", "bandwidth_only"}
    # the profile's other contents are kept; the cost model picks the entry for zoo-target in fp32
    assert cal["step_model"] == calibration_for(load_hardware(REF))["step_model"]
    cm = RegressionCostModel(spec, hw, dtype="fp32")
    assert cm.model_predictor_key == key
    assert cm.prefill_time_s(45) == pytest.approx(
        PortableRegressor(entry["recompute"]["predictor"]).predict([[45, 1, 45 * 45]])[0], rel=1e-12
    )
    assert RegressionCostModel(load_model("llama-68m"), hw, dtype="fp32").model_predictor_key is None
    # the report's section and plot of the entry
    from infersim.executor.profiler.report import per_model_md, plot_per_model

    assert "held-out MAPE" in per_model_md(key, entry)
    plot_per_model(key, entry, tmp_path / "pm.png")
    assert (tmp_path / "pm.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_models_only_without_refit_is_a_one_line_error(capsys):
    from infersim.cli.main import main

    assert main(["profile", "--models-only", "--model", "zoo-target", "--out", "/tmp/x.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--models-only" in err[0]


def test_a_cuda_profile_records_the_card_s_compute_capability(monkeypatch):
    """`sim profile` on a CUDA card writes its compute capability (major.minor of the device's
    properties), which picks the quantised-weight kernels vLLM runs there; a CPU profile has none."""
    import types

    import torch

    from infersim.executor.profiler.device import device_info

    props = types.SimpleNamespace(
        name="Tesla T4", total_memory=15_835_660_288, multi_processor_count=40, major=7, minor=5
    )
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    assert device_info(torch.device("cuda"))["compute_capability"] == 7.5
    assert "compute_capability" not in device_info(torch.device("cpu"))
