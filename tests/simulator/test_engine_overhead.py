"""The serving engine's overhead per iteration: iteration_us plus tp_worker_us for each
tensor-parallel worker beyond the first, added once to every iteration's kernels."""

import numpy as np
import pytest

from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.hardware.profile import Overheads
from infersim.simulator.models.catalog import load_model
from infersim.simulator.simulation import simulate
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import WorkloadSpec


def with_overheads(card: str, iteration_us: float, tp_worker_us: float):
    hw = load_hardware(card)
    return hw.model_copy(
        update={"overheads": Overheads(iteration_us=iteration_us, tp_worker_us=tp_worker_us, source="test")}
    )


@pytest.mark.parametrize("tp, added_us", [(1, 1000.0), (2, 1250.0), (4, 1750.0), (8, 2750.0)])
def test_a_step_adds_iteration_us_and_tp_worker_us_per_extra_worker(tp, added_us):
    # 1,000 us per iteration + 250 us per worker beyond the first: TP 4 adds 1,000 + 3 x 250 = 1,750 us
    model, batch = load_model("llama-3-70b"), BatchShape.decode(np.full(8, 512))
    bare = RooflineCostModel(model, with_overheads("h100-sxm", 0, 0), dtype="bf16", tensor_parallel=tp)
    paid = RooflineCostModel(model, with_overheads("h100-sxm", 1000, 250), dtype="bf16", tensor_parallel=tp)
    assert paid.iteration_time_s(batch) - bare.iteration_time_s(batch) == pytest.approx(added_us * 1e-6, abs=1e-12)
    steps = paid.decode_step_times_s(np.full(8, 512), 3) - bare.decode_step_times_s(np.full(8, 512), 3)
    assert steps == pytest.approx(np.full(3, added_us * 1e-6), abs=1e-12)


def test_overheads_default_to_zero_and_reject_negative():
    assert Overheads().iteration_s(8) == 0.0
    with pytest.raises(ValueError):
        Overheads(tp_worker_us=-1)


@pytest.mark.parametrize("card", ["a100-80gb-sxm", "h100-sxm", "h200"])
def test_vllm_fitted_cards_ship_the_overhead_and_vllms_all_reduce(card):
    hw = load_hardware(card)
    assert (hw.overheads.iteration_us, hw.overheads.tp_worker_us) == (1720, 446)
    assert "benchmarks/vllm_published.py" in hw.overheads.source and "9523" in hw.overheads.source
    assert hw.all_reduce == "auto"
    # TP 4: 1,720 + 3 x 446 = 3,058 us per iteration
    assert hw.overheads.iteration_s(4) == pytest.approx(3058e-6)


def latency_test(tp: int) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {
            "model": "llama-2-7b",
            "hardware": {"profile": "h100-sxm", "tensor_parallel": tp},
            "serving": {"dtype": "bf16", "max_batch_size": 8},
            "requests": {
                "count": 8,
                "arrival": {"type": "burst"},
                "prompt_tokens": {"type": "fixed", "value": 32},
                "output_tokens": {"type": "fixed", "value": 16},
            },
            "seed": 0,
        }
    )


def test_a_burst_pays_the_overhead_once_per_iteration():
    # 8 prompts of 32 tokens, 16 output tokens: 1 prefill + 15 decode steps = 16 iterations, each
    # paying 1,720 + 446 = 2,166 us at TP 2: the last request finishes 16 x 2.166 = 34.656 ms later
    spec = latency_test(2)
    shipped = simulate(spec, build_requests(spec, "."))
    bare_hw = with_overheads("h100-sxm", 0, 0)
    cost = RooflineCostModel(load_model("llama-2-7b"), bare_hw, dtype="bf16", tensor_parallel=2)
    kernels_s = cost.iteration_time_s(BatchShape.prefill(np.full(8, 32))) + float(
        np.sum(cost.decode_step_times_s(np.full(8, 32), 15))
    )
    assert float(np.max(shipped.requests["finish_s"])) == pytest.approx(kernels_s + 16 * 2166e-6, rel=1e-9)


def test_the_operator_rows_carry_the_overhead_and_add_up_to_the_step():
    # h100-sxm at TP 4: one engine_overhead row of 1,720 + 3 x 446 = 3,058 us; a datasheet
    # profile has none
    model, batch = load_model("llama-3-70b"), BatchShape.decode(np.full(8, 512))
    cost = RooflineCostModel(model, load_hardware("h100-sxm"), dtype="bf16", tensor_parallel=4)
    rows = cost.breakdown(batch)
    (overhead,) = [r for r in rows if r.name == "engine_overhead"]
    assert (overhead.count, overhead.time_s) == (1, pytest.approx(3058e-6))
    assert sum(r.time_s * r.count for r in rows) == pytest.approx(cost.iteration_time_s(batch), rel=1e-12)
    sheet = RooflineCostModel(model, load_hardware("h100-sxm:datasheet"), dtype="bf16", tensor_parallel=4)
    assert not [r for r in sheet.breakdown(batch) if r.name == "engine_overhead"]
