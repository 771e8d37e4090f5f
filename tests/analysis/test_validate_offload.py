"""Validation of the offload cases (analysis/validate/offload_*.py): the offload cost model's
composition on a calibrated compute and host link against a hand calculation, the fit's
recovery of known coefficients, and one small offload case end to end on the zoo's real
target model: the same requests on both sides, the KV bytes the simulator's policy copies on
the executed batches against the executor's, the recorded sparsity carried over, the report."""

import numpy as np
import pytest

from infersim.simulator.costmodel.batch import BatchShape
from infersim.simulator.errors import InfersimError
from infersim.simulator.offload.calibrated import HostLink, LinearStageCompute
from tests.utils import one_line_error

COEF = {
    "const": 1e-3,
    "decode_seq": 2e-4,
    "prefill_seq": 5e-4,
    "prefill_token": 3e-6,
    "key": 1e-7,
    "pair": 2e-8,
    "logit": 4e-5,
    "pred_context": 5e-7,
}
LINK = HostLink(h2d_latency_s=6e-6, h2d_bytes_per_s=3e9, d2h_latency_s=8e-6, d2h_bytes_per_s=4e9)


def _cm(policy: str, overlap: str = "none"):
    from infersim.simulator.hardware.catalog import load_hardware
    from infersim.simulator.models.catalog import load_model
    from infersim.simulator.offload import OffloadSection, build_offload

    model = load_model("llama-2-7b")
    sec = OffloadSection(policy=policy, overlap=overlap, **({"sparsity": "opt-13b"} if policy == "infinigen" else {}))
    setup = build_offload(model, load_hardware("cpu-reference"), sec, dtype="fp32")
    return setup.cost_model(compute=LinearStageCompute(COEF), link=LINK), model


def test_calibrated_offload_cost_model_composes_by_hand():
    cm, model = _cm("full")
    L = model.num_layers
    tl = 2 * model.kv_dim * 4  # K and V of a token in a layer, fp32
    ctx = np.array([100, 300, 0])
    q = np.array([1, 1, 50])
    batch = BatchShape(q, ctx, np.array([1, 1, 1]))
    D, Bp, Tp = 2, 1, 50
    keys_l = (100 + 1) + (300 + 1) + 50  # attended + new, per layer
    pairs_l = (100 + 1) + (300 + 1) + 50 * 50
    attn_l = (COEF["decode_seq"] * D + COEF["prefill_seq"] * Bp) / L + COEF["key"] * keys_l + COEF["pair"] * pairs_l
    ffn_l = COEF["prefill_token"] * Tp / L
    load_l = LINK.h2d_latency_s + 400 * tl / LINK.h2d_bytes_per_s
    store_l = LINK.d2h_latency_s + 52 * tl / LINK.d2h_bytes_per_s
    want = COEF["const"] + L * (load_l + attn_l + ffn_l + store_l) + COEF["logit"] * 3
    assert cm.time_s(batch) == pytest.approx(want, rel=1e-12)
    # the bytes are the policy's: full loads every cached token of every decoding sequence
    st = cm.stages(q[None], ctx[None], np.ones((1, 3), dtype=np.int64))
    assert st.load_bytes.sum() == pytest.approx(L * 400 * tl)
    # the pipelined composition uses the same stages: ffn overlap hides loads under the FFN
    cmf, _ = _cm("full", "ffn")
    assert cmf.time_s(batch) < cm.time_s(batch)


def test_infinigen_prediction_is_paid_per_predicted_layer():
    cm, model = _cm("infinigen")
    base, _ = _cm("full")
    b = BatchShape(np.array([1]), np.array([2000]), np.array([1]))
    st = cm.stages(b.query_tokens[None], b.context_tokens[None], b.logit_tokens[None])
    # layers 1..L-1 are predicted (start_layer 1): pred_context x context spread over them
    assert st.pred[0, 0] == 0.0
    assert st.pred[0, 1:].sum() == pytest.approx(COEF["pred_context"] * 2000)
    assert (
        st.load_bytes.sum()
        < base.stages(b.query_tokens[None], b.context_tokens[None], b.logit_tokens[None]).load_bytes.sum()
    )


def test_unknown_compute_terms_are_refused():
    with pytest.raises(InfersimError, match="unknown calibrated offload compute terms"):
        LinearStageCompute({"const": 1.0, "per_flop": 2.0})


def test_nnls_relative_recovers_known_coefficients():
    from infersim.analysis.validate.offload_calibrate import nnls_relative

    rng = np.random.default_rng(0)
    X = np.column_stack([np.ones(300), rng.integers(1, 9, 300), rng.uniform(0, 5000, 300)])
    c = np.array([1e-3, 2e-4, 1e-7])
    y = X @ c * (1 + rng.normal(0, 0.005, 300))
    y[:3] *= 3.0  # stalls are left out, not fitted
    got, kept = nnls_relative(X, y)
    assert got == pytest.approx(c, rel=0.05)
    assert not kept[:3].any()


def test_offload_fit_round_trips(tmp_path):
    from infersim.analysis.validate.offload_calibrate import OffloadFit

    f = OffloadFit(LinearStageCompute(COEF), LINK, {"seeds": [9013, 9014]})
    f.save(tmp_path / "fit.json")
    g = OffloadFit.load(tmp_path / "fit.json")
    assert g.compute.coef == f.compute.coef and g.link == f.link and g.meta == f.meta
    with pytest.raises(InfersimError):
        OffloadFit.load(tmp_path / "missing.json")


@pytest.mark.torch
def test_offload_case_refuses_other_cost_models(tmp_path, capsys, monkeypatch):
    from infersim.cli.main import main

    monkeypatch.chdir(tmp_path)
    assert main(["validate", "--case", "offload-full", "--cost-model", "roofline"]) == 2
    assert "offload cases" in one_line_error(capsys)


# ---- one small offload case end to end ---------------------------------------------------------
OFFLOAD_REQUESTS = 8


@pytest.fixture(scope="module")
def infinigen_case(tmp_path_factory, zoo_dir):
    from infersim.analysis.validate.cases import get_case
    from infersim.analysis.validate.execute import CaseOptions
    from infersim.analysis.validate.run import validate_case

    out = tmp_path_factory.mktemp("validate-offload") / "offload-infinigen"
    # half the case's 16 requests: the test checks what is deterministic (requests, bytes, report)
    return validate_case(get_case("offload-infinigen"), "zoo-target", out, CaseOptions(requests=OFFLOAD_REQUESTS)), out


@pytest.mark.slow
@pytest.mark.torch
def test_offload_case_runs_end_to_end(infinigen_case):
    from infersim.analysis.validate.measured import load_exec_run, load_run

    result, out = infinigen_case
    assert result["status"] == "ran" and result["requests"] == OFFLOAD_REQUESTS
    ex, sim = load_exec_run(out / "exec"), load_run(out / "sim")
    assert np.array_equal(ex.requests["prompt_tokens"], sim.requests["prompt_tokens"])
    assert (out / "exec" / "recorded_sparsity.yaml").is_file()
    assert result["updates"]["offload"]["sparsity"].endswith("recorded_sparsity.yaml")
    # the calibration is held out: other seeds than the validated run
    meta = result["cost_model"]["fit"]["meta"]
    assert result["seed"] not in meta["seeds"]
    # bytes: the simulator's policy on the executed batches counts what the executor copied
    ob = result["offload"]
    assert ob["measured_bytes"] > 0 and abs(ob["bytes_error"]) <= 0.05
    assert ob["simulated_loaded_bytes"] > 0
    assert (out / "report.md").is_file() and "KV bytes loaded" in (out / "report.md").read_text()
