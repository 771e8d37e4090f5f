"""The tensor-parallel all-reduce kernel choice (`hardware.all_reduce`): the measured custom
all-reduce table loads and validates, `auto` follows vLLM's rule (the custom kernel inside one
NVLink node below 8 MiB, NCCL above the limit, on PCIe beyond 2 GPUs and across nodes), and a
decode step with the custom kernel matches its hand calculation."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from infersim.simulator.costmodel import RooflineCostModel
from infersim.simulator.costmodel.batch import BatchShape
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.allreduce import (
    AutoAllReduce,
    CustomAllReduce,
    NcclAllReduce,
    build_all_reduce,
)
from infersim.simulator.hardware.allreduce.table import CustomAllReduceTable, load_table, shipped_table
from infersim.simulator.hardware.catalog import list_hardware, load_hardware
from infersim.simulator.models.catalog import load_model
from infersim.simulator.parallel.cost import PipelineCostModel
from infersim.simulator.parallel.placement import check_parallel
from infersim.simulator.paths import hwprofiles_dir
from infersim.simulator.workload.schema import HardwareSection

MIB = 2**20
KIB = 2**10


def _card(fully_connected=True, workers=None, profiles=("h100-sxm",)):
    return {
        "measured_on": "test card",
        "fully_connected": fully_connected,
        "profiles": list(profiles),
        "workers": workers or {2: [[1024, 4.0], [1 * MIB, 10.0]], 4: [[1024, 5.0], [1 * MIB, 14.0]]},
    }


def _table(**card) -> CustomAllReduceTable:
    return CustomAllReduceTable.model_validate(
        {
            "name": "test",
            "max_bytes": 8 * MIB,
            "world_sizes": [2, 4, 6, 8],
            "source": "hand-made",
            "cards": {"card": _card(**card)},
        }
    )


# ---- the shipped table ----------------------------------------------------------------


def test_shipped_table_validates_and_names_only_shipped_profiles():
    table = shipped_table()
    assert table.max_bytes == 8 * MIB and table.world_sizes == [2, 4, 6, 8]
    profiles = set(list_hardware())
    for card in table.cards.values():
        assert set(card.profiles) | set(card.carried_to) <= profiles
        assert card.fully_connected  # every measured card is an NVSwitch node
        for points in card.workers.values():
            sizes = [b for b, _ in points]
            assert sizes == sorted(sizes) and sizes[-1] < table.max_bytes
    assert table.card_for("h200") is table.cards["h100-sxm"]
    assert "less certain" in table.cards["h100-sxm"].label("h200")
    assert table.card_for("a100-80gb-pcie") is None and table.card_for("h100-pcie") is None


def test_a_measured_size_is_priced_at_its_measurement():
    """H100 SXM, 8 GPUs, 16 KiB (one Llama-3-70B decode token): 5.22 us in the file."""
    hw = load_hardware("h100-sxm", all_reduce="custom")
    assert float(build_all_reduce("custom", hw).time_s(16 * KIB, 8)) == pytest.approx(5.22e-6, rel=1e-12)
    a100 = load_hardware("a100-80gb-sxm")
    assert float(CustomAllReduce(a100).time_s(4 * MIB, 4)) == pytest.approx(41.07e-6, rel=1e-12)


def test_between_below_and_beyond_the_measured_sizes_by_hand():
    card = _table().cards["card"]
    # halfway in bytes between (1024 B, 4 us) and (1 MiB, 10 us)
    mid = (1024 + MIB) / 2
    assert float(card.time_s(mid, 2)) == pytest.approx(7.0e-6, rel=1e-12)
    # below the smallest size: the latency floor
    assert float(card.time_s(16, 2)) == pytest.approx(4.0e-6, rel=1e-12)
    # beyond the largest: the last stretch's slope continued
    slope = (10.0e-6 - 4.0e-6) / (MIB - 1024)
    assert float(card.time_s(2 * MIB, 2)) == pytest.approx(10.0e-6 + slope * MIB, rel=1e-12)
    # 3 GPUs, between the measured 2 and 4, linear in log2(GPUs)
    f = np.log2(3 / 2)
    assert float(card.time_s(1024, 3)) == pytest.approx((1 - f) * 4.0e-6 + f * 5.0e-6, rel=1e-12)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["cards"]["card"]["workers"][2].reverse(), "workers.2: message bytes must increase"),
        (lambda d: d["cards"]["card"]["workers"].update({16: [[1024, 3.0]]}), "[16] GPUs is not a world size"),
        (lambda d: d["cards"]["card"]["workers"][2].append([4 * MIB, -1.0]), "cards.card.workers.2"),
        (lambda d: d["cards"].update(other=_card()), "profile 'h100-sxm' is already priced by card 'card'"),
        (lambda d: d.update(max_bytes=0), "field 'max_bytes'"),
        (lambda d: d["cards"]["card"].update(speed=1), "field 'cards.card.speed'"),
    ],
)
def test_bad_table_is_one_line_naming_the_file_and_field(tmp_path, edit, message):
    data = {
        "name": "test",
        "max_bytes": 8 * MIB,
        "world_sizes": [2, 4, 6, 8],
        "source": "hand-made",
        "cards": {"card": _card()},
    }
    edit(data)
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InfersimError) as err:
        load_table(path)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{path}: ") and message in line


# ---- the rule -----------------------------------------------------------------------------


def test_auto_takes_the_custom_kernel_below_the_limit_and_nccl_from_it():
    hw = load_hardware("h100-sxm")
    auto, nccl, custom = AutoAllReduce(hw), NcclAllReduce(hw), CustomAllReduce(hw)
    sizes = np.array([16 * KIB, 4 * MIB, 8 * MIB - 16, 8 * MIB, 64 * MIB])
    got = auto.time_s(sizes, 8)
    assert np.array_equal(got[:3], custom.card.time_s(sizes[:3], 8))
    # vLLM sends a message of 8 MiB or more to NCCL (inp_size < max_size)
    assert np.array_equal(got[3:], nccl.time_s(sizes[3:], 8))
    assert np.array_equal(got, custom.time_s(sizes, 8))
    assert np.all(got[:2] < nccl.time_s(sizes[:2], 8))


def test_auto_keeps_nccl_on_pcie_beyond_two_gpus_and_where_nothing_was_measured():
    table = _table(fully_connected=False, profiles=("a100-80gb-pcie",))
    hw = load_hardware("a100-80gb-pcie")
    auto = AutoAllReduce(hw, table)
    assert auto.runs_custom(2) and not auto.runs_custom(4)
    assert float(auto.time_s(1024, 2)) == pytest.approx(4.0e-6, rel=1e-12)
    assert float(auto.time_s(1024, 4)) == float(NcclAllReduce(hw).time_s(1024, 4))
    assert "NVLink" in auto.describe(4)
    # the shipped table has no PCIe card: NCCL at every count
    shipped = AutoAllReduce(hw)
    assert not shipped.runs_custom(2) and not shipped.runs_custom(4)
    assert "no measured custom all-reduce times" in shipped.describe(2)


def test_auto_keeps_nccl_at_unsupported_counts_and_across_nodes():
    auto = AutoAllReduce(load_hardware("h100-sxm"))
    assert auto.runs_custom(8) and auto.runs_custom(6)  # 6: between the measured 4 and 8
    assert not auto.runs_custom(3) and not auto.runs_custom(16)
    assert not auto.runs_custom(8, across_nodes=True)
    assert "spans nodes" in auto.describe(8, across_nodes=True)


def test_a_group_across_nodes_prices_its_node_part_on_nccl_under_auto():
    """TP 8 on 4-GPU nodes: the 4 GPUs inside each node run NCCL (vLLM disables its custom
    kernel when the group spans nodes), so auto and nccl price the layer alike."""
    model = load_model("llama-2-70b")
    placement = check_parallel(model, HardwareSection(tensor_parallel=8, cluster={"gpus_per_node": 4}))
    pair = {}
    for kind in ("nccl", "auto"):
        base = RooflineCostModel(model, load_hardware("h100-sxm", all_reduce=kind), tensor_parallel=8)
        pair[kind] = PipelineCostModel(base, placement).links.allreduce_pair_time_s(np.array([1.0, 64.0]))
    assert np.array_equal(pair["nccl"], pair["auto"])


# ---- a decode step ------------------------------------------------------------------------


def test_llama3_70b_tp8_decode_step_with_the_custom_kernel_by_hand():
    """Llama-3-70B, TP 8 on H100 SXM, 8 sequences decoding: each all-reduce moves 8 tokens x 8192
    x 2 bytes = 128 KiB, measured at 7.80 us; 80 layers x 2 all-reduces replace NCCL's fit by it,
    and nothing else in the step changes."""
    model = load_model("llama-3-70b")
    nccl = RooflineCostModel(model, load_hardware("h100-sxm", all_reduce="nccl"), tensor_parallel=8)
    custom = RooflineCostModel(model, load_hardware("h100-sxm", all_reduce="custom"), tensor_parallel=8)
    batch = BatchShape.decode(np.full(8, 1024))
    nbytes = 8 * 8192 * 2
    nccl_one = float(nccl.hardware.collectives.all_reduce_time_s(np.array([float(nbytes)]), 8)[0])
    expected = nccl.iteration_time_s(batch) - 160 * (nccl_one - 7.80e-6)
    assert custom.iteration_time_s(batch) == pytest.approx(expected, rel=1e-12)
    rows = {r.name: r for r in custom.breakdown(batch)}
    assert rows["allreduce"].time_s == pytest.approx(2 * 7.80e-6, rel=1e-12)
    # the vectorised decode run prices every step the same way
    steps = custom.decode_step_times_s(np.full(8, 1024), 3)
    assert steps[0] == custom.iteration_time_s(batch)


# ---- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "profile, tp, why",
    [
        ("a100-80gb-pcie", 4, "hardware profile 'a100-80gb-pcie' has no measured custom all-reduce times"),
        ("h100-sxm", 3, "it runs at 2, 4, 6, 8 GPUs, not 3"),
    ],
)
def test_custom_refuses_what_it_cannot_run(profile, tp, why):
    hw = load_hardware(profile, all_reduce="custom")
    with pytest.raises(InfersimError) as err:
        build_all_reduce("custom", hw).check(tp, False, "--all-reduce")
    assert str(err.value) == f"--all-reduce: custom all-reduce cannot run here: {why}; use nccl or auto"
    with pytest.raises(InfersimError, match="spans nodes"):
        CustomAllReduce(load_hardware("h100-sxm")).check(8, True, "x")
    # a single GPU runs no all-reduce: nothing to refuse
    build_all_reduce("custom", hw).check(1, False, "--all-reduce")


def test_a_profile_sets_its_own_choice_and_a_bad_one_is_one_line(tmp_path):
    text = (hwprofiles_dir() / "h200.yaml").read_text()
    mine = tmp_path / "h200.yaml"  # its name inside is h200: the table prices it with the H100 times
    mine.write_text(text + "\nall_reduce: auto\n")
    assert isinstance(RooflineCostModel(load_model("llama-2-7b"), load_hardware(str(mine))).all_reduce, AutoAllReduce)
    # a workload's choice replaces the profile's
    assert load_hardware(str(mine), all_reduce="nccl").all_reduce == "nccl"
    bad = tmp_path / "bad.yaml"
    bad.write_text(text + "\nall_reduce: fastest\n")
    with pytest.raises(InfersimError) as err:
        load_hardware(str(bad))
    assert "\n" not in str(err.value) and f"{bad}: field 'all_reduce'" in str(err.value)
