"""`sim validate` and analysis/validate: the error metrics against hand calculations, the
engine-time extraction, the executor fit (recovers known coefficients; round-trips), the
matrix registry, bad input (one line, exit 2), and the small validation matrix on the zoo's
real target model (plain decoding under load, recompute preemption under memory pressure,
speculative decoding with one draft): the same requests on both sides, the executed schedule
reproduced by the replay driven by the measured times, the measured acceptance carried over,
and reports with every section. How close the predicted times come to the measured ones is
the validation benchmark's (`python -m infersim.analysis.validate.matrix`), not a test's: it
depends on the machine's speed during the run."""

import importlib
import json
import math
from contextlib import contextmanager

import numpy as np
import pytest

from infersim.analysis.validate.compare import TARGETS, recompute_iterations
from infersim.analysis.validate.measured import engine_periods
from infersim.analysis.validate.metrics import mape, median_ape, rel_error, signed_bias, total_bias
from infersim.cli.main import main
from infersim.simulator.costmodel.batch import BatchShape
from infersim.simulator.costmodel.executor_features import FEATURE_NAMES, batch_features, shapes_from_batches
from infersim.simulator.errors import InfersimError
from tests.utils import one_line_error

# the share of the calibration workloads' requests the end-to-end fixtures run (_fewer_calibration_requests)
CALIBRATION_SHARE = 0.5


# ---- metrics -------------------------------------------------------------------------------
def test_metrics_against_hand_calculations():
    p, m = [110.0, 90.0, 50.0], [100.0, 100.0, 25.0]
    # |10|/100, |10|/100, |25|/25 -> (0.1 + 0.1 + 1.0) / 3
    assert mape(p, m) == pytest.approx(0.4)
    # (+0.1 - 0.1 + 1.0) / 3
    assert signed_bias(p, m) == pytest.approx(1.0 / 3.0)
    assert median_ape(p, m) == pytest.approx(0.1)
    # 250 / 225 - 1
    assert total_bias(p, m) == pytest.approx(250.0 / 225.0 - 1.0)
    assert rel_error(8.0, 10.0) == pytest.approx(-0.2)
    assert rel_error(1.0, 0.0) is None and rel_error(None, 1.0) is None


def test_metrics_skip_unmeasured_pairs_and_reject_mismatched_lengths():
    # a zero or NaN measurement has no relative error: left out, not counted as 0 or inf
    assert mape([2.0, 5.0, 7.0], [1.0, 0.0, float("nan")]) == pytest.approx(1.0)
    assert math.isnan(mape([1.0], [0.0]))
    with pytest.raises(ValueError):
        mape([1.0, 2.0], [1.0])


# ---- what the executor measured --------------------------------------------------------------
def test_engine_periods_subtract_swaps_and_skip_idle_gaps():
    it = {
        "t_start_s": np.array([0.0, 1.0, 2.5, 10.0, 11.0]),
        "t_end_s": np.array([0.8, 2.0, 3.0, 10.5, 11.5]),
        "swap_s": np.array([0.0, 0.0, 0.25, 0.0, 0.0]),
    }
    # an arrival at 9.9 while the engine had nothing to do: the clock jumped from 3.0 to 10.0
    period, idle = engine_periods(it, np.array([0.0, 9.9]))
    assert period[0] == pytest.approx(1.0)
    assert period[1] == pytest.approx(2.5 - 1.0 - 0.25)  # the next iteration's swap is timed separately
    assert math.isnan(period[2]) and idle[2]
    assert period[3] == pytest.approx(1.0)
    assert math.isnan(period[4])  # the last one has no next start


def test_batch_features_by_hand():
    dec = BatchShape.of([1, 1, 1], [15, 40, 3], [1, 1, 1])
    f = dict(zip(FEATURE_NAMES, batch_features(dec, block_size=16)))
    # decode-only: every sequence padded to the longest (41 keys -> 3 blocks of 16)
    assert (f["decode_iteration"], f["decode_sequences"], f["decode_padded_keys"]) == (1, 3, 3 * 48)
    assert f["mixed_iteration"] == f["mixed_sequences"] == f["mixed_tokens"] == 0
    mixed = BatchShape.of([100, 1], [0, 20], [1, 1])
    g = dict(zip(FEATURE_NAMES, batch_features(mixed, block_size=16)))
    assert g["decode_iteration"] == g["decode_padded_keys"] == 0
    assert (g["mixed_iteration"], g["mixed_sequences"], g["mixed_tokens"]) == (1, 2, 101)
    assert g["mixed_score_pairs"] == 100 * 100 + 21 and g["mixed_keys"] == 121


def test_shapes_from_batches_and_recompute_detection():
    b = {
        "iteration": np.array([0, 1, 1, 2, 3]),
        "rid": np.array([0, 0, 1, 1, 0]),
        "query_tokens": np.array([50, 1, 30, 1, 51]),
        "context_tokens": np.array([0, 50, 0, 30, 0]),
        "makes_token": np.array([1, 1, 1, 1, 1]),
    }
    shapes = shapes_from_batches(b, np.arange(4))
    assert [s.num_seqs for s in shapes] == [1, 2, 1, 1]
    assert shapes[1].query_tokens.tolist() == [1, 30] and shapes[1].context_tokens.tolist() == [50, 0]
    # request 0 was computed (51 tokens) and shows up again with no context at iteration 3
    assert recompute_iterations(b, np.array([50, 30])).tolist() == [3]


def test_stalls_are_judged_against_like_neighbours():
    from infersim.analysis.validate.measured import jitter, stalls

    shapes = [BatchShape.decode([10 + i, 20 + i]) for i in range(40)]
    times = np.full(40, 1e-3)
    times[[5, 17, 30]] = 5e-3  # lost the core for a time slice
    times[20] = 1.5e-3  # slower, not a stall
    stalled, judged = stalls(times, shapes)
    assert judged.all() and stalled.nonzero()[0].tolist() == [5, 17, 30]
    # a prefill among decodes is not compared with them: not judged, not a stall
    mixed = shapes[:10] + [BatchShape.prefill([300])] + shapes[10:20]
    t2 = np.concatenate([np.full(10, 1e-3), [9e-3], np.full(10, 1e-3)])
    s2, j2 = stalls(t2, mixed)
    assert not s2.any() and not j2[10]
    assert jitter(np.full(40, 1e-3), shapes, np.zeros(40, bool)) == 0.0


# ---- the executor fit --------------------------------------------------------------------------
def _synthetic_run(coef, rng, n=300):
    """An ExecRun-like object whose times follow known coefficients exactly."""
    from infersim.simulator.costmodel.fitted import FittedCostModel

    model = FittedCostModel(
        coef,
        16,
        {
            "h2d": {"latency_s": 1e-4, "s_per_byte": 2e-10, "s_per_copy": 6e-6},
            "d2h": {"latency_s": 5e-5, "s_per_byte": 1e-10, "s_per_copy": 3e-6},
        },
    )
    shapes = []
    for _ in range(n):
        k = int(rng.integers(1, 12))
        if rng.random() < 0.3:
            q = rng.integers(1, 200, k)
        else:
            q = np.ones(k, dtype=np.int64)
        shapes.append(BatchShape.of(q, rng.integers(0, 300, k), np.ones(k)))
    out_blocks = np.where(rng.random(n) < 0.2, rng.integers(1, 40, n), 0)
    in_blocks = np.where((out_blocks == 0) & (rng.random(n) < 0.2), rng.integers(1, 40, n), 0)
    # a swap of b blocks made as 2 to 2b copy calls (2 per run of consecutive blocks)
    out_copies = np.where(out_blocks > 0, 2 * rng.integers(1, np.maximum(out_blocks, 1) + 1), 0)
    in_copies = np.where(in_blocks > 0, 2 * rng.integers(1, np.maximum(in_blocks, 1) + 1), 0)
    bpb = 24576.0
    swap = np.array(
        [
            model.copy_time_s(o * bpb, "d2h", co) + model.copy_time_s(i * bpb, "h2d", ci)
            for o, i, co, ci in zip(out_blocks, in_blocks, out_copies, in_copies)
        ]
    )

    class Run:
        block_size = 16
        bytes_per_block = bpb

    r = Run()
    r.shapes = shapes
    r.iteration_period_s = model.predict_many(shapes)
    r.iterations = {
        "swap_out_blocks": out_blocks,
        "swap_in_blocks": in_blocks,
        "swap_s": swap,
        "swap_out_copies": out_copies,
        "swap_in_copies": in_copies,
    }
    return model, r


def test_fit_recovers_known_coefficients():
    from infersim.analysis.validate.calibrate import fit_iteration_model, fit_transfer_model

    coef = np.array([4e-4, 6e-5, 3e-7, 1e-3, 2e-4, 2e-5, 4e-8, 1e-6])
    truth, run = _synthetic_run(coef, np.random.default_rng(0))
    got, info = fit_iteration_model([run])
    pred = np.array([batch_features(s, 16) @ got for s in run.shapes])
    assert mape(pred, run.iteration_period_s) < 1e-3
    assert info["mape_in_sample"] < 1e-3
    transfer, tinfo = fit_transfer_model([run])
    for d, blocks, copies in (
        ("h2d", "swap_in_blocks", "swap_in_copies"),
        ("d2h", "swap_out_blocks", "swap_out_copies"),
    ):
        for k in ("s_per_byte", "s_per_copy"):
            assert transfer[d][k] == pytest.approx(truth.transfer[d][k], rel=1e-3)
        assert transfer[d]["latency_s"] == pytest.approx(truth.transfer[d]["latency_s"], rel=1e-2)
        # a simulation prices a swap with the calibration's calls per byte
        calls_per_byte = run.iterations[copies].sum() / (run.iterations[blocks].sum() * run.bytes_per_block)
        assert transfer[d]["copies_per_byte"] == pytest.approx(calls_per_byte)
    assert abs(tinfo["total_error_in_sample"]) < 1e-6


def test_prefill_iterations_are_fitted_to_their_total_and_decode_steps_to_their_shape():
    """A GPU's prefills: each prompt size run four times, one of the four 1.6x slow (below the
    1.8x stall cut), and one real stall (5x). By hand: the prefill path prices each prompt at
    the mean of its four, (3 x 1 + 1.6) / 4 = 1.15 x the fast time, so the fitted total is the
    measured one; in relative error it would price them at (3 + 1 / 1.6) / (3 + 1 / 1.6**2) =
    1.0691 x. The decode-only steps, exact, give back their coefficients."""
    from infersim.analysis.validate.calibrate import PATH_FITS, fit_iteration_model, nnls_rounds
    from infersim.simulator.costmodel.executor_features import PATH_COLUMNS, feature_matrix
    from infersim.simulator.costmodel.fitted import FittedCostModel

    decode_coef = np.array([3e-3, 2e-5, 1e-8])
    base_s, per_token_s = 2e-3, 5e-6  # the fast prefill: base + per_token x prompt tokens
    rng = np.random.default_rng(3)
    shapes, times = [], []
    for _ in range(60):
        k = int(rng.integers(1, 12))
        shapes.append(BatchShape.of(np.ones(k, dtype=np.int64), rng.integers(0, 300, k), np.ones(k)))
        times.append(float(batch_features(shapes[-1], 16)[PATH_COLUMNS["decode"]] @ decode_coef))
    prompts = [100, 200, 300, 400]
    for rep in range(4):
        for q in prompts:
            shapes.append(BatchShape.of(np.array([q]), np.array([0]), np.array([1])))
            times.append((base_s + per_token_s * q) * (1.6 if rep == 3 else 1.0))
    shapes.append(BatchShape.of(np.array([200]), np.array([0]), np.array([1])))
    times.append((base_s + per_token_s * 200) * 5.0)  # a stall: left out

    class Run:
        block_size = 16

    run = Run()
    run.shapes, run.iteration_period_s = shapes, np.array(times)
    coef, info = fit_iteration_model([run])
    assert coef[PATH_COLUMNS["decode"]] == pytest.approx(decode_coef, rel=1e-6)
    fit = FittedCostModel(coef, 16, {d: {"latency_s": 0.0, "s_per_byte": 0.0} for d in ("h2d", "d2h")})
    for q in [*prompts, 250]:  # 250: between the measured sizes, on the same line
        one = BatchShape.of(np.array([q]), np.array([0]), np.array([1]))
        assert fit.iteration_time_s(one) == pytest.approx(1.15 * (base_s + per_token_s * q), rel=1e-6)
    assert info["paths"]["mixed"]["points"] == 17 and info["paths"]["mixed"]["kept"] == 16
    # the same rows in relative error fall short of the total by hand
    rows = slice(60, 76)
    X = feature_matrix(shapes[rows], 16)[:, PATH_COLUMNS["mixed"]]
    rel, _ = nnls_rounds(X, np.array(times[rows]), relative=True, trim=0.0)
    fast = base_s + per_token_s * np.array(prompts * 4)
    assert X @ rel == pytest.approx((3 + 1 / 1.6) / (3 + 1 / 1.6**2) * fast, rel=1e-6)
    assert PATH_FITS["mixed"] == {"relative": False, "trim": 0.0}


def test_swap_price_uses_the_recorded_copy_calls():
    from infersim.simulator.costmodel.fitted import FittedCostModel

    m = FittedCostModel(
        np.arange(len(FEATURE_NAMES)) * 1e-6,
        16,
        {
            "h2d": {"latency_s": 1e-4, "s_per_byte": 2e-10, "s_per_copy": 5e-6, "copies_per_byte": 1e-4},
            "d2h": {"latency_s": 0.0, "s_per_byte": 1e-10},
        },
    )
    # 1e5 bytes in 4 calls: 1e-4 + 2e-5 + 2e-5 s; with the calibration's 1e-4 calls per byte: 10 calls
    assert m.copy_time_s(1e5, "h2d", 4) == pytest.approx(1.4e-4)
    assert m.transfer_time_s(1e5, "h2d") == pytest.approx(1e-4 + 2e-5 + 5e-5)
    # a fit written before copy calls were counted (version 2) has no per-call term
    assert m.transfer_time_s(1e5, "d2h") == pytest.approx(1e-5)
    assert m.scaled(2.0).copy_time_s(1e5, "h2d", 4) == pytest.approx(2.8e-4)
    # the copies scaled apart from the compute (their own drift, from the runs next to the validated one)
    b = BatchShape.of([5, 1], [0, 7], [1, 1])
    both = m.scaled(2.0, transfer_factor=0.5)
    assert both.iteration_time_s(b) == pytest.approx(2.0 * m.iteration_time_s(b))
    assert both.copy_time_s(1e5, "h2d", 4) == pytest.approx(0.7e-4)
    assert both.meta["scaled_by"] == 2.0 and both.meta["transfer_scaled_by"] == 0.5


def test_swap_ratio_is_measured_over_priced_copy_time():
    from infersim.analysis.validate.calibrate import swap_ratio

    truth, run = _synthetic_run(np.array([4e-4, 6e-5, 3e-7, 1e-3, 2e-4, 2e-5, 4e-8, 1e-6]), np.random.default_rng(1))
    assert swap_ratio(truth, run) == pytest.approx(1.0)
    assert swap_ratio(truth.scaled(1.0, transfer_factor=1.25), run) == pytest.approx(0.8)
    run.iterations = {k: (np.zeros_like(v) if k != "swap_s" else v) for k, v in run.iterations.items()}
    assert np.isnan(swap_ratio(truth, run))


@pytest.mark.torch
def test_cache_counts_copy_calls_per_run_of_consecutive_blocks():
    import torch

    from infersim.executor.kvcache import KVCacheConfig, PagedKVCache

    c = PagedKVCache(2, 1, 2, KVCacheConfig(8, 2, cpu_blocks=8, dtype=torch.float32))
    # on the CPU both pools are committed up front (a fresh host block's page faults made the first
    # swaps into it 2-3x slower than later ones): they read as zeros before any write
    assert not c._k.any() and not c._hk.any() and not c._hv.any()

    class Seq:
        def __init__(self, rid):
            self.rid, self.block_table = rid, []

    a, b = Seq(0), Seq(1)
    c.grow_to(a, 6)  # 3 blocks, taken consecutively from a fresh free list
    c.grow_to(b, 2)
    c.grow_to(a, 8)  # a 4th block, after b's: a's table is two runs
    keys = torch.arange(c._k[:, a.block_table].numel(), dtype=torch.float32).reshape(c._k[:, a.block_table].shape)
    c._k[:, a.block_table] = keys
    before = c.copy_calls
    c.swap_out([b])  # one run: one call for keys, one for values
    assert c.copy_calls - before == 2
    c.swap_out([a])
    assert c.copy_calls - before == 2 + 4
    c.swap_in([a])
    assert c.copy_calls - before >= 2 + 4 + 2
    assert torch.equal(c._k[:, a.block_table], keys)  # the per-run copies moved the right blocks


def test_fit_json_round_trip_scaling_and_bad_files(tmp_path):
    from infersim.simulator.costmodel.fitted import FittedCostModel

    m = FittedCostModel(
        np.arange(len(FEATURE_NAMES)) * 1e-6,
        16,
        {"h2d": {"latency_s": 1e-5, "s_per_byte": 1e-10}, "d2h": {"latency_s": 2e-5, "s_per_byte": 3e-10}},
        {"seed": 1},
    )
    path = tmp_path / "fit.json"
    m.save(path)
    back = FittedCostModel.load(path)
    b = BatchShape.of([5, 1], [0, 7], [1, 1])
    assert back.iteration_time_s(b) == m.iteration_time_s(b)
    assert back.transfer_time_s(1e6, "d2h") == pytest.approx(2e-5 + 3e-4)
    assert m.scaled(2.0).iteration_time_s(b) == pytest.approx(2.0 * m.iteration_time_s(b))
    assert m.transfer_time_s(0, "h2d") == 0.0
    path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(InfersimError, match="not an executor fit"):
        FittedCostModel.load(path)
    path.write_text("{not json")
    with pytest.raises(InfersimError, match="not JSON"):
        FittedCostModel.load(path)


# ---- the matrix registry -------------------------------------------------------------------------
def test_every_case_is_a_valid_workload_with_a_known_mode():
    from infersim.analysis.validate.cases import CASES, small_matrix
    from infersim.analysis.validate.modes import MODES

    assert {
        "plain-load",
        "preempt-recompute",
        "preempt-swap",
        "preempt-cost-aware",
        "spec-draft",
        "minions-voting",
        "minions-adaptive",
        "minions-pipeline",
        "medusa-tree",
        "offload-full",
        "offload-h2o",
        "offload-infinigen",
    } <= set(CASES)
    for c in CASES.values():
        spec = c.spec("zoo-target")
        assert spec.model == "zoo-target" and spec.serving.dtype == "fp32"
        MODES.get(c.mode)
    assert [c.name for c in small_matrix()] == ["plain-load", "preempt-recompute", "spec-draft"]
    assert MODES.get("plain").availability() == (True, "")


def test_case_from_a_user_workload_picks_mode_and_comparisons(small_workload):
    from infersim.analysis.validate.cases import case_from_spec

    c = case_from_spec(small_workload(preemption="cost_aware"))
    assert c.mode == "plain" and {"swap", "recompute"} <= set(c.compare)
    assert "swap" not in case_from_spec(small_workload(preemption="recompute")).compare


def test_matrix_refuses_fewer_than_one_repeat_in_one_line(capsys):
    from infersim.analysis.validate.matrix import main as matrix_main

    assert matrix_main(["--repeats", "0", "--cases", "plain-load"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--repeats must be at least 1, got 0" in err and "\n" not in err


# ---- bad input: one line, exit 2 ------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (["validate"], "exactly one of --workload"),
        (["validate", "--case", "plain-load", "--workload", "x.yaml"], "exactly one of --workload"),
        (["validate", "--case", "no-such-case"], "unknown validation case 'no-such-case'"),
        (["validate", "--case", "plain-load", "--threads", "0"], "--threads: expected a whole number from 1 to"),
        (["validate", "--case", "plain-load", "--threads", "100000"], "--threads: expected a whole number from 1 to"),
        (["validate", "--case", "plain-load", "-n", "0"], "--requests: expected a whole number >= 1"),
        (["validate", "--case", "plain-load", "--repeats", "0"], "--repeats must be at least 1"),
        (["validate", "--case", "plain-load", "--calibration", "missing-fit.json"], "calibration file not found"),
        (["validate", "--case", "plain-load", "--cost-model", "roofline", "--calibration", "f.json"], "goes with"),
        (["validate", "--case", "plain-load", "--drift-correction"], "--drift-correction scales a saved fit"),
        (["validate", "--case", "plain-load", "--cost-model", "roofline", "--drift-correction"], "saved fit"),
        (["validate", "--case", "plain-load", "--cost-model", "regression", "--generic-calibration"], "goes with"),
        (["validate", "--case", "plain-load", "--calibration", "f.json", "--generic-calibration"], "goes with"),
        (["validate", "--workload", "no-such-workload.yaml"], "no-such-workload"),
        (
            ["validate", "--case", "plain-load", "--device", "cuda", "--cost-model", "regression"],
            "needs the GPU's profile",
        ),
    ],
)
@pytest.mark.torch
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in one_line_error(capsys)


# ---- the small matrix on the real target model -------------------------------------------------------


@contextmanager
def _fewer_calibration_requests(module: str, name: str):
    """The held-out calibration runs (`module.name`: (run name, requests section) pairs) on
    CALIBRATION_SHARE of their requests while a fixture validates: the same workloads, seeds and
    code, the fit on fewer iterations. What the tests assert (the same requests on both sides,
    the replay of the executed schedule on its measured times, a held-out fit, the report) does
    not depend on how many iterations the fit saw; how close the fitted times come is the
    validation benchmark's."""
    pairs = getattr(importlib.import_module(module), name)
    fewer = tuple((run, {**req, "count": max(8, int(req["count"] * CALIBRATION_SHARE))}) for run, req in pairs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(f"{module}.{name}", fewer)
        yield


@pytest.fixture(scope="module")
def small_results(tmp_path_factory, zoo_dir):
    """The small matrix as `sim validate` runs it: each case calibrated just before on its own
    serving configuration with other requests (held out), then executed and simulated."""
    from infersim.analysis.validate.cases import get_case
    from infersim.analysis.validate.execute import CaseOptions
    from infersim.analysis.validate.run import validate_case

    out = tmp_path_factory.mktemp("validate")
    counts = {"plain-load": 64, "preempt-recompute": 32}
    with _fewer_calibration_requests("infersim.analysis.validate.calibrate", "MATCHED_REQUESTS"):
        return {
            name: (validate_case(get_case(name), "zoo-target", out / name, CaseOptions(requests=n)), out / name)
            for name, n in counts.items()
        }


@pytest.mark.slow
@pytest.mark.torch
def test_small_matrix_runs_the_same_requests_and_writes_the_report(small_results):
    from infersim.analysis.validate.measured import load_exec_run, load_run

    for name, (result, folder) in small_results.items():
        assert result["status"] == "ran"
        e, s = load_exec_run(folder / "exec"), load_run(folder / "sim")
        n = len(e.requests["arrival_s"])
        assert n == len(s.requests["arrival_s"]) == result["requests"]
        for col in ("arrival_s", "prompt_tokens", "output_tokens"):
            assert np.array_equal(e.requests[col], s.requests[col]), col
        assert result["comparison"]["requests"]["input_mismatch"] == []
        # every request finished in both, and both produced every output token
        assert e.summary["finished"] == s.summary["finished"] == n
        # same KV pools
        assert e.config["memory"]["gpu_blocks"] == s.config["memory"]["gpu_blocks"]
        assert e.bytes_per_block == s.bytes_per_block
        md = (folder / "report.md").read_text()
        assert "## Targets" in md and "per-iteration latency MAPE" in md
        for png in ("iterations.png", "timelines.png", "latency_cdfs.png"):
            assert (folder / "plots" / png).stat().st_size > 1000
        assert (folder / "report.html").read_text().count("<img") == 3
        assert (folder / "replay" / "summary.json").is_file()
        fit = json.loads((folder / "calibration" / "executor-fit.json").read_text())
        assert fit["meta"]["matched"] and fit["meta"]["seed"] != result["seed"]
        # every check the targets name is reported, and a miss names its source
        assert set(c["target"] for c in result["checks"]) <= set(TARGETS.values())
        assert all(c["component"] for c in result["checks"] if not c["ok"])
    rec = small_results["preempt-recompute"][0]["comparison"]
    assert rec["totals"]["preempt_recompute"]["measured"] > 0  # the pool really is too small
    assert rec["cost_model"]["recompute"]["iterations"] > 0


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name", ["plain-load", "preempt-recompute"])
def test_with_the_measured_times_the_simulator_reproduces_the_executed_schedule(small_results, name):
    """The scheduling alone, independent of the machine's noise: driven by the executor's own
    iteration and copy times, the simulation makes the executor's decisions (same batches,
    same preemptions) and its latencies and throughput agree closely."""
    result, folder = small_results[name]
    rp = result["comparison"]["replay"]
    tot = result["comparison"]["totals"]
    assert rp["aligned_fraction"] >= 0.95
    assert rp["preemptions"]["preempt_recompute"] == tot["preempt_recompute"]["measured"]
    assert rp["preemptions"]["preempt_swap"] == tot["preempt_swap"]["measured"]
    assert abs(rp["throughput_error"]) < 0.02
    for col in ("ttft_s", "tpot_s", "e2e_s"):
        assert abs(rp[col]["mean_error"]) < 0.02, (col, rp[col])
        assert abs(rp[col]["p99_error"]) < 0.03, (col, rp[col])


@pytest.mark.torch
def test_closed_loop_workloads_are_refused_in_one_line(tmp_path, capsys):
    w = tmp_path / "closed.yaml"
    w.write_text(
        "name: closed\nmodel: zoo-target\nrequests:\n  count: 4\n  arrival: {type: closed_loop, clients: 2}\n"
        "  prompt_tokens: {type: fixed, value: 8}\n  output_tokens: {type: fixed, value: 4}\n"
    )
    assert main(["validate", "--workload", str(w), "--out", str(tmp_path / "out")]) == 2
    assert "closed-loop arrivals are not replayed" in one_line_error(capsys)


# ---- the speculative cases (spec_validate.py) -------------------------------------------------------
def test_speculative_target_and_draft_costs_by_hand():
    """The fitted round cost as the simulator asks it: rows with no cached context are prefills,
    the others verifications; a draft's decode step is step + sequences + keys, its lazy
    prefill its tokens; each draft gets its own cost object (the simulator counts a shared one
    once)."""
    from infersim.simulator.costmodel.batch import BatchShape
    from infersim.simulator.costmodel.speculative_fit import FEATURES, SpecFit

    coef = np.arange(1, len(FEATURES) + 1, dtype=np.float64) * 1e-6
    fit = SpecFit(coef)
    # two verifications (q = 3 and 5 at contexts 10, 20) and one 8-token prefill
    b = BatchShape(np.array([3, 5, 8]), np.array([10, 20, 0]), np.array([3, 5, 1]))
    # every query short (<= SHORT_QUERY_MAX): attention batched, no split sequences
    x = np.array([1, 2, 8, 10 + 3 + 20 + 5, 1, 8, 64, 0], dtype=np.float64)
    assert fit.target.iteration_time_s(b) == pytest.approx(float(x @ coef[:8]))
    d1, d2 = fit.drafts(2)
    assert d1 is not d2
    step = BatchShape.decode(np.array([10, 20]))
    assert d1.iteration_time_s(step) == pytest.approx(coef[8] + 2 * coef[9] + (11 + 21) * coef[10])
    pre = BatchShape(np.array([8, 4]), np.array([0, 0]), np.array([1, 1]))
    assert d1.iteration_time_s(pre) == pytest.approx(12 * coef[11])


def test_pipeline_overlap_contention_and_replayed_selector_by_hand():
    """The pieces the pipelined and adaptive-s cases rest on: how much of a pass the other
    thread overlapped, processor sharing at a share, and a selector that follows an executed
    trajectory by verification count."""
    from infersim.analysis.validate.spec_compare import _contended
    from infersim.analysis.validate.spec_costmodel import overlap_fraction
    from infersim.analysis.validate.spec_simulate import ReplayedSelector

    # passes [0, 2) and [3, 4); the other thread ran [1, 3.5)
    ov = overlap_fraction([0.0, 3.0], [2.0, 4.0], [1.0], [3.5])
    assert ov == pytest.approx([0.5, 0.5])
    # half of a 2 ms solo pass at half speed: 1 + 1 / 0.5 = 3 ms
    assert _contended(np.array([2e-3]), np.array([0.5]), 0.5) == pytest.approx([3e-3])
    sel = ReplayedSelector([[0, 4], [3, 3], [5, 6]])
    seen = [sel.s]
    for _ in range(6):
        sel.observe(1e-3, 2.0)
        seen.append(sel.s)
    assert seen == [4, 4, 4, 3, 3, 6, 6]


def test_tokens_per_round_per_request_by_hand():
    from types import SimpleNamespace

    from infersim.analysis.validate.spec_compare import tokens_per_round_per_request

    # rounds [0,1) [1,2) [2,3) [3,4); request 0: first token at 1, finished at 3 with 5 tokens:
    # rounds 2 and 3 gave the other 4; request 1: first token at 2, finished at 4 with 3 tokens
    run = SimpleNamespace(
        series={"t_start_s": np.array([0.0, 1.0, 2.0, 3.0]), "t_end_s": np.array([1.0, 2.0, 3.0, 4.0])},
        requests={
            "first_token_s": np.array([1.0, 2.0]),
            "finish_s": np.array([3.0, 4.0]),
            "output_tokens": np.array([5, 3]),
        },
    )
    assert tokens_per_round_per_request(run) == pytest.approx([2.0, 1.0])


@pytest.fixture(scope="module")
def spec_result(tmp_path_factory, zoo_dir):
    """spec-draft as `sim validate --case spec-draft` runs it, on fewer requests: calibrated on
    held-out speculative runs around the validated one."""
    from infersim.analysis.validate.cases import get_case
    from infersim.analysis.validate.execute import CaseOptions
    from infersim.analysis.validate.run import validate_case

    out = tmp_path_factory.mktemp("validate-spec") / "spec-draft"
    with _fewer_calibration_requests("infersim.analysis.validate.spec_validate", "SPEC_CALIBRATION"):
        return validate_case(get_case("spec-draft"), "zoo-target", out, CaseOptions(requests=24)), out


@pytest.mark.slow
@pytest.mark.torch
def test_spec_draft_rounds_statistics_and_report(spec_result):
    from infersim.analysis.validate.measured import load_run
    from infersim.analysis.validate.spec_rounds import rebuild_rounds
    from infersim.executor.speculative import recorded_statistics, simulator_updates

    result, folder = spec_result
    assert result["status"] == "ran"
    e, s = load_run(folder / "exec"), load_run(folder / "sim")
    n = result["requests"]
    for col in ("arrival_s", "prompt_tokens", "output_tokens"):
        assert np.array_equal(e.requests[col], s.requests[col]), col
    assert e.summary["finished"] == s.summary["finished"] == n
    assert e.config["memory"]["gpu_blocks"] == s.config["memory"]["gpu_blocks"]
    # the rebuilt rounds account for every prompt token and every output token
    t = rebuild_rounds(folder / "exec")
    assert t["prefill_tokens"].sum() == e.requests["prompt_tokens"].sum()
    assert t["tokens_out"].sum() == e.requests["output_tokens"].sum()
    assert (t["verify_context"] >= 0).all() and (t["verify_context"][t["verify_seqs"] == 0] == 0).all()
    # contexts are at least the prompts of the sequences verified
    assert (t["verify_context"] >= t["verify_seqs"] * 15).all()
    # the measured acceptance is what the simulator got
    stats = recorded_statistics(folder / "exec")
    upd = simulator_updates(stats)
    assert [d["model"] for d in upd["speculation"]["drafts"]] == ["zoo-draft-a"]
    sim_drafts = s.config["workload"]["speculation"]["drafts"]
    # (per request, a mixture fitted from the run, when it has enough requests)
    want = "mixture" if stats.get("acceptance_per_request") else stats["acceptance"]["kind"]
    assert sim_drafts[0]["acceptance"]["kind"] == want
    # the calibration is held out: other seeds, other requests
    fit = json.loads((folder / "calibration" / "speculative-fit.json").read_text())
    assert result["seed"] not in fit["meta"]["seeds"] and fit["meta"]["bracketed"]
    md = (folder / "report.md").read_text()
    assert "## Targets" in md and "per round" in md and "tokens per step" in md
    # the verdict says how the fit was scaled to the validated run's speed, as the plain cases' do
    meta = result["cost_model"]["fit"]["meta"]
    assert f"scaled by {meta['scaled_by']:.3f}, the machine's speed in the validated run" in md
    for png in ("rounds.png", "timelines.png", "latency_cdfs.png"):
        assert (folder / "plots" / png).stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.torch
def test_spec_draft_simulated_tokens_per_step_follow_the_measured_acceptance(spec_result):
    """Fed the executor's positional acceptance, the simulator's tokens per verification are
    the executor's within sampling noise (independent of the machine's speed)."""
    result, _ = spec_result
    tot = result["comparison"]["totals"]
    assert abs(tot["tokens_per_step"]["error"]) < 0.08, tot["tokens_per_step"]
    assert abs(tot["acceptance_rate"]["error"]) < 0.12, tot["acceptance_rate"]


@pytest.mark.slow
@pytest.mark.torch
def test_a_saved_spec_validation_re_priced_gives_its_verdict_again(spec_result, tmp_path):
    """reuse_runs (benchmarks/reprice_validation.py): the fit refitted from the saved calibration
    runs and the comparison redone on the saved exec/, nothing executed, with the code that ran
    it: the same coefficients and the same checks."""
    import shutil

    from infersim.analysis.validate.cases import get_case
    from infersim.analysis.validate.execute import CaseOptions
    from infersim.analysis.validate.spec_validate import validate_spec_case

    result, folder = spec_result
    out = tmp_path / "spec-draft"
    for name in ("exec", "calibration"):
        shutil.copytree(folder / name, out / name, ignore=shutil.ignore_patterns("speculative-fit.json"))
    again = validate_spec_case(
        get_case("spec-draft"), "zoo-target", out, CaseOptions(requests=24, report=False, reuse_runs=True)
    )
    assert again["cost_model"]["fit"]["coefficients"] == result["cost_model"]["fit"]["coefficients"]
    assert again["checks"] == result["checks"]


@pytest.mark.slow
@pytest.mark.torch
def test_a_saved_plain_validation_re_priced_gives_its_verdict_again(small_results, tmp_path):
    """reuse_runs on a plain case (preempt-recompute): the executor fit refitted from the saved
    calibration runs and the comparison redone on the saved exec/, nothing executed: the same
    fit, scale and checks. The copy of the runs records their model by a folder this machine
    lacks (as a run saved on another machine does); it re-prices by the executor's model name."""
    import shutil

    import yaml

    from infersim.analysis.validate.cases import get_case
    from infersim.analysis.validate.execute import CaseOptions
    from infersim.analysis.validate.run import validate_case

    result, folder = small_results["preempt-recompute"]
    out = tmp_path / "preempt-recompute"
    for name in ("exec", "calibration"):
        shutil.copytree(folder / name, out / name, ignore=shutil.ignore_patterns("executor-fit.json"))
    for cfg in out.rglob("config.yaml"):
        c = yaml.safe_load(cfg.read_text())
        c["workload"]["model"] = str(tmp_path / "elsewhere" / "zoo-target")
        cfg.write_text(yaml.safe_dump(c, sort_keys=False))
    again = validate_case(
        get_case("preempt-recompute"), "zoo-target", out, CaseOptions(requests=32, report=False, reuse_runs=True)
    )
    assert again["cost_model"]["fit"]["coefficients"] == result["cost_model"]["fit"]["coefficients"]
    assert again["cost_model"]["fit"]["meta"]["scaled_by"] == result["cost_model"]["fit"]["meta"]["scaled_by"]
    assert again["checks"] == result["checks"]


def test_a_run_saved_elsewhere_names_its_model_by_the_executor_s_name(tmp_path):
    """A saved run whose workload names a model folder missing on this machine is read with the
    executor's model name in its place; a folder that exists, or a run without that name, stays."""
    from infersim.analysis.validate.measured import _portable

    cfg = {"executor": {"model": "zoo-target"}, "workload": {"model": "/elsewhere/zoo/abc/zoo-target", "seed": 1}}
    assert _portable(cfg)["workload"] == {"model": "zoo-target", "seed": 1}
    assert cfg["workload"]["model"] == "/elsewhere/zoo/abc/zoo-target"  # the input is left as it was
    here = {"executor": {"model": "zoo-target"}, "workload": {"model": str(tmp_path)}}
    assert _portable(here) == here
    assert _portable({"workload": {"model": "/elsewhere/m"}}) == {"workload": {"model": "/elsewhere/m"}}


def _fake_clock(monkeypatch, start_s: float, kernel_s: float):
    """The executor's clock module on a fake perf_counter that starts at `start_s`, with a fake
    reference kernel that takes `kernel_s` of it. Returns the module and the one-element list
    holding the fake time (a test moves it on by hand)."""
    import infersim.executor.clock as clock_mod

    now = [start_s]
    monkeypatch.setattr(clock_mod.time, "perf_counter", lambda: now[0])

    def kernel():
        now[0] += kernel_s
        return kernel_s

    monkeypatch.setattr(clock_mod, "reference_kernel_s", kernel)
    return clock_mod, now


def test_speed_ticks_time_the_kernel_every_few_steps_with_the_engine_clock_standing_still(monkeypatch):
    """Under speed_ticks(every=3) every third step times the reference kernel (here a fake one
    that takes 5 s of a fake perf_counter) and the engine clock does not move meanwhile; the
    other steps and every clock made outside speed_ticks() record nothing."""
    clock_mod, now = _fake_clock(monkeypatch, start_s=100.0, kernel_s=5.0)
    outside = clock_mod.Clock()
    with clock_mod.speed_ticks(every=3) as rows:
        c = clock_mod.Clock()
        seen = []
        for _ in range(7):
            now[0] += 0.25  # an engine step's own time
            c.step()
            seen.append(c.now())
    assert rows == [(0.75, 5.0), (1.5, 5.0)]  # after steps 3 and 6, at engine time 3 x 0.25 and 6 x 0.25
    assert seen == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]  # 10 s of kernel, none on the engine clock
    outside.step()
    assert outside._ticks is None and clock_mod._recording is None and len(rows) == 2


def test_a_speed_tick_due_while_another_engine_runs_waits_and_a_companion_ticks_beside_it(monkeypatch):
    """every=2: the tick due at step 2 is held while may_tick is False (steps 2, 3) and taken at
    step 4, with the companion's kernel timed at the same moment; the next is due two steps
    after the one taken (step 6), and neither kernel moves the engine clock."""
    clock_mod, now = _fake_clock(monkeypatch, start_s=0.0, kernel_s=2.0)

    class Companion:
        started = 0

        def tick_start(self):
            self.started += 1

        def tick_finish(self):
            now[0] += 1.0  # waits for the other core's answer
            return 3.0

    comp = Companion()
    with clock_mod.speed_ticks(every=2) as rows:
        c = clock_mod.Clock()
        for k in range(1, 7):
            now[0] += 0.5
            c.step(may_tick=k not in (2, 3), companion=comp)
    assert rows == [(2.0, 2.0, 3.0), (3.0, 2.0, 3.0)] and comp.started == 2
    assert c.now() == 3.0  # six steps of 0.5 s; 6 s of kernels and waits hidden


def test_speed_from_ticks_carries_the_calibration_speed_per_tick_to_the_validated_run(tmp_path):
    """Calibration runs at measured/fitted 1.0, 1.1, 1.2 with ticks 1.0, 1.1, 1.2 ms: 1.0 per ms of
    tick; the validated run ticked 1.3 ms, so it ran at 1.3. A run without ticks: NaN (no scaling).
    With four runs or more the ticks are weighted by how well they predict those runs (leave-one-out)."""
    import json

    from infersim.analysis.validate.execute import speed_from_ticks, speed_tick_s

    sp = speed_from_ticks([1.0, 1.1, 1.2], [1e-3, 1.1e-3, 1.2e-3], 1.3e-3)
    assert sp.speed == pytest.approx(1.3) and sp.tick_weight == 1.0  # three runs: too few to check the ticks
    assert np.isnan(speed_from_ticks([1.0, 1.1], [1e-3, float("nan")], 1.3e-3).speed)
    assert np.isnan(speed_from_ticks([1.0], [1e-3], float("nan")).speed)
    # six runs whose ratio follows the tick exactly: no leave-one-out error by the ticks, weight 1
    r, t = [1.0, 1.2, 0.9, 1.1, 1.0, 1.3], [1e-3, 1.2e-3, 0.9e-3, 1.1e-3, 1e-3, 1.3e-3]
    sp = speed_from_ticks(r, t, 1.4e-3)
    assert sp.speed == pytest.approx(1.4) and sp.tick_weight == pytest.approx(1.0) and "left out" in sp.note
    # four runs at exactly 1.0 whose ticks moved (1-2 ms): the median ratio predicts each exactly,
    # so the ticks get weight 0 and the validated run's 2 ms tick is not believed
    sp = speed_from_ticks([1.0, 1.0, 1.0, 1.0], [1e-3, 1e-3, 2e-3, 1.5e-3], 2e-3)
    assert sp.tick_weight == 0.0 and sp.speed == pytest.approx(1.0)
    # runs near 1.0 with ticks wandering 1.0-1.4 ms: mostly the median ratio
    r = [1.0, 1.02, 0.98, 1.0, 1.01, 0.99]
    sp = speed_from_ticks(r, [1.0e-3, 1.4e-3, 1.1e-3, 1.3e-3, 1.0e-3, 1.2e-3], 1.4e-3)
    assert sp.tick_weight < 0.1 and abs(sp.speed - np.median(r)) < 0.02
    # a run's level is its ticks' mean, each capped at 10x their median (2.5 ms): 3.75 ms
    (tmp_path / "speed_ticks.json").write_text(json.dumps({"tick_s": [3e-3, 1e-3, 2e-3, 9e-3]}))
    assert speed_tick_s(tmp_path) == pytest.approx(3.75e-3)
    assert np.isnan(speed_tick_s(tmp_path / "missing"))


def test_swap_copies_are_scaled_through_the_ticks_where_enough_calibration_runs_swapped(monkeypatch):
    """The copies' measured/priced ratio per calibration run goes through speed_from_ticks like the
    compute's: six runs whose copies ran at 1.0 per ms of tick and a validated run that ticked 1.3
    ms give 1.3 (the adjacent runs, at 1.1 and 1.0, would say 1.05). With fewer than four runs
    that swapped, the mean of the two runs beside the validated one; with none of those, None."""
    import infersim.analysis.validate.calibrate as cal

    ticks = [1.0e-3, 1.2e-3, 1.1e-3, 1.0e-3, 0.9e-3, 1.2e-3]
    ratios = {i: t * 1e3 for i, t in enumerate(ticks)}
    monkeypatch.setattr(cal, "swap_ratio", lambda fit, run: ratios[run])
    scale, near = cal._copy_scale(None, list(range(6)), ticks, 1.3e-3, adjacent=(2, 3))
    assert scale.speed == pytest.approx(1.3) and near == pytest.approx([1.1, 1.0])
    assert scale.note.startswith("; copies scaled by 1.300, the copies' speed: its speed tick 1.300 ms")
    # three runs swapped: too few to weigh the ticks, so the adjacent runs' mean
    ratios.update({0: float("nan"), 1: float("nan"), 5: float("nan")})
    scale, near = cal._copy_scale(None, list(range(6)), ticks, 1.3e-3, adjacent=(2, 3))
    assert scale.speed == pytest.approx(1.05) and scale.note == "; copies 1.100, 1.000"
    # no tick for the validated run (offload, a pipelined drafting process): the adjacent runs too
    ratios.update({0: 1.0, 1: 1.2, 5: 1.2})
    scale, _ = cal._copy_scale(None, list(range(6)), ticks, float("nan"), adjacent=(2, 3))
    assert scale.speed == pytest.approx(1.05)
    ratios.update({2: float("nan"), 3: float("nan"), 4: float("nan")})
    scale, near = cal._copy_scale(None, list(range(6)), ticks, float("nan"), adjacent=(2, 3))
    assert scale.speed is None and near == [] and scale.note == ""


def test_a_core_shared_through_the_calibration_runs_is_seen_by_the_tick_level(tmp_path):
    """Another process shared the core through the calibration runs and not the validated one.
    Each calibration run's ticks: 0.9 ms, every third one 5 ms (a lost time slice), median 0.9 ms,
    level (the mean) (2 x 0.9 + 5) / 3 = 2.2667 ms; the validated run's ticks 0.9 ms throughout.
    Four calibration runs at measured/fitted 1.0: both leave-one-out errors are 0; the validated
    tick lies log(2.2667 / 0.9) = 0.924 below their range, so the median ratio's variance is
    0.924^2, the ticks' 0: weight 1 on the ticks, speed 1.0 / 2.2667 x 0.9 = 0.3971. Their median
    ticks (0.9 ms in every run) cannot tell the runs apart."""
    import json

    from infersim.analysis.validate.execute import speed_from_ticks, speed_tick_s, tick_level_s

    shared = [0.9e-3, 0.9e-3, 5e-3] * 10
    assert tick_level_s(shared) == pytest.approx(2.2667e-3, rel=1e-4)
    assert tick_level_s([0.9e-3] * 2 + [50e-3]) == pytest.approx((0.9 + 0.9 + 9.0) / 3 * 1e-3)  # capped at 10x
    assert np.isnan(tick_level_s([1e-3, 1e-3]))
    for k in range(4):
        (tmp_path / f"c{k}").mkdir()
        (tmp_path / f"c{k}" / "speed_ticks.json").write_text(json.dumps({"tick_s": shared}))
    (tmp_path / "exec").mkdir()
    (tmp_path / "exec" / "speed_ticks.json").write_text(json.dumps({"tick_s": [0.9e-3] * 30}))
    ticks = [speed_tick_s(tmp_path / f"c{k}") for k in range(4)]
    sp = speed_from_ticks([1.0] * 4, ticks, speed_tick_s(tmp_path / "exec"))
    assert sp.tick_weight == 1.0 and sp.speed == pytest.approx(0.9 / 2.2667, rel=1e-4)
    assert "outside theirs" in sp.note
    # the median ticks (0.9 ms everywhere) see no difference: the fit would stay at 1.0
    assert speed_from_ticks([1.0] * 4, [0.9e-3] * 4, 0.9e-3).speed == pytest.approx(1.0)


def test_a_gpu_run_s_speed_comes_from_its_ticks_as_measured_on_an_h100(tmp_path):
    """The plain validation reads the validated run's tick on any device (zoo-target's GPU steps
    are launch-bound, paced by the host core the tick times). The numbers of an H100 plain-load
    validation (benchmarks/RESULTS-cuda.md): six calibration runs' measured/fitted ratios and
    median ticks, the validated run's tick 0.781 ms; its measured ratio was 1.102, the two runs
    beside it (0.975 and 1.106) said 1.041, the ticks say 1.075."""
    import json

    from infersim.analysis.validate.calibrate import validated_tick_s
    from infersim.analysis.validate.execute import speed_from_ticks

    per = [0.9748, 1.0033, 0.9748, 1.1062, 0.962, 0.9769]
    ticks = [t * 1e-3 for t in (0.7029, 0.7275, 0.7048, 0.7866, 0.6978, 0.7145)]
    sp = speed_from_ticks(per, ticks, 0.7812e-3)
    assert sp.speed == pytest.approx(1.075, abs=0.002) and sp.tick_weight > 0.9
    assert abs(sp.speed / 1.1022 - 1) < abs((0.9748 + 1.1062) / 2 / 1.1022 - 1)
    (tmp_path / "speed_ticks.json").write_text(json.dumps({"tick_s": [7.8e-4, 7.9e-4, 7.7e-4]}))
    assert validated_tick_s(tmp_path) == pytest.approx(7.8e-4)
    assert np.isnan(validated_tick_s(None))
    # the speculative validation reads it as well: an H100's minions-voting, its rounds 1.231x the
    # fit; unscaled -18.8%, by the ticks (validated run 0.896 ms, 11.7% above the calibration
    # runs' 0.720-0.797 ms, so the ticks weigh 0.89) -6.6% (weighted without that term: 1.100, -10.6%)
    per = [1.0257, 1.0218, 0.9914, 1.0756, 0.9571, 0.9597]
    ticks = [t * 1e-3 for t in (0.7201, 0.7788, 0.7751, 0.7971, 0.7386, 0.7491)]
    sp = speed_from_ticks(per, ticks, 0.8961e-3)
    assert sp.speed == pytest.approx(1.150, abs=0.002) and sp.tick_weight == pytest.approx(0.892, abs=0.002)


def test_repeated_validated_runs_keep_the_median_by_busy_time(tmp_path):
    """Three runs of the same requests whose iterations took 1.0, 1.3 and 0.9 s in all: the 1.0 s
    one (the second fastest, run 1) is the measurement, kept at exec/; the others beside it; the
    spread is 1.3/0.9 - 1. A previous validation's repeats are cleared; one repeat is one run."""
    from infersim.analysis.validate.execute import busy_s, repeats_note, run_repeated
    from infersim.simulator.metrics.rundir import write_table

    totals = iter([1.0, 1.3, 0.9])

    def run_one(d):
        d.mkdir(parents=True)
        total = next(totals)
        starts = np.array([0.0, 5.0, 7.0])  # idle gaps between iterations are not busy time
        write_table(
            d / "iterations.parquet", {"t_start_s": starts, "t_end_s": starts + total * np.array([0.5, 0.3, 0.2])}
        )
        (d / "which").write_text(str(total))

    exec_dir = tmp_path / "exec"
    (tmp_path / "exec.repeat-9").mkdir()
    info = run_repeated(run_one, exec_dir, 3)
    assert info["kept"] == 1 and info["busy_s"] == pytest.approx([1.0, 1.3, 0.9])
    assert info["spread"] == pytest.approx(1.3 / 0.9 - 1)
    assert (exec_dir / "which").read_text() == "1.0" and busy_s(exec_dir) == pytest.approx(1.0)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["exec", "exec.repeat-2", "exec.repeat-3"]
    assert "run 1, the median" in repeats_note(info) and repeats_note({}) == ""
    # a speculative run's verification rounds count the same way
    d = tmp_path / "spec"
    d.mkdir()
    write_table(d / "speculation_rounds.parquet", {"t_start_s": np.array([0.0, 1.0]), "t_end_s": np.array([0.25, 1.5])})
    assert busy_s(d) == pytest.approx(0.75) and np.isnan(busy_s(tmp_path / "missing"))
    totals = iter([2.0])
    assert run_repeated(run_one, tmp_path / "once", 1) == {} and busy_s(tmp_path / "once") == pytest.approx(2.0)


def test_within_run_speed_attributes_errors_that_follow_the_ticks_to_timing_noise(tmp_path):
    """Iterations 10 ms apart, predicted 4 ms each; the machine ran 1.3x slow for the second half
    of the run and its speed ticks (every 80 ms) say so: measured = predicted x the local tick
    ratio, so the errors follow the ticks exactly (correlation 1, MAPE 0 at the local speed) and a
    per-iteration miss is timing noise. Ticks that stayed put say nothing."""
    import json

    from infersim.analysis.validate.compare import within_run_source, within_run_speed
    from infersim.analysis.validate.execute import local_speed

    start = np.arange(200) * 0.01
    clock = np.arange(25) * 0.08
    ticks = 1e-3 * np.where(clock >= 1.0, 1.3, 1.0)
    (tmp_path / "speed_ticks.json").write_text(json.dumps({"clock_s": clock.tolist(), "tick_s": ticks.tolist()}))
    f = local_speed(tmp_path, start)
    # 12 of the 25 ticks are slow: the median tick is 1.0 ms; far from the switch all 5 nearest agree
    assert f[:90] == pytest.approx(1.0) and f[-90:] == pytest.approx(1.3)
    pred = np.full(200, 4e-3)
    meas = pred * f
    w = within_run_speed(tmp_path, start, pred, meas)
    assert w["correlation"] == pytest.approx(1.0) and w["mape_at_local_speed"] == pytest.approx(0.0, abs=1e-12)
    cm = {"mape": mape(pred, meas), "bias": 0.1, "within_run": w}
    assert within_run_source(cm).startswith("timing noise: the machine's speed moved inside the run")
    # measured errors that do not follow the ticks (the slow half measured fast): not timing noise
    w = within_run_speed(tmp_path, start, pred, pred * np.where(start >= 1.0, 0.8, 1.1))
    assert w["correlation"] < 0 and within_run_source({"mape": 0.2, "within_run": w}) == ""
    # too few ticks: nothing to say
    (tmp_path / "speed_ticks.json").write_text(json.dumps({"clock_s": [0.0, 1.0], "tick_s": [1e-3, 1e-3]}))
    assert local_speed(tmp_path, start) is None and within_run_speed(tmp_path, start, pred, meas) == {}


# ---- prefix caching: the executor's hits against the simulator's --------------------------------
@pytest.fixture(scope="module")
def prefix_run(tmp_path_factory, zoo_dir):
    """The prefix-multiturn case's first 48 requests served by the executor (one torch thread)."""
    from infersim.analysis.validate.cases import get_case
    from infersim.analysis.validate.execute import run_executor
    from infersim.analysis.validate.measured import load_exec_run
    from infersim.simulator.workload.builder import build_requests

    spec = get_case("prefix-multiturn").spec("zoo-target", requests=48)
    out = tmp_path_factory.mktemp("prefix") / "exec"
    run_executor(spec, build_requests(spec), "zoo-target", out)
    return load_exec_run(out), out.parent


@pytest.mark.torch
def test_simulator_finds_the_executors_prefix_hits_exactly(prefix_run):
    """On the executed tokens' keys (ExecutedKeys), the simulator finds the executor's cache hits
    request for request: driven by the executor's measured times (its schedule), and with the
    cpu-reference roofline (another speed: the case spaces a conversation's turns so far apart
    that which blocks a turn finds does not hang on timing). The hits are real: every first turn
    but the first finds the 64-token system prompt, a second turn its previous turn's blocks."""
    from infersim.analysis.validate.compare import compare_runs
    from infersim.analysis.validate.measured import load_run
    from infersim.analysis.validate.run import _profile_cost_model
    from infersim.analysis.validate.simulate import simulate_run
    from infersim.simulator.costmodel.replay import ReplayCostModel

    run, folder = prefix_run
    roofline = _profile_cost_model("roofline", "cpu-reference", run)
    cached = np.asarray(run.requests["cached_tokens"])
    assert cached[0] == 0 and np.all(cached[1:32] == 64)  # 4 system-prompt blocks of 16
    prompt = np.asarray(run.requests["prompt_tokens"])
    assert np.all(cached[32:] == (prompt[:16] + np.asarray(run.requests["output_tokens"])[:16] - 1) // 16 * 16)
    pc = run.summary["prefix_cache"]
    assert pc["hit_rate_tokens"] == cached.sum() / prompt.sum() and pc["evictions"] == 0
    for name, cm in (("replay", ReplayCostModel(run, roofline)), ("roofline", roofline)):
        simulate_run(run, folder / name, cost_model=cm, cost_model_name="roofline")
        sim = load_run(folder / name)
        assert np.array_equal(np.asarray(sim.requests["cached_tokens"]), cached), name
        assert sim.summary["prefix_cache"] == pc, name
        checks = compare_runs("prefix-multiturn", run, sim, roofline, ("latency", "prefix")).checks
        hit = [c for c in checks if c["metric"].startswith("prefix-cache hit rate")]
        assert len(hit) == 2 and all(c["ok"] and c["value"] == 0.0 for c in hit), hit


def _missed(error: float, shift: float, stalls: float) -> dict:
    """The targets of a run whose every latency is `error` off, on a machine whose speed moved
    `shift` between the calibrations and whose iterations stalled `stalls` of the time."""
    from infersim.analysis.validate.compare import Comparison, check_targets

    latency = {"mean_error": error, "p99_error": error}
    comparison = Comparison(
        "synthetic",
        cost_model={"mape": error, "bias": error, "total_bias": error, "noise": {"stalls": stalls, "jitter": 0.03}},
        requests={"e2e_s": latency, "ttft_s": latency, "tpot_s": latency},
        totals={"throughput_output_tokens_per_s": {"error": -error / (1 + error)}},
        replay={"e2e_s": {"mean_error": 0.0}, "throughput_error": 0.0, "aligned_fraction": 1.0},
        info={"speed_shift": shift, "calibration_stalls": 0.0},
    )
    return {c["metric"]: c for c in check_targets(comparison, ())}


def test_a_busy_machine_is_blamed_only_for_a_miss_it_can_explain():
    """A machine whose speed moved 8% between the calibrations explains a 12% miss, not a 58%
    one: that is the cost model's, with the machine's business beside it."""
    small = _missed(0.12, shift=0.079, stalls=0.035)
    assert small["mean end-to-end latency"]["kind"] == "timing noise"
    assert small["per-iteration latency MAPE"]["kind"] == "timing noise"
    large = _missed(0.58, shift=0.079, stalls=0.035)
    for metric in ("per-iteration latency MAPE", "mean end-to-end latency", "TTFT p99", "throughput (output tok/s)"):
        c = large[metric]
        assert not c["ok"] and c["kind"] == "cost model", c
        assert c["component"].endswith(
            "the machine was busy (speed moved +7.9%, 3.5% of iterations stalled), too little to explain it"
        )
    # a quiet machine: the cost model, with no note
    quiet = _missed(0.58, shift=0.01, stalls=0.0)
    assert (
        quiet["mean end-to-end latency"]["component"].startswith("cost model")
        and "busy" not in quiet["mean end-to-end latency"]["component"]
    )
