"""Pipeline parallelism and multi-node placement, checked against hand calculations: the
layer split, per-stage weights and KV pools, one batch through the stages, the steady-state
rate of a full pipeline, the links a placement crosses, and the event/step equality."""

from __future__ import annotations

import numpy as np
import pytest

from infersim.simulator.costmodel import RooflineCostModel
from infersim.simulator.costmodel.batch import BatchShape
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.models.catalog import load_model
from infersim.simulator.parallel.config import ClusterSection
from infersim.simulator.parallel.cost import PipelineCostModel
from infersim.simulator.parallel.memory import plan_pipeline_memory, stage_weight_bytes
from infersim.simulator.parallel.placement import Placement, check_parallel, stage_layers
from infersim.simulator.parallel.replica import StageTimeline
from infersim.simulator.simulation import simulate
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import HardwareSection, WorkloadSpec
from tests.utils import memory_options, poisson, requests_section


def placement(model, tp=1, pp=2, gpus_per_node=8) -> Placement:
    hw = HardwareSection(tensor_parallel=tp, pipeline_parallel=pp, cluster={"gpus_per_node": gpus_per_node})
    return check_parallel(model, hw)


def pipeline_cost(model_name="llama-2-7b", profile="a100-80gb-pcie", tp=1, pp=2, gpus_per_node=8):
    model, hw = load_model(model_name), load_hardware(profile)
    base = RooflineCostModel(model, hw, tensor_parallel=tp)
    return base, PipelineCostModel(base, placement(model, tp, pp, gpus_per_node))


@pytest.mark.parametrize(
    "layers, pp, split",
    [
        (32, 2, (16, 16)),
        (126, 2, (63, 63)),
        (61, 4, (15, 15, 16, 15)),  # vLLM: the remainder goes to the stages before the last
        (80, 3, (27, 27, 26)),
        (7, 7, (1,) * 7),
    ],
)
def test_stage_layers_follow_vllm(layers, pp, split):
    assert stage_layers(layers, pp) == split
    assert sum(split) == layers


def test_stage_times_add_up_to_the_roofline_and_the_handoff_is_datasheet_by_hand():
    base, cm = pipeline_cost()
    shape = BatchShape.prefill([512])
    stages, handoffs = cm.stage_times_s(shape)
    # tp 1: no all-reduce, so the stages together are the roofline's one-GPU iteration
    assert stages.sum() == pytest.approx(base.iteration_time_s(shape), rel=1e-12)
    # the hand-off: hidden state + residual, 512 x 4096 x 2 bytes each, over PCIe 4.0 peer to peer
    nbytes = 2 * 512 * 4096 * 2
    ic = base.hardware.interconnect
    assert handoffs[0] == pytest.approx(ic.latency_us * 1e-6 + nbytes / (ic.bandwidth_gbps * 1e9), rel=1e-12)
    assert cm.iteration_time_s(shape) == pytest.approx(stages.sum() + handoffs[0], rel=1e-12)
    # the last stage holds the LM head: its kernels are the slower; stage 0 adds the engine
    # overhead per iteration (vLLM's scheduling runs before the first stage)
    assert stages[1] > stages[0] - base.iteration_overhead_s


def test_learned_positions_run_on_the_first_stage():
    """OPT-1.3B's position embedding runs before its first layer: the stages still add up to the
    roofline's iteration, and the first stage holds it."""
    base, cm = pipeline_cost("opt-1.3b")
    shape = BatchShape.decode([100] * 8)
    stages, _ = cm.stage_times_s(shape)
    assert stages.sum() == pytest.approx(base.iteration_time_s(shape), rel=1e-12)
    rows = {o.name: o.time_s for o in base.breakdown(shape)}
    layer_s = sum(o.time_s * o.count for o in base.breakdown(shape) if o.name in {x.name for x in base.layer_ops})
    first = layer_s / 2 + rows["embedding"] + rows["position_embedding"] + base.iteration_overhead_s
    assert stages[0] == pytest.approx(first, rel=1e-12)


def test_decode_stage_times_equal_stepping_one_by_one():
    _, cm = pipeline_cost(pp=4)
    ctx = np.array([100, 250, 31])
    stages, handoffs = cm.decode_stage_times_s(ctx, 5)
    for j in range(5):
        s, h = cm.stage_times_s(BatchShape.decode(ctx + j))
        assert np.array_equal(stages[:, j], s) and np.array_equal(handoffs[:, j], h)
    assert np.array_equal(
        cm.decode_step_times_s(ctx, 5), [cm.iteration_time_s(BatchShape.decode(ctx + j)) for j in range(5)]
    )


def test_stage_timeline_by_hand():
    """Two virtual engines on stages of 1.0 and 1.5 s with a 0.1 s hand-off, each issuing its
    next batch when its last leaves: after the start, stage 1 (the slower) never idles."""
    tl = StageTimeline(2)
    assert tl.reserve(0.0, [1.0, 1.5], [0.0, 0.1], 0) == 2.6  # s0 [0, 1], s1 [1.1, 2.6]
    assert tl.reserve(0.0, [1.0, 1.5], [0.0, 0.1], 1) == 4.1  # s0 [1, 2], s1 waits for 2.6
    assert tl.reserve(2.6, [1.0, 1.5], [0.0, 0.1], 0) == 5.6  # s0 [2.6, 3.6], s1 [4.1, 5.6]
    assert tl.reserve(4.1, [1.0, 1.5], [0.0, 0.1], 1) == 7.1
    assert list(tl.end_s[1::2]) == [2.6, 4.1, 5.6, 7.1]  # one batch per 1.5 s: 1 / max stage time
    assert tl.busy_s() == [4.0, 6.0]
    assert list(tl.columns()["virtual_engine"]) == [0, 0, 1, 1, 0, 0, 1, 1]
    assert tl.active_total_s() == 7.1


def workload(
    pp=2,
    tp=1,
    count=1,
    prompt=200,
    output=20,
    profile="a100-80gb-pcie",
    model="llama-2-7b",
    arrival=None,
    **hw,
):
    """`count` requests of `prompt` and `output` tokens, all at t = 0 unless `arrival` says
    otherwise, on `model` split over `pp` stages of `tp` GPUs; `hw` are further hardware fields."""
    return WorkloadSpec.model_validate(
        {
            "model": model,
            "hardware": {"profile": profile, "pipeline_parallel": pp, "tensor_parallel": tp, **hw},
            "requests": requests_section(count, prompt, output, arrival),
        }
    )


def run(spec, **kw):
    return simulate(spec, build_requests(spec, "."), **kw)


def test_one_request_takes_every_stage_and_handoff_each_step():
    spec = workload(count=1, prompt=200, output=20)
    res = run(spec)
    _, cm = pipeline_cost()
    t = cm.iteration_time_s(BatchShape.prefill([200]))
    first_token = t
    for j in range(19):  # 19 decode steps after the prefill's token
        t += cm.iteration_time_s(BatchShape.decode([200 + j]))
    assert res.requests["first_token_s"][0] == pytest.approx(first_token, rel=1e-12)
    assert res.requests["finish_s"][0] == pytest.approx(t, rel=1e-12)
    # one batch in flight: each stage is busy about half the time
    rep = res.extra["pipeline"]["replicas"][0]
    assert rep["active_s"] == pytest.approx(t, rel=1e-12)
    assert 0.45 < rep["bubble_fraction"] < 0.55


def test_steady_stream_runs_at_the_slowest_stage():
    """Many decodes in two virtual engines: the slowest stage is (almost) never idle, and the
    decode rate is one batch per max stage time."""
    spec = workload(count=64, prompt=16, output=400)
    res = run(spec)
    rep = res.extra["pipeline"]["replicas"][0]
    assert max(rep["stage_utilization"]) > 0.98
    _, cm = pipeline_cost()
    # 32 sequences per virtual engine at a middle context
    stages, _ = cm.stage_times_s(BatchShape.decode(np.full(32, 16 + 200)))
    tokens_per_s = 64 * 400 / res.sim_time_s
    assert tokens_per_s == pytest.approx(32 / stages.max(), rel=0.03)


@pytest.mark.parametrize(
    "spec",
    [
        workload(pp=4, count=80, arrival=poisson(20.0), prompt=300, output=120),
        # two replicas: each conductor's horizon is the other's next event too
        workload(pp=2, count=60, arrival=poisson(30.0), prompt=200, output=90, replicas=2, router="least_outstanding"),
        # closed loop: requests arrive when others finish, at the end of a decode run
        workload(pp=3, count=50, prompt=150, output=60, arrival={"type": "closed_loop", "clients": 7}),
    ],
    ids=["open-loop", "two-replicas", "closed-loop"],
)
def test_event_and_step_mode_identical_with_pipeline(spec):
    a, b = run(spec), run(spec, step_mode=True)
    for col in a.requests:
        assert np.array_equal(a.requests[col], b.requests[col], equal_nan=True), col
    assert a.extra == b.extra


def test_stage_memory_by_hand():
    model = load_model("llama-2-7b")
    p = placement(model, tp=1, pp=2)
    w = stage_weight_bytes(model, p, "fp16")
    assert sum(w) == pytest.approx(model.weight_bytes_per_gpu(1, "fp16"), rel=1e-12)
    # stage 0: 16 layers + the embedding; the last: 16 layers + final norm + LM head (same size here)
    layer = model.params_per_layer() * 2
    assert w[0] == 16 * layer + model.params_embedding() * 2
    hw = load_hardware("a100-80gb-pcie")
    opts = memory_options()
    plan, account = plan_pipeline_memory(model, hw, opts, p)
    block = 16 * 2 * 16 * 4096 * 2  # tokens x K,V x 16 layers x hidden x 2 bytes
    assert plan.kv_bytes_per_block == block
    # 79.25 GiB visible x 0.9, less vLLM's 0.25 GiB non-torch reserve
    usable = 79.25 * 2**30 * 0.9 - 0.25 * 2**30
    assert plan.gpu_blocks == min(int((usable - wi - plan.activation_bytes_per_gpu) // block) for wi in w)
    assert plan.cpu_blocks == int(4 * 2**30 // block)
    # PP 2 roughly doubles the blocks one GPU holds (half the layers, half the weights)
    assert account["stage_gpu_blocks_fit"][0] > 2 * 0.9 * (usable - model.weight_bytes(None)) / (2 * block)


def test_placement_on_nodes():
    model = load_model("llama-2-70b")
    p = placement(model, tp=8, pp=2)
    assert p.nodes == 2 and not p.tp_crosses_nodes and p.boundary_crosses_nodes(0)
    p = placement(model, tp=4, pp=4)
    assert [p.boundary_crosses_nodes(s) for s in range(3)] == [False, True, False]
    p = placement(model, tp=16, pp=1)
    assert p.tp_crosses_nodes and p.staged and p.tp_devices_per_node == 8
    p = placement(model, tp=8, pp=2, gpus_per_node=16)
    assert p.nodes == 1 and not p.boundary_crosses_nodes(0)


def test_cross_node_links_use_the_measured_rows():
    # H100 DGX: send/recv between two nodes was measured (2 workers, 1 per node)
    base, cm = pipeline_cost("llama-2-70b", "h100-sxm", tp=8, pp=2)
    fit = next(f for f in base.hardware.collectives.send_recv if f.devices_per_node == 1)
    nbytes = 2 * 100 * 8192 * 2
    assert cm.handoff_times_from_tokens(100)[0, 0] == float(fit.time_s(nbytes))
    assert "measured" in cm.links.sources["stage_handoff_across_nodes"]
    # inside one 16-GPU node the same boundary is an NVSwitch hop
    _, cm16 = pipeline_cost("llama-2-70b", "h100-sxm", tp=8, pp=2, gpus_per_node=16)
    assert cm16.handoff_times_from_tokens(100)[0, 0] == float(base.send_recv_time_s(nbytes))
    # A100 DGX measured a 16-worker all-reduce over two nodes: TP 16 uses it
    base, cm = pipeline_cost("llama-2-70b", "a100-80gb-sxm", tp=16, pp=1)
    fit = next(f for f in base.hardware.collectives.all_reduce if f.workers == 16)
    assert float(cm.links.allreduce_pair_time_s(64)) == 2 * float(fit.time_s(64 * 8192 * 2))
    # no such row on H100: the 8 GPUs' all-reduce inside a node, two network hops at the
    # measured zero-byte send/recv between nodes and a ring through the 50 GB/s adapters
    base, cm = pipeline_cost("llama-2-70b", "h100-sxm", tp=16, pp=1)
    coll = base.hardware.collectives
    nbytes = 64 * 8192 * 2
    hop = next(f for f in coll.send_recv if f.devices_per_node == 1).segments[0].latency_us * 1e-6
    one = float(coll.all_reduce_time_s(nbytes, 8)) + 2 * hop + 2 * 15 / 16 * nbytes / 50e9
    assert float(cm.links.allreduce_pair_time_s(64)) == pytest.approx(2 * one, rel=1e-12)


def test_an_all_reduce_across_nodes_costs_more_than_inside_one():
    """Llama-3.1-405B at TP 16 on two 8-GPU H100 nodes, one decode token: the 32 KB all-reduce
    takes the measured 8-GPU NVSwitch all-reduce (23.6 us), two hops between nodes at the
    measured zero-byte send/recv (17.7 us each) and 2 x 15/16 x 32,768 B at 50 GB/s (1.2 us):
    60.2 us, never less than the 8-GPU all-reduce alone at any size."""
    base, cm = pipeline_cost("llama-3.1-405b", "h100-sxm", tp=16, pp=1)
    within = base.hardware.collectives.all_reduce_time_s(np.array([32768.0]), 8)
    assert float(within[0]) == pytest.approx(23.6e-6, abs=0.05e-6)
    assert float(cm.links.allreduce_pair_time_s(1)) / 2 == pytest.approx(60.2e-6, abs=0.1e-6)
    tokens = np.array([1.0, 16, 256, 4096])
    inside = 2 * base.hardware.collectives.all_reduce_time_s(tokens * 16384 * 2, 8)
    assert np.all(cm.links.allreduce_pair_time_s(tokens) > inside)


def test_datasheet_inter_node_link_without_measurements():
    _, cm = pipeline_cost("llama-2-70b", "h200", tp=8, pp=2)
    link = ClusterSection().inter_node
    nbytes = 2 * 10 * 8192 * 2
    assert cm.handoff_times_from_tokens(10)[0, 0] == pytest.approx(
        link.latency_us * 1e-6 + nbytes / (link.bandwidth_gbps * 1e9), rel=1e-12
    )


@pytest.mark.parametrize(
    "hw, needle",
    [
        ({"pipeline_parallel": 33}, "33 stages exceed llama-2-7b's 32 layers"),
        ({"tensor_parallel": 4, "cluster": {"gpus_per_node": 6}}, "neither divides hardware.cluster.gpus_per_node 6"),
    ],
)
def test_bad_splits_refused_in_one_line(hw, needle):
    model = load_model("llama-2-7b")
    with pytest.raises(InfersimError, match=needle) as exc:
        check_parallel(model, HardwareSection(**hw), source="wl.yaml")
    assert "wl.yaml: field 'hardware." in str(exc.value) and "\n" not in str(exc.value)


def test_a_stage_that_does_not_fit_is_refused():
    spec = workload(model="llama-2-70b", profile="a100-40gb", pp=2, count=1)
    with pytest.raises(InfersimError, match="field 'hardware.pipeline_parallel': stage 0 of 2"):
        run(spec)
    run(workload(model="llama-2-70b", profile="a100-40gb", pp=8, count=1))  # 10 layers a stage fit


def test_pipeline_refuses_speculation_and_other_cost_models():
    spec = workload(count=1)
    bad = spec.model_copy(update={"serving": spec.serving.model_copy(update={"cost_model": "regression"})})
    with pytest.raises(InfersimError, match="roofline cost model only"):
        run(bad)


def test_pipeline_refuses_what_its_stages_do_not_model():
    """Its replicas keep plain block pools (no prefix cache), and a disaggregated deployment
    gives its parallelism per pool: each refused in one line. A mixture of experts runs."""
    moe = workload(model="mixtral-8x7b", profile="h100-sxm", tp=2, count=1)
    assert run(moe).requests["finish_s"][0] > 0
    spec = workload(count=1)
    cached = spec.model_copy(update={"serving": spec.serving.model_copy(update={"prefix_caching": True})})
    with pytest.raises(InfersimError, match="does not combine with serving.prefix_caching"):
        run(cached)
    with pytest.raises(ValueError, match="pipeline_parallel stays 1"):
        HardwareSection(pipeline_parallel=2, disaggregated={})
