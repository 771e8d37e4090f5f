"""`sim roofline` of data-parallel attention and of pipeline stages prices the step the simulator
charges: the table's iteration equals a simulated group step bit for bit (DP attention, with and
without two-batch overlap) and a simulated pipeline step to float rounding (the stage timeline
adds stage and hand-off times in turn, the table stages first), every row sums to it, and the
all-to-all rows match DeepEP's bytes worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from infersim.analysis.roofline import (
    Grid,
    build_layout_cost_model,
    iteration_table,
    operator_table,
    overlap_table,
    stage_table,
)
from infersim.simulator.costmodel import BatchShape
from infersim.simulator.metrics.collector import SERIES_COLUMNS
from infersim.simulator.simulation import Simulation
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import WorkloadSpec
from tests.utils import requests_section

COL = {c: i for i, c in enumerate(SERIES_COLUMNS)}
PROMPT = 512
PROFILE = "h100-sxm:datasheet"


def _simulate(**hardware):
    """DeepSeek-V2-Lite in bf16, one prompt of PROMPT tokens per replica (or per rank), all at t = 0."""
    replicas = hardware.get("replicas", 1)
    spec = WorkloadSpec.model_validate(
        {
            "model": "deepseek-v2-lite",
            "hardware": {"profile": PROFILE, **hardware},
            "serving": {"dtype": "bf16", "max_model_len": 4096},
            "requests": requests_section(replicas, PROMPT, 2),
            "seed": 3,
        }
    )
    sim = Simulation(spec, build_requests(spec, "."))
    return sim, sim.run().series


def _first_step(series: np.ndarray) -> tuple[float, float]:
    """(start, end) of the first iteration (every rank of a group records the same)."""
    first = series[np.argmin(series[:, COL["t_start_s"]])]
    return float(first[COL["t_start_s"]]), float(first[COL["t_end_s"]])


def _roofline(**layout):
    cost = build_layout_cost_model("deepseek-v2-lite", PROFILE, dtype="bf16", **layout)
    grid = Grid(["prefill"], [1], [PROMPT])
    return cost, operator_table(cost, grid), float(iteration_table(cost, grid)["iteration_time_s"].iloc[0])


@pytest.mark.parametrize("overlap", [False, True])
def test_dp_attention_iteration_is_the_simulated_group_step_bit_for_bit(overlap):
    sim, series = _simulate(replicas=2, expert_parallel=2, data_parallel_attention=True, two_batch_overlap=overlap)
    cost, ops, iteration_s = _roofline(dp_attention=2, two_batch_overlap=overlap)
    start, end = _first_step(series)
    assert end == start + iteration_s  # the group's prefill of one prompt per rank
    assert set(series[:2, COL["batch_tokens"]]) == {PROMPT}
    shape = BatchShape.prefill([PROMPT])
    if not overlap:  # the rows are the step, summed in another order
        assert math.fsum(ops["total_time_s"]) == pytest.approx(iteration_s, rel=1e-12)
        return
    # the overlap table's counted parts are the overlapped step, which the group runs
    parts = overlap_table(cost, shape)
    assert math.fsum(parts["total_time_s"].dropna()) == pytest.approx(iteration_s, rel=1e-12)
    assert iteration_s == cost.overlapped_step_s(shape)
    # the operator rows are the step without overlap; "on" splits it even where that is slower, as
    # here: two ranks in one node hide little of their all-to-alls, and each half reads the weights
    plain = build_layout_cost_model("deepseek-v2-lite", PROFILE, dtype="bf16", dp_attention=2)
    assert math.fsum(ops["total_time_s"]) == pytest.approx(plain.iteration_time_s(shape), rel=1e-12)
    assert iteration_s > plain.iteration_time_s(shape)


def test_pipeline_iteration_is_the_simulated_step_to_float_rounding():
    sim, series = _simulate(tensor_parallel=2, pipeline_parallel=2)
    cost, ops, iteration_s = _roofline(tensor_parallel=2, pipeline_parallel=2)
    start, end = _first_step(series)
    assert end - start == pytest.approx(iteration_s, rel=1e-12)  # one prompt through both stages alone
    assert iteration_s == sim.cost_model.iteration_time_s(BatchShape.prefill([PROMPT]))
    stages = stage_table(cost, BatchShape.prefill([PROMPT]))
    assert list(stages["layers"]) == ["0-13", "14-26"] and list(stages["sparse_layers"]) == [13, 13]
    for s, rows in ops.groupby("stage"):  # each stage's rows: its time and its hand-off
        expected = stages["stage_time_s"].iloc[s] + stages["handoff_time_s"].iloc[s]
        assert math.fsum(rows["total_time_s"]) == pytest.approx(expected, rel=1e-12)
    assert math.fsum(ops["total_time_s"]) == pytest.approx(iteration_s, rel=1e-12)
    # stage 0: the embedding, 14 layers (the first dense), their all-reduces and the hand-off of
    # 512 tokens x (hidden + residual) x 2 bytes; stage 1: 13 sparse layers and the LM head
    zero, one = ops[ops.stage == 0].set_index("operator"), ops[ops.stage == 1].set_index("operator")
    assert zero.loc["embedding", "count"] == 1 and "embedding" not in one.index
    assert zero.loc["input_norm", "count"] == 14 and zero.loc["gate_up_proj", "count"] == 1
    assert zero.loc["allreduce", "count"] == 14 and zero.loc["allreduce", "link"] == "node"
    assert zero.loc["handoff", "bytes"] == PROMPT * 2 * 2048 * 2
    assert one.loc["routed_experts", "count"] == 13 and "lm_head" in one.index and "lm_head" not in zero.index


H = 7168  # DeepSeek-V3's hidden size
DISPATCH_COPY = H + 4 * H / 128  # fp8 values and one float32 scale per 128 (DeepEP)
COMBINE_COPY = 2 * H  # bf16


@pytest.mark.parametrize(
    "ep,profile,link,copies,wire_copies,bandwidth,latency_s",
    [
        # one node: 7 of a token's 8 copies go to the 7 peers over NVLink 4 (450 GB/s, 10 us)
        (8, "h200:datasheet", "node", 7.0, 7.0, 450e9, 10e-6),
        # two nodes: 3.5 copies to the node's peers, 4 to the other node through the 50 GB/s
        # adapter, which sets the time (5 us a message)
        (16, "h100-sxm:datasheet", "node+network", 7.5, 4.0, 50e9, 5e-6),
    ],
)
def test_all_to_all_rows_by_hand(ep, profile, link, copies, wire_copies, bandwidth, latency_s):
    cost = build_layout_cost_model("deepseek-v3", profile, dtype="fp8", dp_attention=ep)
    ops = operator_table(cost, Grid(["decode"], [128], [1024])).set_index("operator")
    for name, per_copy in (("dispatch", DISPATCH_COPY), ("combine", COMBINE_COPY)):
        row = ops.loc[name]
        assert row["count"] == 58 and row["link"] == link and row["bound"] == "network"
        assert row["bytes"] == pytest.approx(128 * copies * per_copy, rel=1e-12)
        assert row["time_s"] == pytest.approx(latency_s + 128 * wire_copies * per_copy / bandwidth, rel=1e-12)
    # dispatch at EP 16: 128 x 7.5 x 7,392 B = 7.10 MB sent, 3,784,704 B of it through the adapter at 50 GB/s: 75.69408 + 5 us
    if ep == 16:
        assert ops.loc["dispatch", "bytes"] == 7_096_320 and ops.loc["dispatch", "time_s"] * 1e6 == pytest.approx(
            80.69408, abs=1e-9
        )
    # the experts run on the copies of the whole group's ep x 128 tokens
    experts = cost.group_experts.expert_time_s(ep * 128.0)
    assert ops.loc["routed_experts", "time_s"] == experts and ops.loc["routed_experts", "count"] == 58
