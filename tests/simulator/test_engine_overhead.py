"""The serving engine's overhead per iteration: iteration_us plus tp_worker_us for each
tensor-parallel worker beyond the first, added once to every iteration's kernels."""

import numpy as np
import pytest
import yaml

from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import list_hardware, load_hardware
from infersim.simulator.hardware.profile import Overheads
from infersim.simulator.models.catalog import load_model
from infersim.simulator.paths import hwprofiles_dir
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


# ---- one overhead for every NVIDIA profile ------------------------------------------------------
NVIDIA_GPUS = [n for n in list_hardware() if n not in ("cpu-reference", "mi300x")]


@pytest.mark.parametrize("card", NVIDIA_GPUS)
def test_every_nvidia_profile_carries_the_one_fitted_overhead(card):
    """The fit is written once, in a100-80gb-sxm.yaml; the other NVIDIA profiles name it and
    write no number of their own, so a re-fit moves them all."""
    hw = load_hardware(card)
    assert (hw.overheads.iteration_us, hw.overheads.tp_worker_us, hw.overheads.kernel_launch_us) == (1720, 446, 0)
    raw = yaml.safe_load((hwprofiles_dir() / f"{card}.yaml").read_text())["overheads"]
    if card == "a100-80gb-sxm":
        assert raw["status"] == "measured" and "inherits" not in raw
    else:
        assert raw["inherits"] == "a100-80gb-sxm" and not {"iteration_us", "tp_worker_us"} & set(raw)
        assert hw.overheads.why and "benchmarks/vllm_published.py" in hw.overheads.source
    fitted_on = ("a100-80gb-sxm", "h100-sxm", "h200")  # fitted on A100 and H200 runs, checked on H100 ones
    assert hw.overheads.state == ("measured" if card in fitted_on else "derived")


@pytest.mark.parametrize(
    "card, tp, added_us", [("a100-80gb-pcie", 1, 1720.0), ("l4", 1, 1720.0), ("h100-pcie", 2, 2166.0)]
)
def test_a_derived_profiles_step_is_its_kernels_plus_the_carried_overhead(card, tp, added_us):
    # TP 1: 1,720 us; TP 2: 1,720 + 446 = 2,166 us, on top of the same kernels
    model, batch = load_model("llama-3-8b"), BatchShape.decode(np.full(8, 512))
    bare = RooflineCostModel(model, with_overheads(card, 0, 0), dtype="fp16", tensor_parallel=tp)
    shipped = RooflineCostModel(model, load_hardware(card), dtype="fp16", tensor_parallel=tp)
    assert shipped.iteration_time_s(batch) - bare.iteration_time_s(batch) == pytest.approx(added_us * 1e-6, abs=1e-12)


@pytest.mark.parametrize("card", ["a100-80gb-pcie", "l4", "h100-sxm"])
def test_the_datasheet_variant_carries_no_overhead(card):
    hw = load_hardware(f"{card}:datasheet")
    assert hw.overheads.iteration_s(4) == 0.0 and hw.overheads.state == "none" and hw.overheads.inherits is None
    cost = RooflineCostModel(load_model("llama-3-8b"), hw, dtype="fp16")
    assert not [r for r in cost.breakdown(BatchShape.decode(np.full(8, 512))) if r.name == "engine_overhead"]


def test_the_cpu_and_rocm_profiles_keep_their_own():
    cpu = load_hardware("cpu-reference").overheads
    assert (cpu.kernel_launch_us, cpu.iteration_us, cpu.tp_worker_us, cpu.inherits) == (1.13, 457.0, 0.0, None)
    assert cpu.state == "measured"
    rocm = load_hardware("mi300x").overheads
    assert rocm.iteration_s(8) == 0.0 and rocm.state == "none"


def profile_with_overheads(tmp_path, overheads: dict):
    data = yaml.safe_load((hwprofiles_dir() / "l4.yaml").read_text())
    data.update(name="l4-mine", aliases=[], overheads=overheads)
    path = tmp_path / "l4-mine.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_copy_that_sets_a_number_keeps_it_and_inherits_the_rest(tmp_path):
    path = profile_with_overheads(tmp_path, {"status": "derived", "inherits": "a100-80gb-sxm", "iteration_us": 100})
    o = load_hardware(str(path)).overheads
    assert (o.iteration_us, o.tp_worker_us) == (100, 446)


def test_a_resolved_profile_written_out_loads_to_the_same_overhead(tmp_path):
    dumped = load_hardware("l4").model_dump(mode="json")
    dumped.update(name="l4-dump", aliases=[])
    path = tmp_path / "l4-dump.yaml"
    path.write_text(yaml.safe_dump(dumped))
    assert load_hardware(str(path)).overheads == load_hardware("l4").overheads


@pytest.mark.parametrize(
    "overheads, message",
    [
        ({"status": "derived", "inherits": "mi300x"}, "field 'overheads.inherits': 'mi300x' is not a profile"),
        ({"status": "derived", "inherits": "l40s"}, "field 'overheads.inherits': 'l40s' is not a profile"),
        ({"status": "derived"}, "overheads"),
    ],
)
def test_a_bad_inheritance_is_one_line_naming_the_file_and_field(tmp_path, overheads, message):
    path = profile_with_overheads(tmp_path, overheads)
    with pytest.raises(InfersimError) as err:
        load_hardware(str(path))
    assert str(path) in str(err.value) and message in str(err.value) and "\n" not in str(err.value)
