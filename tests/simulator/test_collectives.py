"""Measured collectives: reading the tables, the piecewise fit, the profile section and how the
roofline prices tensor-parallel all-reduce and pipeline send/recv from it."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from infersim.simulator.calibration.profile_writer import with_sections
from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.hardware.collectives import CollectiveFit, CollectivesSection, SizeSegment
from infersim.simulator.hardware.collectives_fit import (
    FitOptions,
    detect,
    fit_collectives,
    read_collectives_table,
)
from infersim.simulator.models.catalog import load_model

# the measured table the shipped sections were fitted on (shipped with the benchmarks)
MEASURED_TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "gpu-kernels" / "collectives.csv.gz"

HEADER = "setup,collective,num_workers,size,devices_per_node,max_devices_per_node,median_ms,std_ms\n"
# two regimes with a jump between them, as NCCL's protocol switch makes: (latency s, bandwidth B/s)
SMALL, LARGE, EDGE_BYTES = (10e-6, 50e9), (40e-6, 400e9), 2**20


def synthetic_rows(setup="lab_dgx", workers=2, per_node=2, n=40):
    nbytes = np.unique(np.round(np.geomspace(4096, 64 * 2**20, n) / 2).astype(int) * 2)
    lat = np.where(nbytes < EDGE_BYTES, SMALL[0], LARGE[0])
    bw = np.where(nbytes < EDGE_BYTES, SMALL[1], LARGE[1])
    ms = (lat + nbytes / bw) * 1e3
    return [f"{setup},all_reduce,{workers},{b // 2},{per_node},8,{float(t)!r},0.001\n" for b, t in zip(nbytes, ms)]


def write(tmp_path, rows, name="table.csv", header=HEADER):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "".join(rows))
    return path


def fine_options():
    return FitOptions(candidate_edges=400)  # every size a candidate boundary: the true edge is one


def test_fit_recovers_known_latency_and_bandwidth_on_both_sides_of_a_jump(tmp_path):
    table = read_collectives_table(write(tmp_path, synthetic_rows()))
    section = fit_collectives(table, "lab_dgx", options=fine_options())
    (fit,) = section.all_reduce
    assert (fit.workers, fit.devices_per_node, fit.topology) == (2, 2, "nvswitch")
    small, large = fit.segments
    assert small.latency_us == pytest.approx(10.0, rel=1e-4) and small.bandwidth_gbps == pytest.approx(50.0, rel=1e-4)
    assert large.latency_us == pytest.approx(40.0, rel=1e-4) and large.bandwidth_gbps == pytest.approx(400.0, rel=1e-4)
    sizes = table["nbytes"].to_numpy()
    below, above = sizes[sizes < EDGE_BYTES].max(), sizes[sizes >= EDGE_BYTES].min()
    assert below < small.max_bytes < above and large.max_bytes is None
    assert fit.mape_pct < 1e-3 and fit.rows == len(sizes) == small.rows + large.rows
    # the section prices what it was fitted on
    assert section.all_reduce_time_s(np.array([8192.0, 32 * 2**20]), 2) == pytest.approx(
        [10e-6 + 8192 / 50e9, 40e-6 + 32 * 2**20 / 400e9], rel=1e-5
    )


def test_one_line_suffices_when_one_line_fits(tmp_path):
    rows = [f"lab_dgx,send_recv,2,{s},2,8,{(5e-6 + 2 * s / 100e9) * 1e3!r},0\n" for s in (2**k for k in range(10, 26))]
    (fit,) = fit_collectives(read_collectives_table(write(tmp_path, rows)), "lab_dgx").send_recv
    (seg,) = fit.segments
    assert seg.latency_us == pytest.approx(5.0, rel=1e-4) and seg.bandwidth_gbps == pytest.approx(100.0, rel=1e-4)


def test_vidur_layout_is_read_with_the_setup_from_its_folder_and_median_over_ranks(tmp_path):
    header = (
        ",time_stats.all_reduce.min,time_stats.all_reduce.max,time_stats.all_reduce.mean,"
        "time_stats.all_reduce.median,time_stats.all_reduce.std,rank,num_workers,size,collective,"
        "devices_per_node,max_devices_per_node\n"
    )
    rows = [
        "0,0.01,0.05,0.03,0.020,0.01,0,2,2048,all_reduce,2,8\n",
        "1,0.01,0.05,0.03,0.040,0.01,1,2,2048,all_reduce,2,8\n",
        "2,0.01,0.05,0.03,0.030,0.01,2,2,2048,all_reduce,2,8\n",
        "3,0.01,0.05,0.03,0.100,0.01,0,2,4096,all_reduce,2,8\n",
    ]
    path = write(tmp_path, rows, name="h100_dgx/all_reduce.csv", header=header)
    assert detect(pd.read_csv(path, nrows=0).columns) == "vidur-network"
    table = read_collectives_table(path)
    assert list(table["setup"].unique()) == ["h100_dgx"]
    assert table["nbytes"].tolist() == [4096, 8192]  # fp16 elements x 2
    assert table["time_s"].tolist() == pytest.approx([30e-6, 100e-6])  # median of the three ranks


def test_a_size_measured_twice_more_than_1_5x_apart_is_refused_naming_both_rows(tmp_path):
    """As `sim calibrate` refuses a GEMM timed twice 1.5x apart (calibration/checks.py), a
    collective at one size and placement timed twice that far apart is refused, not averaged."""
    rows = synthetic_rows()
    again = rows[2].split(",")
    again[6] = repr(float(again[6]) * 1.6)
    path = write(tmp_path, rows[:5] + [",".join(again)] + rows[5:])
    with pytest.raises(InfersimError) as err:
        read_collectives_table(path)
    text = str(err.value)
    assert text.startswith(f"{path}: row 6 (line 7), column 'median_ms': ") and "\n" not in text
    assert "the same all_reduce" in text and "as row 3 (line 4," in text and "1.6x apart" in text


def test_repeats_within_1_5x_and_ranks_of_vidur_tables_are_medianed(tmp_path):
    rows = synthetic_rows()
    again = rows[2].split(",")
    again[6] = repr(float(again[6]) * 1.4)
    table = read_collectives_table(write(tmp_path, rows + [",".join(again)]))
    alone = read_collectives_table(write(tmp_path, rows, name="alone.csv"))
    assert table["time_s"].iloc[2] == pytest.approx(alone["time_s"].iloc[2] * 1.2)  # the median of two
    # vidur's rows are one per rank: ranks 2x apart are medianed, one rank given twice is checked
    header = "time_stats.all_reduce.median,rank,num_workers,size,collective,devices_per_node,max_devices_per_node\n"
    ranks = ["0.020,0,2,2048,all_reduce,2,8\n", "0.040,1,2,2048,all_reduce,2,8\n"]
    assert len(read_collectives_table(write(tmp_path, ranks, name="lab/all_reduce.csv", header=header))) == 1
    twice = ranks + ["0.070,1,2,2048,all_reduce,2,8\n"]
    with pytest.raises(InfersimError, match=r"row 3 \(line 4\), column 'time_stats.all_reduce.median': .* as row 2"):
        read_collectives_table(write(tmp_path, twice, name="lab2/all_reduce.csv", header=header))


def test_detect_tells_the_layouts_apart():
    assert detect(HEADER.strip().split(",")) == "infersim-collectives"
    assert detect(["num_workers", "size", "median_ms"]) is None


@pytest.mark.parametrize(
    "row, message",
    [
        (
            "lab_dgx,all_reduce,2,2048,2,8,abc,0\n",
            "row 2 (line 3), column 'median_ms': expected a positive number, got 'abc'",
        ),
        (
            "lab_dgx,all_reduce,2,2048,2,8,-1,0\n",
            "row 2 (line 3), column 'median_ms': expected a positive number, got '-1'",
        ),
        (
            "lab_dgx,all_reduce,2,20.5,2,8,0.1,0\n",
            "row 2 (line 3), column 'size': expected a positive integer, got '20.5'",
        ),
        (
            "lab_dgx,all_gather,2,2048,2,8,0.1,0\n",
            "row 2 (line 3), column 'collective': expected one of all_reduce, send_recv",
        ),
        ("lab_dgx,all_reduce,2,2048,4,8,0.1,0\n", "row 2 (line 3), column 'devices_per_node': more devices per node"),
        (
            "lab_dgx,all_reduce,6,2048,4,8,0.1,0\n",
            "row 2 (line 3), column 'devices_per_node': does not divide num_workers",
        ),
        (",all_reduce,2,2048,2,8,0.1,0\n", "row 2 (line 3), column 'setup': empty"),
    ],
)
def test_a_malformed_row_is_one_line_naming_file_row_and_column(tmp_path, row, message):
    path = write(tmp_path, ["lab_dgx,all_reduce,2,2048,2,8,0.05,0\n", row])
    with pytest.raises(InfersimError) as err:
        read_collectives_table(path)
    text = str(err.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_vidur_error_names_vidur_column(tmp_path):
    header = "time_stats.send_recv.median,num_workers,size,collective,devices_per_node,max_devices_per_node\n"
    path = write(tmp_path, ["n/a,2,2048,send_recv,2,8\n"], name="a40_pairwise_nvlink/send_recv.csv", header=header)
    with pytest.raises(InfersimError, match=r"row 1 \(line 2\), column 'time_stats.send_recv.median'"):
        read_collectives_table(path)


def test_not_a_collectives_table_and_missing_file(tmp_path):
    with pytest.raises(InfersimError, match="not a collectives table"):
        read_collectives_table(write(tmp_path, ["1,2\n"], header="a,b\n"))
    with pytest.raises(InfersimError, match="file not found"):
        read_collectives_table(tmp_path / "none.csv")
    table = read_collectives_table(write(tmp_path, synthetic_rows()))
    with pytest.raises(InfersimError, match="no rows for setup 'other'; setups: lab_dgx"):
        fit_collectives(table, "other")


def one_line(workers, per_node, latency_us, gbps, topology="nvswitch"):
    return CollectiveFit(
        workers=workers,
        devices_per_node=per_node,
        topology=topology,
        fitted_on="hand",
        rows=1,
        mape_pct=0,
        bias_pct=0,
        segments=[SizeSegment(max_bytes=None, latency_us=latency_us, bandwidth_gbps=gbps, rows=1, mape_pct=0)],
    )


SECTION = CollectivesSection(
    setup="lab_dgx",
    max_devices_per_node=8,
    source="hand",
    all_reduce=[one_line(2, 2, 10, 100), one_line(8, 8, 30, 70), one_line(16, 8, 90, 20, "inter_node")],
    send_recv=[one_line(2, 2, 5, 200), one_line(2, 1, 20, 10, "inter_node")],
)


def test_measured_worker_counts_are_used_as_fitted_others_interpolate_or_borrow_the_nearest():
    mib = 2.0**20
    assert SECTION.all_reduce_time_s(mib, 8) == pytest.approx(30e-6 + mib / 70e9)
    assert SECTION.all_reduce_time_s(mib, 16) == pytest.approx(90e-6 + mib / 20e9)  # two nodes
    # 4 workers lie between the measured 2 and 8 on the same NVSwitch: half way in log2(workers)
    t2, t8 = 10e-6 + mib / 100e9, 30e-6 + mib / 70e9
    assert SECTION.all_reduce_time_s(mib, 4) == pytest.approx(0.5 * t2 + 0.5 * t8)
    # 6 workers: log2(6 / 4) / log2(8 / 4)... of the way from 2 to 8: log2(3) / 2
    f = np.log2(3) / 2
    assert SECTION.all_reduce_time_s(mib, 6) == pytest.approx((1 - f) * t2 + f * t8)
    # 2 workers on a section that measured only 8 (nothing below): borrowed, size term scaled
    # by the ring traffic 2(w-1)/w: 1.0 / 1.75
    only8 = SECTION.model_copy(update={"all_reduce": [one_line(8, 8, 30, 70)]})
    assert only8.all_reduce_time_s(mib, 2) == pytest.approx(30e-6 + (1.0 / 1.75) * mib / 70e9)
    # 32 workers span nodes: the across-node fit, scaled 2*31/32 over 2*15/16
    assert SECTION.all_reduce_time_s(mib, 32) == pytest.approx(90e-6 + (62 / 32) / (30 / 16) * mib / 20e9)
    # send/recv between pipeline stages sits inside a node
    assert SECTION.send_recv_time_s(mib) == pytest.approx(5e-6 + mib / 200e9)


def test_segments_must_end_open():
    bounded = SizeSegment(max_bytes=10, latency_us=1, bandwidth_gbps=1, rows=1, mape_pct=0)
    with pytest.raises(ValueError, match="only the last segment"):
        CollectiveFit(
            workers=2,
            devices_per_node=2,
            topology="nvswitch",
            fitted_on="x",
            rows=1,
            mape_pct=0,
            bias_pct=0,
            segments=[bounded],
        )


def test_roofline_prices_tp_allreduce_from_the_section():
    model = load_model("llama-7b")  # hidden 4096, 32 layers
    hw = load_hardware("a100-80gb-pcie").model_copy(update={"collectives": SECTION})
    cost = RooflineCostModel(model, hw, tensor_parallel=8)
    tokens = 64
    nbytes = tokens * 4096 * 2
    per_layer = 2 * (30e-6 + nbytes / 70e9)  # after attention and after the MLP
    assert cost.allreduce_time_s(np.float64(tokens)) == pytest.approx(per_layer, rel=1e-12)
    rows = {o.name: o for o in cost.breakdown(BatchShape.prefill([tokens]))}
    assert rows["allreduce"].total_time_s == pytest.approx(32 * per_layer, rel=1e-12)  # all layers
    assert cost.send_recv_time_s(nbytes) == pytest.approx(5e-6 + nbytes / 200e9)


def test_roofline_falls_back_to_the_interconnect_without_a_section():
    hw = load_hardware("a100-80gb-pcie")
    assert hw.collectives is None
    cost = RooflineCostModel(load_model("llama-7b"), hw, tensor_parallel=2)
    ic = hw.interconnect
    nbytes = 16 * 4096 * 2
    ring = 2 * (1 / 2) * nbytes / (ic.bandwidth_gbps * 1e9) + ic.latency_us * 1e-6
    assert cost.allreduce_time_s(np.float64(16)) == pytest.approx(2 * ring, rel=1e-12)
    assert cost.send_recv_time_s(nbytes) == pytest.approx(ic.latency_us * 1e-6 + nbytes / (ic.bandwidth_gbps * 1e9))


def test_a_setup_without_all_reduce_rows_prices_it_from_the_interconnect():
    a40 = load_hardware("a40")
    assert a40.collectives.setup == "a40_pairwise_nvlink" and not a40.collectives.all_reduce
    cost = RooflineCostModel(load_model("llama-7b"), a40, tensor_parallel=2)
    ic = a40.interconnect
    ring = (1 / 2) * 2 * 4096 * 2 / (ic.bandwidth_gbps * 1e9) + ic.latency_us * 1e-6
    assert cost.allreduce_time_s(np.float64(1)) == pytest.approx(2 * ring, rel=1e-12)


@pytest.mark.parametrize(
    "name, setup", [("a100-80gb-sxm", "a100_dgx"), ("h100-sxm", "h100_dgx"), ("a40", "a40_pairwise_nvlink")]
)
def test_shipped_sections_are_consistent_and_attributed(name, setup):
    section = load_hardware(name).collectives
    assert section.setup == setup and section.confidence == "measured"
    assert "microsoft/vidur" in section.source and "MIT License" in section.source
    for fit in section.all_reduce + section.send_recv:
        assert fit.rows == sum(s.rows for s in fit.segments)
        weighted = sum(s.mape_pct * s.rows for s in fit.segments) / fit.rows
        assert fit.mape_pct == pytest.approx(weighted, abs=2e-3)  # each rounded to 3 decimals


@pytest.mark.parametrize("name", ["a100-80gb-sxm", "h100-sxm", "a40"])
def test_shipped_sections_reproduce_their_fit_on_the_measured_table(name):
    shipped = load_hardware(name).collectives
    table = read_collectives_table(MEASURED_TABLE)
    refit = fit_collectives(table, shipped.setup, source=shipped.source)
    assert refit == shipped


def test_profile_writer_adds_then_replaces_the_collectives_block():
    head = "name: x\n# comment kept\nsource: y\n"
    block = {"collectives": SECTION.model_dump(mode="json")}
    once = with_sections(head, block)
    assert once.startswith(head) and once.count("collectives:") == 1
    again = with_sections(once, block)
    assert again == once
    assert CollectivesSection.model_validate(yaml.safe_load(once)["collectives"]) == SECTION
