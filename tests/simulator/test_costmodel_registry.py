"""Every cost model is registered by name, in simulator/costmodel/; the ones built from measured
data price batches exactly as their coefficients say, and a workload may not name them."""

import numpy as np
import pytest

import infersim.simulator.offload  # noqa: F401  (the offload pipeline registers itself)
from infersim.simulator.costmodel import COST_MODELS, BatchShape, CostModel, build_cost_model
from infersim.simulator.costmodel.executor_features import FEATURE_NAMES
from infersim.simulator.costmodel.fitted import FittedCostModel
from infersim.simulator.costmodel.measured import MeasuredCostModel
from infersim.simulator.costmodel.speculative_fit import SpecDraftCost, SpecTargetCost
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.models.catalog import load_model
from infersim.simulator.preflight import check_workload
from infersim.simulator.registry import name_key

ALL = {
    "roofline",
    "regression",
    "executor_fit",
    "executor_spec_fit_target",
    "executor_spec_fit_draft",
    "measured",
    "replay",
    "offload_replay",
    "offload",
}


def test_every_cost_model_is_registered_by_its_name_and_lives_in_the_simulator():
    assert set(COST_MODELS.names()) == ALL
    for name in ALL:
        cls = COST_MODELS.get(name)
        assert issubclass(cls, CostModel) and cls.name == name
        assert cls.__module__.startswith("infersim.simulator."), cls.__module__


@pytest.mark.parametrize("name", sorted(ALL - {"roofline", "regression"}))
def test_a_workload_may_not_name_a_model_built_from_measured_data(name, small_workload):
    with pytest.raises(InfersimError, match=f"cost model '{name}' is built from measured data .*use regression or"):
        build_cost_model(name, load_model("opt-1.3b"), load_hardware("a100-80gb-pcie"))
    with pytest.raises(InfersimError, match=f"^chat.yaml: field 'serving.cost_model': cost model '{name}' is built"):
        check_workload(small_workload(cost_model=name), "chat.yaml")


def test_registered_names_ignore_case_hyphens_and_underscores():
    assert COST_MODELS.get("Executor-Fit") is FittedCostModel
    assert name_key("PCIe 4_x16") == name_key("pcie-4x16") == "pcie4x16"


def test_fitted_model_prices_a_batch_from_its_coefficients():
    coef = np.zeros(len(FEATURE_NAMES))
    coef[FEATURE_NAMES.index("decode_iteration")] = 1e-3
    coef[FEATURE_NAMES.index("decode_sequences")] = 1e-4
    coef[FEATURE_NAMES.index("decode_padded_keys")] = 1e-6
    tr = {"latency_s": 1e-5, "s_per_byte": 1e-9}
    m = FittedCostModel(coef, 16, {"h2d": tr, "d2h": tr})
    # two decode rows, contexts 20 and 5: keys 21 and 6, padded to 2 blocks of 16 each
    assert m.iteration_time_s(BatchShape.decode([20, 5])) == pytest.approx(1e-3 + 2e-4 + 64e-6, rel=1e-12)
    assert m.transfer_time_s(1e6, "h2d") == pytest.approx(1e-5 + 1e-3, rel=1e-12)


def test_speculative_fit_prices_verification_prefill_and_drafts():
    target = SpecTargetCost([1e-3, 1e-4, 1e-5, 1e-7, 2e-4, 2e-5, 1e-8, 5e-4])
    # one verification (3 rows over 10 cached tokens) and one prefill of 8 tokens: every query
    # short, attention batched (no split term)
    b = BatchShape(np.array([3, 8]), np.array([10, 0]), np.array([1, 1]))
    expected = 1e-3 + 1e-4 + 3e-5 + 13e-7 + 2e-4 + 8 * 2e-5 + 64e-8
    assert target.iteration_time_s(b) == pytest.approx(expected, rel=1e-12)
    # a 40-token prompt beside it: attention one sequence at a time, both sequences
    b = BatchShape(np.array([3, 40]), np.array([10, 0]), np.array([1, 1]))
    expected = 1e-3 + 1e-4 + 3e-5 + 13e-7 + 2e-4 + 40 * 2e-5 + 1600e-8 + 2 * 5e-4
    assert target.iteration_time_s(b) == pytest.approx(expected, rel=1e-12)
    draft = SpecDraftCost([1e-3, 1e-4, 1e-6, 1e-5, 3e-4])
    assert draft.iteration_time_s(BatchShape.decode([9, 19])) == pytest.approx(1e-3 + 2e-4 + 30e-6, rel=1e-12)
    assert draft.iteration_time_s(BatchShape.prefill([7])) == pytest.approx(7e-5, rel=1e-12)
    # a catch-up on a 40-token prompt while 3 sequences decode in the same step: 4 split sequences
    catchup = BatchShape(np.array([40]), np.array([0]), np.array([1]), alongside=3)
    assert draft.iteration_time_s(catchup) == pytest.approx(40e-5 + 4 * 3e-4, rel=1e-12)


def test_measured_model_follows_the_least_squares_line():
    m = MeasuredCostModel()
    for tokens in (10, 20, 40):
        m.observe_iteration(tokens, 2e-3 + 5e-5 * tokens)
    assert m.iteration_time_s(BatchShape.prefill([30])) == pytest.approx(2e-3 + 5e-5 * 30, rel=1e-9)
