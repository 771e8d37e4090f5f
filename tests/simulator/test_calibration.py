"""Kernel-model fits recover known parameters from synthetic tables; the shipped calibrated
profiles price measured rows as they record; the cost model uses the fitted models exactly."""

from pathlib import Path

import numpy as np
import pytest

from infersim.simulator.calibration.fit import fit_kernels, predict_rows
from infersim.simulator.calibration.kernel_models import errors_pct
from infersim.simulator.calibration.rows import LayerDims, RowOrigin, gemm_operator, operator_for, row_from_operator
from infersim.simulator.calibration.tables import recognise
from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.costmodel.kernel_times import (
    GemmParams,
    StreamParams,
    elementwise_time_s,
    gemm_device,
    gemm_time_s,
    output_waves,
)
from infersim.simulator.costmodel.measured_gemms import shape_correction
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.models.catalog import load_model

DATA = Path(__file__).resolve().parents[1] / "data"
HW = load_hardware("a100-80gb-sxm:datasheet")
PEAK, BW = HW.peak_flops("fp16"), HW.memory_bandwidth_bytes_per_s()
# 24 and 40 tell a tile of 32 from a tile of 16 rounding at twice itself (tile_share 0)
TOKENS = [1, 2, 4, 8, 16, 24, 32, 40, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096]


def _synthetic_gemm_rows(params: GemmParams):
    rows = []
    for k, n in [(4096, 6144), (4096, 28672), (14336, 4096), (8192, 1280), (5120, 15360)]:
        op = gemm_operator(k, n)
        for t in TOKENS:
            f, b = op.flops[1], op.bytes
            time_s = float(gemm_time_s(params, f, b[0], b[1], t, op.out_width, gemm_device(HW)))
            rows.append(
                row_from_operator(
                    op, RowOrigin("x", f"k{k}-n{n}", "synthetic"), tp=1, tokens=t, op="gemm", time_s=time_s
                )
            )
    return rows


@pytest.mark.parametrize(
    "tile, waves, wave_us, share", [(32, 0.0, 0.0, 1.0), (128, 0.35, 1.5, 1.0), (64, 0.3, 1.0, 0.4)]
)
def test_gemm_fit_recovers_known_parameters(tile, waves, wave_us, share):
    truth = GemmParams(
        compute=0.62,
        memory=0.83,
        launch_us=4.0,
        corner_exponent=2.5,
        tile_tokens=tile,
        wave_exponent=waves,
        wave_latency_us=wave_us,
        tile_share=share,
    )
    calib = fit_kernels(_synthetic_gemm_rows(truth), HW, "synthetic")
    g = calib.gemm
    assert g.tile_tokens == tile
    assert g.compute == pytest.approx(truth.compute, rel=1e-3)
    assert g.memory == pytest.approx(truth.memory, rel=1e-3)
    assert g.launch_us == pytest.approx(truth.launch_us, rel=1e-2)
    assert g.corner_exponent == pytest.approx(truth.corner_exponent, rel=1e-2)
    assert g.wave_exponent == pytest.approx(truth.wave_exponent, abs=1e-3)
    assert g.wave_latency_us == pytest.approx(truth.wave_latency_us, abs=1e-2)
    assert g.tile_share == pytest.approx(truth.tile_share, abs=1e-3)
    assert g.mape_pct < 0.05 and g.rows == 5 * len(TOKENS)


def test_tile_share_rounds_m_partly_at_the_tile_and_partly_at_twice_the_tile():
    # compute-bound only (huge bandwidth, no launch): time is proportional to the rounded M.
    # 72 tokens, tile 64: 0.25 x 128 (one step of 64 past one tile) + 0.75 x 128 (2 x 64) = 128;
    # 136 tokens: 0.25 x 192 + 0.75 x 256 = 240
    p = GemmParams(compute=1.0, memory=1.0, launch_us=0.0, corner_exponent=20.0, tile_tokens=64, tile_share=0.25)
    dev = type(gemm_device(HW))(1e12, 1e30, None)
    t = gemm_time_s(p, 1e6, 0.0, 0.0, np.array([32, 72, 136]), 4096, dev)
    assert t == pytest.approx(np.array([32, 128, 240]) * 1e6 / 1e12, rel=1e-6)


def test_output_waves_count_128_by_128_tiles_over_the_sms():
    # 108 SMs: N 1280 -> 10 column tiles; 128 tokens -> 10 tiles in one wave of 108 slots;
    # 1408 tokens -> 11 x 10 = 110 tiles -> 2 waves (216 slots); no SM count -> fill 1, no waves
    fill, waves = output_waves([128, 1408], 1280, 108)
    assert fill == pytest.approx([10 / 108, 110 / 216]) and waves == pytest.approx([1, 2])
    fill, waves = output_waves([128], 1280, None)
    assert fill == pytest.approx([1.0]) and waves == pytest.approx([0.0])


def test_without_an_sm_count_the_fit_has_no_wave_term():
    hw = HW.model_copy(update={"sm_count": None})
    truth = GemmParams(compute=0.62, memory=0.83, launch_us=4.0, corner_exponent=2.5, tile_tokens=64)
    g = fit_kernels(_synthetic_gemm_rows(truth), hw, "synthetic").gemm
    assert g.wave_exponent == 0.0 and g.wave_latency_us == 0.0


@pytest.mark.parametrize("saturation", [1, 64])
def test_elementwise_fit_recovers_floor_bandwidth_and_saturation(saturation):
    dims = LayerDims(heads=32, kv_heads=8, hidden=4096, intermediate=14336)
    rows = []
    for t in TOKENS:
        op = operator_for("input_layernorm", dims, 1)
        nbytes = op.bytes[0] + op.bytes[1] * t
        time_s = 3e-6 + nbytes * max(1.0, saturation / t) / (BW * 0.45)
        rows.append(
            row_from_operator(op, RowOrigin("x", "m", "synthetic"), tp=1, tokens=t, op="input_layernorm", time_s=time_s)
        )
    e = fit_kernels(rows, HW, "synthetic").elementwise["norm"]
    assert e.saturation_tokens == saturation and e.cache_mb == 0 and e.cache_memory is None
    assert e.memory == pytest.approx(0.45, rel=1e-4)
    assert e.launch_us == pytest.approx(3.0, rel=1e-3)


def test_elementwise_fit_recovers_the_cached_working_set():
    """Norms of three widths streaming their first 16 MB at 1.2 of the memory bandwidth and the
    rest at 0.4: the fit finds the cache size on its grid and both rates; the model without a
    cache term is also in the search, so a table without the effect keeps cache_mb 0 (above)."""
    rows = []
    for hidden in (2048, 4096, 8192):
        op = operator_for("input_layernorm", LayerDims(heads=32, kv_heads=8, hidden=hidden, intermediate=4 * hidden), 1)
        for t in TOKENS + [8192, 16384]:
            nbytes = op.bytes[0] + op.bytes[1] * t
            cached, rest = min(nbytes, 16 * 2**20), max(nbytes - 16 * 2**20, 0)
            time_s = 3e-6 + max(1.0, 64 / t) * (cached / (BW * 1.2) + rest / (BW * 0.4))
            rows.append(
                row_from_operator(
                    op, RowOrigin("x", f"h{hidden}", "s"), tp=1, tokens=t, op="input_layernorm", time_s=time_s
                )
            )
    cal = fit_kernels(rows, HW, "synthetic")
    e = cal.elementwise["norm"]
    assert e.cache_mb == 16.0 and e.saturation_tokens == 64
    assert e.cache_memory == pytest.approx(1.2, rel=1e-4) and e.memory == pytest.approx(0.4, rel=1e-4)
    assert e.launch_us == pytest.approx(3.0, rel=1e-3)
    assert predict_rows(cal, rows, HW) == pytest.approx([r.time_s for r in rows], rel=1e-4)


def test_embedding_fit_recovers_the_small_index_gather_line():
    """Up to 16 tokens the embedding gather walks its rows one after another: 2 us + 0.7 us a
    token whatever the width; above, the streaming model."""
    rows = []
    for hidden in (2560, 4096, 8192):
        op = operator_for("emb", LayerDims(heads=32, kv_heads=32, hidden=hidden, intermediate=4 * hidden), 1)
        for t in TOKENS:
            nbytes = op.bytes[0] + op.bytes[1] * t
            time_s = (2.0 + 0.7 * t) * 1e-6 if t <= 16 else 1.5e-6 + nbytes * max(1.0, 32 / t) / (BW * 0.2)
            rows.append(
                row_from_operator(op, RowOrigin("x", f"h{hidden}", "s"), tp=1, tokens=t, op="emb", time_s=time_s)
            )
    cal = fit_kernels(rows, HW, "synthetic")
    e = cal.elementwise["emb"]
    assert e.gather_tokens == 16
    assert e.gather_us == pytest.approx(2.0, rel=1e-4) and e.gather_us_per_token == pytest.approx(0.7, rel=1e-4)
    assert e.saturation_tokens == 32 and e.memory == pytest.approx(0.2, rel=1e-4)
    assert e.launch_us == pytest.approx(1.5, rel=1e-3)
    assert predict_rows(cal, rows, HW) == pytest.approx([r.time_s for r in rows], rel=1e-4)


def test_a_plain_activation_is_priced_as_the_pointwise_add_kernel():
    """GELU runs the framework's pointwise kernel (the residual add's); SiLU-and-mul its own."""
    gelu = operator_for("mlp_act", LayerDims(heads=32, kv_heads=32, hidden=2560, intermediate=10240, gated=False), 2)
    silu = operator_for("mlp_act", LayerDims(heads=32, kv_heads=8, hidden=4096, intermediate=14336), 2)
    assert gelu.kernel == "add" and silu.kernel == "act"
    assert gelu.bytes[1] == 2 * 5120 * 2 and silu.bytes[1] == 3 * 7168 * 2  # reads one (two) tensors, writes one


def test_a_block_without_post_attention_norm_times_two_residual_adds(tmp_path):
    """phi-2's block runs attention and MLP side by side: its timed add is attn + mlp + residual,
    two add kernels; a sequential block's timed add is one."""
    header = (DATA / "linear_ops_a100_llama3_8b.csv").read_text().splitlines()[0]
    cols = header.split(",")
    cells = dict.fromkeys(cols, "0.01")
    cells.update(device="a100", n_head="32", n_kv_head="32", n_embd="2560", n_expanded_embd="10240", tp="1")
    lines = [header]
    for model, norm in (("sequential", "0.01"), ("parallel", "")):
        cells.update(model=model, num_tokens="8", post_attention_layernorm_median_ms=norm)
        lines.append(",".join(cells[c] for c in cols))
    path = tmp_path / "linear_ops.csv"
    path.write_text("\n".join(lines) + "\n")
    adds = {r.label: r for r in recognise(path).read(path, "a100") if r.op == "add"}
    assert adds["sequential"].kernels == 1 and adds["parallel"].kernels == 2
    assert adds["parallel"].bytes == adds["sequential"].bytes  # each kernel moves one add's bytes


def test_the_cost_model_prices_phi2s_block_as_the_table_reader_reads_it():
    """phi-2 from the catalog: one norm and two residual adds of the reader's add bytes, as its
    parallel-block rows (two add kernels, no post-attention norm); rotary over 0.4 of the
    reader's full-head bytes, which vidur's profiler rotated whole."""
    dims = LayerDims(heads=32, kv_heads=32, hidden=2560, intermediate=10240, gated=False)
    layer = RooflineCostModel(load_model("microsoft/phi-2"), load_hardware("a100-80gb-sxm")).layer_ops
    by_kind = lambda kind: [o for o in layer if o.kernel == kind]
    assert len(by_kind("norm")) == 1 and by_kind("norm")[0].bytes == operator_for("input_layernorm", dims, 1).bytes
    adds = [o for o in by_kind("add") if o.name.endswith("residual_add")]
    assert len(adds) == 2 and {o.bytes for o in adds} == {operator_for("add", dims, 1).bytes}
    (rotary,) = by_kind("rope")
    assert rotary.bytes[1] == pytest.approx(0.4 * operator_for("attn_rope", dims, 1).bytes[1], rel=1e-12)


def test_elementwise_fit_prices_each_launch_of_a_two_kernel_row():
    # 2 us launch, 60% of bandwidth: a row spanning two kernels takes twice one kernel's time
    dims = LayerDims(heads=32, kv_heads=32, hidden=2560, intermediate=10240)
    op = operator_for("add", dims, 1)
    rows = []
    for t in TOKENS:
        for kernels in (1, 2):
            nbytes = op.bytes[0] + op.bytes[1] * t
            time_s = kernels * (2e-6 + nbytes / (BW * 0.6))
            rows.append(
                row_from_operator(
                    op, RowOrigin("x", f"k{kernels}", "s"), tp=1, tokens=t, op="add", time_s=time_s, kernels=kernels
                )
            )
    cal = fit_kernels(rows, HW, "synthetic")
    e = cal.elementwise["add"]
    assert e.memory == pytest.approx(0.6, rel=1e-4) and e.launch_us == pytest.approx(2.0, rel=1e-3)
    assert predict_rows(cal, rows, HW) == pytest.approx([r.time_s for r in rows], rel=1e-4)


def test_elementwise_below_saturation_costs_as_much_as_saturation_tokens():
    # 8 us launch, 1 GB/s: 4 tokens of 1000 bytes under S = 16 take 8 us + 16 000 bytes / 1e9 B/s
    t = elementwise_time_s(StreamParams(0.5, 8.0, 16), np.array([4000.0, 32000.0]), np.array([4, 32]), 2e9)
    assert t == pytest.approx([8e-6 + 16e-6, 8e-6 + 32e-6])


def test_fused_qkv_row_prices_one_gemm_of_the_concatenated_width():
    dims = LayerDims(heads=32, kv_heads=8, hidden=4096, intermediate=14336)
    op = operator_for("attn_pre_proj", dims, 4)
    # (32 + 2 x 8) heads x 128 / 4 = 1536 outputs per GPU
    assert op.flops[1] == 2 * 4096 * 1536
    assert op.bytes[0] == 4096 * 1536 * 2


@pytest.fixture(scope="module")
def sample_rows():
    path = DATA / "linear_ops_a100_llama3_8b.csv"
    return recognise(path).read(path, "a100")


def test_shipped_profile_prices_measured_rows_near_its_recorded_error(sample_rows):
    hw = load_hardware("a100-80gb-sxm")
    cal = hw.calibration
    assert cal.status == "measured" and "microsoft/vidur" in cal.gemm.source
    gemm = [r for r in sample_rows if r.kernel == "gemm"]
    mape, _ = errors_pct(predict_rows(cal, gemm, hw), [r.time_s for r in gemm])
    # 28 of the 28164 rows the fit recorded its error on: the same model, a similar error
    assert abs(mape - cal.gemm.mape_pct) < 5.0


def test_shipped_profiles_reproduce_their_recorded_errors_when_refitted_on_their_rows(sample_rows):
    """A fit records the error of the rounded values it stores: scoring the stored values on
    the same rows gives the recorded numbers back."""
    from infersim.simulator.calibration.fit import record_errors

    cal = fit_kernels(sample_rows, HW, "sample")
    again = record_errors(cal, sample_rows, HW)
    assert again.gemm.mape_pct == cal.gemm.mape_pct
    assert {k: e.mape_pct for k, e in again.elementwise.items()} == {k: e.mape_pct for k, e in cal.elementwise.items()}


def test_cost_model_gemm_time_is_the_fitted_model(sample_rows):
    hw = load_hardware("a100-80gb-sxm")
    cm = RooflineCostModel(load_model("mistral-7b"), hw)  # the shape of Llama-3-8B: 4096, 32/8 heads, 14336
    ops = {o.name: o for o in cm.breakdown(BatchShape.prefill([512]))}
    row = next(r for r in sample_rows if r.op == "attn_pre_proj" and r.tp == 1 and r.tokens == 512)
    shapes = shape_correction(hw.calibration.gemm, gemm_device(hw), "fp16")
    predicted = predict_rows(hw.calibration, [row], hw, correction=shapes)[0]
    assert ops["qkv_proj"].time_s == pytest.approx(float(predicted), rel=1e-12)


def test_cost_model_prices_a_small_embedding_batch_on_the_gather_line():
    hw = load_hardware("a100-80gb-sxm")
    e = hw.calibration.elementwise["emb"]
    cm = RooflineCostModel(load_model("mistral-7b"), hw)
    for tokens in (8, 64):
        ops = {o.name: o for o in cm.breakdown(BatchShape.prefill([tokens]))}
        line_s = (e.gather_us + e.gather_us_per_token * tokens) * 1e-6
        assert (ops["embedding"].time_s == pytest.approx(line_s, rel=1e-12)) == (tokens <= e.gather_tokens)


@pytest.mark.parametrize("hardware", ["a100-80gb-sxm", "h200", "a40:datasheet"])
def test_decode_steps_equal_stepping_on_calibrated_profiles(hardware):
    cm = RooflineCostModel(load_model("llama-7b"), load_hardware(hardware), tensor_parallel=1)
    ctx = np.array([5, 100, 2047])
    vec = cm.decode_step_times_s(ctx, 70)
    step = np.array([cm.iteration_time_s(BatchShape.decode(ctx + j)) for j in range(70)])
    assert np.array_equal(vec, step)


def test_datasheet_suffix_drops_the_calibration_and_derived_cards_inherit():
    assert load_hardware("h100-sxm:datasheet").calibration is None
    h200 = load_hardware("h200")
    assert h200.mode == "derived" and h200.calibration.inherits == "h100-sxm"
    assert h200.calibration.gemm == load_hardware("h100-sxm").calibration.gemm
    fast = RooflineCostModel(load_model("llama-7b"), load_hardware("h100-sxm:datasheet"))
    real = RooflineCostModel(load_model("llama-7b"), load_hardware("h100-sxm"))
    batch = BatchShape.decode([512] * 8)
    assert real.iteration_time_s(batch) > fast.iteration_time_s(batch)


def test_derived_cards_scale_the_cached_working_set_by_their_own_l2():
    """The V100 (6 MB L2) inherits the A100's (40 MB) fits with 6/40 of each cached working set;
    the H200 (the H100's 50 MB) keeps the H100's; the L40 (no datasheet L2 in its profile) keeps
    the A40's as measured."""
    a100, v100 = load_hardware("a100-80gb-sxm"), load_hardware("v100")
    for kind, e in a100.calibration.elementwise.items():
        inherited = v100.calibration.elementwise[kind]
        assert inherited.cache_mb == pytest.approx(e.cache_mb * 6 / 40)
        assert inherited.model_copy(update={"cache_mb": e.cache_mb}) == e
    assert load_hardware("h200").calibration.elementwise == load_hardware("h100-sxm").calibration.elementwise
    assert load_hardware("l40").calibration.elementwise == load_hardware("a40").calibration.elementwise
    assert any(e.cache_mb > 0 for e in a100.calibration.elementwise.values())


def test_cached_bytes_stream_at_the_cached_rate_and_the_rest_at_the_memory_rate():
    # 1 GB/s peak, 2 us launch; 1 MB cached at 2x peak, the rest at 0.5x: 3 MB over 16 tokens
    # (S = 8, so no idle SMs) take 2 us + 1 MB / 2 GB/s + 2 MB / 0.5 GB/s
    params = StreamParams(memory=0.5, launch_us=2.0, saturation_tokens=8, cache_bytes=2**20, cache_memory=2.0)
    t = elementwise_time_s(params, np.array([3 * 2**20, 2**19]), np.array([16, 4]), 1e9)
    assert t[0] == pytest.approx(2e-6 + 2**20 / 2e9 + 2 * 2**20 / 0.5e9)
    # half a MB, all cached, at 4 tokens of S = 8: twice the streaming time
    assert t[1] == pytest.approx(2e-6 + 2 * 2**19 / 2e9)


def test_unfused_projections_cost_more_launches_than_fused():
    hw = load_hardware("a100-80gb-sxm")
    spec = load_model("llama-7b")
    fused = {o.name for o in RooflineCostModel(spec, hw).breakdown(BatchShape.decode([64]))}
    unfused = {o.name for o in RooflineCostModel(spec, hw, fused_projections=False).breakdown(BatchShape.decode([64]))}
    assert {"qkv_proj", "gate_up_proj", "rotary", "attn_residual_add"} <= fused
    assert {"q_proj", "k_proj", "v_proj", "up_proj", "gate_proj"} <= unfused and "qkv_proj" not in unfused


def test_derived_profile_must_inherit_a_measured_one(tmp_path):
    from infersim.simulator.errors import InfersimError

    text = (Path(__file__).resolve().parents[2] / "hwprofiles" / "h200.yaml").read_text()
    bad = tmp_path / "mine.yaml"
    bad.write_text(text.replace("inherits: h100-sxm", "inherits: cpu-reference"))
    with pytest.raises(InfersimError, match="calibration.inherits.*not a measured profile"):
        load_hardware(str(bad))


def test_a_gather_line_missing_a_value_is_refused_naming_the_file(tmp_path):
    from infersim.simulator.errors import InfersimError

    text = (Path(__file__).resolve().parents[2] / "hwprofiles" / "a100-80gb-sxm.yaml").read_text()
    bad = tmp_path / "mine.yaml"
    bad.write_text("".join(line for line in text.splitlines(keepends=True) if "gather_us_per_token" not in line))
    with pytest.raises(
        InfersimError, match=r"mine\.yaml.*gather_tokens, gather_us and gather_us_per_token go together"
    ):
        load_hardware(str(bad))


def test_every_gpu_profile_is_measured_or_derived_from_a_measured_card():
    """All but the AMD MI300X, whose kernels no measured (NVIDIA) card can vouch for."""
    from infersim.simulator.hardware.catalog import list_hardware

    modes = {n: load_hardware(n).mode for n in list_hardware()}
    assert {n for n, m in modes.items() if m == "datasheet"} == {"mi300x"}
    assert {n for n, m in modes.items() if m == "measured" and n != "cpu-reference"} == {
        "a100-80gb-sxm",
        "a40",
        "h100-sxm",
    }
    for name, mode in modes.items():
        if mode == "derived":
            hw = load_hardware(name)
            assert hw.calibration.why and load_hardware(hw.calibration.inherits).mode == "measured"
