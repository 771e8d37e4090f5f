"""Measured GEMM shapes: the correction gives a measured shape its measured time, fades with
the distance in K, leaves unmeasured widths and fp8 GEMMs to the fitted model; shipped
profiles carry their tables to derived cards of the same SM count only."""

from pathlib import Path

import numpy as np
import pytest

from infersim.simulator.calibration.fit import measured_gemms, predict_rows
from infersim.simulator.calibration.kernel_models import errors_pct
from infersim.simulator.calibration.tables import recognise
from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.costmodel.kernel_times import GemmParams, gemm_device, gemm_params, gemm_time_s
from infersim.simulator.costmodel.measured_gemms import MeasuredGemms, ShapeCorrection, shape_correction
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.models.catalog import load_model

HW = load_hardware("a100-80gb-sxm:datasheet")
DEVICE = gemm_device(HW)
PARAMS = GemmParams(0.7, 0.85, 4.0, 2.5, 64, 0.3, 1.0, 0.5)
KERNEL_TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "gpu-kernels" / "linear_ops.csv.gz"
GRID = np.array([1.0, 8.0, 64.0, 128.0, 256.0])


def _model_s(n, k, tokens):
    return gemm_time_s(PARAMS, 2.0 * n * k, 2.0 * n * k, 2.0 * (n + k), np.asarray(tokens, float), n, DEVICE)


def _table(shapes):
    """Measured = model x a factor per (n, k): 1.2 for the first shape, 0.9 for the second..."""
    n, k, t, s = [], [], [], []
    for (ni, ki), factor in shapes.items():
        n += [ni] * len(GRID)
        k += [ki] * len(GRID)
        t += list(GRID)
        s += list(_model_s(ni, ki, GRID) * factor)
    return MeasuredGemms.from_arrays(np.array(n), np.array(k), np.array(t), np.array(s))


def test_a_measured_shape_takes_its_measured_time():
    corr = ShapeCorrection(_table({(8192, 8192): 1.2, (4096, 4096): 0.9}), PARAMS, DEVICE, 0.25)
    assert corr.factor(8192, 8192, GRID) == pytest.approx(np.full(5, 1.2), rel=1e-12)
    assert corr.factor(4096, 4096, GRID) == pytest.approx(np.full(5, 0.9), rel=1e-12)
    # between grid points: the next measured token count (the same tile)
    assert corr.factor(8192, 8192, [100.0, 129.0])[1] == pytest.approx(1.2, rel=1e-12)


def test_unmeasured_width_and_beyond_the_grid_keep_the_model():
    corr = ShapeCorrection(_table({(8192, 8192): 1.2}), PARAMS, DEVICE, 0.25)
    assert np.array_equal(corr.factor(5120, 8192, GRID), np.ones(5))
    assert corr.factor(8192, 8192, [257.0, 4096.0]).tolist() == [1.0, 1.0]


def test_the_correction_fades_with_the_distance_in_k():
    """K a quarter octave away: the log ratio times exp(-1/2); an octave away: nothing."""
    corr = ShapeCorrection(_table({(8192, 8192): 1.2}), PARAMS, DEVICE, 0.25)
    k = 9742  # 8,192 x 2^0.25, whole (shapes are whole numbers)
    w1 = np.exp(-0.5 * (np.log2(k / 8192) / 0.25) ** 2)
    assert w1 == pytest.approx(np.exp(-0.5), rel=1e-4)
    assert corr.factor(8192, k, [64.0])[0] == pytest.approx(np.exp(np.log(1.2) * w1), rel=1e-12)
    assert corr.factor(8192, 16384, [64.0])[0] == 1.0
    # two measured K's around the asked one: their weighted mean, scaled by the nearer's weight
    two = ShapeCorrection(_table({(8192, 8192): 1.2, (8192, 16384): 0.8}), PARAMS, DEVICE, 0.25)
    w2 = np.exp(-0.5 * (np.log2(16384 / k) / 0.25) ** 2)
    expect = np.exp((w1 * np.log(1.2) + w2 * np.log(0.8)) / (w1 + w2) * w1)
    assert two.factor(8192, k, [64.0])[0] == pytest.approx(expect, rel=1e-12)


def test_duplicate_measurements_give_their_median(tmp_path):
    m = MeasuredGemms.from_arrays([10, 10, 10, 20], [5, 5, 5, 5], [1, 1, 1, 1], [1e-6, 3e-6, 2e-6, 4e-6])
    assert len(m) == 2 and m.time_s.tolist() == [2e-6, 4e-6]
    path = tmp_path / "t.gemm-shapes.csv.gz"
    m.write(path, "test")
    back = MeasuredGemms.read(path)
    assert back.n.tolist() == [10, 20] and back.time_s == pytest.approx(m.time_s, rel=1e-9)
    m.write(tmp_path / "again.csv.gz", "test")
    assert (tmp_path / "again.csv.gz").read_bytes() == path.read_bytes()  # no timestamp in the gzip


def test_cost_model_applies_the_shipped_correction_to_a_measured_width():
    """Llama-2-70B on the A100 at TP 4 has Meta-Llama-3-70B's shapes: its Q/K/V projection
    (N = 2,560, K = 8,192) is the fitted model times the table's ratio, which differs from 1."""
    hw = load_hardware("a100-80gb-sxm")
    corr = shape_correction(hw.calibration.gemm, gemm_device(hw), "fp16")
    cm = RooflineCostModel(load_model("llama-2-70b"), hw, tensor_parallel=4)
    op = next(o for o in cm.layer_ops if o.name == "qkv_proj")
    assert op.out_width == 2560
    f, b = cm._flop_coef[cm.ops.index(op)], cm._byte_coef[cm.ops.index(op)]
    for tokens in (1, 300, 512, 2048):
        model = gemm_time_s(gemm_params(hw.calibration.gemm), f[1], b[0], b[1], tokens, 2560, gemm_device(hw))
        factor = corr.factor(2560, 8192, [tokens])[0]
        assert factor != 1.0
        ops = {o.name: o for o in cm.breakdown(BatchShape.prefill([tokens]))}
        assert ops["qkv_proj"].time_s == pytest.approx(float(model) * factor, rel=1e-12)


GPU_TABLE_MODELS = ["qwen-72b", "codellama-34b", "internlm-20b", "phi-2"]  # measured on all three cards


@pytest.mark.parametrize(
    "profile, model",
    [("a100-80gb-sxm", m) for m in GPU_TABLE_MODELS + ["llama-3-8b", "llama-3-70b"]]
    + [(hw, m) for hw in ("a40", "h100-sxm") for m in GPU_TABLE_MODELS],
)
def test_catalog_models_the_tables_measured_have_measured_gemm_shapes(profile, model):
    """Each of the models microsoft/vidur's tables measured on a card, taken from the catalog by
    name, runs GEMMs (N, K) at TP 1 that the card's shipped table measured exactly: its layer
    GEMMs take measured times, not the fitted model's."""
    hw = load_hardware(profile)
    table = MeasuredGemms.read(hw.calibration.gemm.measured_shapes.file)
    measured = set(zip(table.n.tolist(), table.k.tolist()))
    gemms = [o for o in RooflineCostModel(load_model(model), hw).layer_ops if o.kernel == "gemm"]
    assert len(gemms) == 4  # QKV, O, up (gate and up fused, or fc1), down
    assert {(o.out_width, o.flops[1] / (2.0 * o.out_width)) for o in gemms} <= measured


def test_a_shape_measured_once_with_no_neighbour_is_priced_at_its_median():
    """In the shipped A100 table, a width measured at a single K with no other K within an
    octave: the corrected model returns the measured medians."""
    hw = load_hardware("a100-80gb-sxm")
    table = MeasuredGemms.read(hw.calibration.gemm.measured_shapes.file)
    corr = shape_correction(hw.calibration.gemm, gemm_device(hw), "fp16")
    for n in np.unique(table.n):
        ks = np.unique(table.k[table.n == n])
        if len(ks) == 1:
            sel = table.n == n
            model = _fitted(hw, n, ks[0], table.tokens[sel])
            got = model * corr.factor(n, ks[0], table.tokens[sel])
            assert got == pytest.approx(table.time_s[sel], rel=1e-9)
            return
    pytest.fail("no width measured at a single K")


def _fitted(hw, n, k, tokens):
    return gemm_time_s(
        gemm_params(hw.calibration.gemm), 2.0 * n * k, 2.0 * n * k, 2.0 * (n + k), tokens, n, gemm_device(hw)
    )


def test_fp8_gemms_keep_the_fitted_model():
    hw = load_hardware("h100-sxm")
    cm = RooflineCostModel(load_model("llama-2-70b"), hw, tensor_parallel=4, dtype="fp8")
    op = next(o for o in cm.layer_ops if o.name == "qkv_proj")
    j = cm.ops.index(op)
    f, b = cm._flop_coef[j], cm._byte_coef[j]
    model = gemm_time_s(gemm_params(hw.calibration.gemm), f[1], b[0], b[1], 512.0, op.out_width, gemm_device(hw, "fp8"))
    ops = {o.name: o for o in cm.breakdown(BatchShape.prefill([512]))}
    assert ops["qkv_proj"].time_s == pytest.approx(float(model), rel=1e-12)


def test_derived_cards_inherit_the_table_only_with_the_same_sm_count():
    assert load_hardware("h200").calibration.gemm.measured_shapes is not None  # 132 SMs, as the H100 SXM
    assert load_hardware("a100-40gb").calibration.gemm.measured_shapes is not None  # 108, as the A100 SXM
    assert load_hardware("h100-pcie").calibration.gemm.measured_shapes is None  # 114 SMs
    assert load_hardware("l40").calibration.gemm.measured_shapes is None  # 142 SMs, from the A40's 84
    assert shape_correction(load_hardware("h100-pcie").calibration.gemm, gemm_device(HW), "fp16") is None


@pytest.mark.parametrize("name, device", [("a100-80gb-sxm", "a100"), ("a40", "a40"), ("h100-sxm", "h100")])
def test_shipped_profiles_reproduce_their_recorded_corrected_error(name, device):
    """The shipped table's GEMM rows priced by the stored fit and the stored measured shapes
    give the error the profile records, and the table holds those rows' medians."""
    hw = load_hardware(name)
    rows = [r for r in recognise(KERNEL_TABLE).read(KERNEL_TABLE, device) if r.kernel == "gemm"]
    table = MeasuredGemms.read(hw.calibration.gemm.measured_shapes.file)
    again = measured_gemms(rows)
    assert np.array_equal(table.n, again.n) and table.time_s == pytest.approx(again.time_s, rel=1e-6)
    correction = shape_correction(hw.calibration.gemm, gemm_device(hw), "fp16")
    mape, bias = errors_pct(predict_rows(hw.calibration, rows, hw, correction=correction), [r.time_s for r in rows])
    shapes = hw.calibration.gemm.measured_shapes
    assert (round(mape, 3), round(bias, 3)) == pytest.approx((shapes.mape_pct, shapes.bias_pct), abs=2e-3)
    assert shapes.mape_pct < hw.calibration.gemm.mape_pct / 2


def test_a_malformed_table_is_refused_naming_row_and_column(tmp_path):
    from infersim.simulator.errors import InfersimError

    bad = tmp_path / "t.csv"
    bad.write_text("# source\nn,k,tokens,time_us\n10,5,1,2.0\n10,5,2,-1\n")
    with pytest.raises(InfersimError, match=r"t.csv: data row 2, column 'time_us'"):
        MeasuredGemms.read(bad)
    bad.write_text("n,k,time_us\n10,5,2.0\n")
    with pytest.raises(InfersimError, match="column 'tokens' missing"):
        MeasuredGemms.read(bad)


MEASURED_HERE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "gpu-kernels-measured"


def test_the_project_s_own_h100_table_reads_as_a_generic_table_and_the_shipped_profile_prices_it():
    """The projection GEMMs this project timed on an H100 (benchmarks/kernels_on_this_gpu.py):
    every row read through `sim calibrate`'s generic table, and the shipped h100-sxm profile's
    error on them the one RESULTS-kernels-on-real-gpus.md quotes (13.2% MAPE, bias +1.8%)."""
    table = MEASURED_HERE / "h100-sxm.csv.gz"
    rows = recognise(table).read(table, None)
    gemms = [r for r in rows if r.kernel == "gemm"]
    assert len(rows) == 2261 and len(gemms) == 2128 and len({r.label for r in rows}) == 7
    hw = load_hardware("h100-sxm")
    correction = shape_correction(hw.calibration.gemm, gemm_device(hw), "fp16")
    mape, bias = errors_pct(predict_rows(hw.calibration, gemms, hw, correction=correction), [r.time_s for r in gemms])
    assert (round(mape, 1), round(bias, 1)) == (13.2, 1.8)
