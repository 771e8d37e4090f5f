"""The ranks of a data-parallel-attention group step in lockstep (parallel/dp_group.py): an idle
rank waits for a busy one, balanced ranks cost what one rank alone is priced at, a long prompt
on one rank stalls its peer's decode, and event jumping equals stepping. Two ranks of
DeepSeek-V2-Lite (64 experts, 6 per token, 26 of 27 layers sparse) in bf16 on H100s."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from infersim.simulator.costmodel import BatchShape
from infersim.simulator.metrics.collector import SERIES_COLUMNS
from infersim.simulator.simulation import Simulation
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.requests import Requests
from infersim.simulator.workload.schema import WorkloadSpec
from tests.utils import poisson, requests_section

COL = {c: i for i, c in enumerate(SERIES_COLUMNS)}
TO_RANK_0 = SimpleNamespace(route=lambda seq, replicas: 0)


def two_ranks(requests: dict | None = None, **serving) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {
            "model": "deepseek-v2-lite",
            "hardware": {
                "profile": "h100-sxm:datasheet",
                "replicas": 2,
                "expert_parallel": 2,
                "data_parallel_attention": True,
            },
            "serving": {"dtype": "bf16", "max_model_len": 8192, **serving},
            "requests": requests or requests_section(1, 1, 1),
            "seed": 7,
        }
    )


def run(spec, requests: Requests | None = None, *, step_mode=False, router=None, mean_model=False):
    """Simulate; `mean_model` lets every rank run its own loop, priced as if its peers ran its
    batch (the model before lockstep)."""
    sim = Simulation(spec, requests if requests is not None else build_requests(spec, "."), step_mode=step_mode)
    if router is not None:
        sim.router = router
    if mean_model:
        sim.loops = []
    return sim, sim.run()


def rows(series: np.ndarray, rank: int) -> np.ndarray:
    return series[series[:, COL["replica"]] == rank]


def test_an_idle_rank_steps_with_a_busy_one_priced_by_hand():
    """Rank 0 decodes 32 sequences, rank 1 has none and runs 1-token dummy passes. The group's
    step: rank 0's own attention and dense work (its step as a balanced rank, less the 26 sparse
    layers' routed parts), plus per sparse layer the experts on the group's 32 x 6 copies and a
    dispatch and combine of 32 tokens."""
    cm = Simulation(two_ranks(), build_requests(two_ranks(), ".")).cost_model
    m, a2a, experts = cm.base.model.moe_layers, cm.all_to_all, cm.group_experts
    busy = BatchShape.decode([1000] * 32)
    balanced_routed = a2a.dispatch_time_s(32) + experts.expert_time_s(64) + a2a.combine_time_s(32)
    own = cm.iteration_time_s(busy) - m * balanced_routed
    hand = own + m * (a2a.dispatch_time_s(32) + experts.expert_time_s(32) + a2a.combine_time_s(32))
    assert m == 26
    assert cm.group_iteration_time_s([busy, None]) == pytest.approx(hand, rel=1e-12)
    assert cm.group_iteration_time_s([None, busy]) == cm.group_iteration_time_s([busy, None])
    # the dummy pass's own work (one token, no cache) is shorter: the busy rank sets the time
    dummy_routed = a2a.dispatch_time_s(1) + experts.expert_time_s(2) + a2a.combine_time_s(1)
    assert cm.iteration_time_s(BatchShape.of([1], [0])) - m * dummy_routed < own


@pytest.mark.parametrize("step_mode", [False, True])
def test_a_lone_busy_rank_runs_at_the_group_clock(step_mode):
    """32 requests of 200 + 8 tokens all on rank 0: one prefill of 6,400 tokens, then 7 decode
    steps, each as long as the group's step with rank 1 idle; rank 1 records nothing."""
    spec = two_ranks()
    reqs = Requests(np.full(32, 200), np.full(32, 8), np.zeros(32))
    sim, res = run(spec, reqs, step_mode=step_mode, router=TO_RANK_0)
    cm = sim.cost_model
    t = cm.group_iteration_time_s([BatchShape.prefill([200] * 32), None])
    assert np.all(res.requests["first_token_s"] == t)
    for j in range(7):
        t += cm.group_iteration_time_s([BatchShape.decode([200 + j] * 32), None])
    assert np.all(res.requests["finish_s"] == pytest.approx(t, rel=1e-12))
    assert rows(res.series, 1).size == 0 and np.all(res.requests["replica"] == 0)


def test_balanced_ranks_cost_what_the_mean_model_priced():
    """Equal batches on every rank: the lockstep step is bit for bit one rank's step priced as if
    its peers ran the same batch, for prefills, decodes and decode stretches; a run of identical
    requests split evenly gives the same timestamps either way."""
    spec = two_ranks(requests_section(8, 300, 50))
    cm = Simulation(spec, build_requests(spec, ".")).cost_model
    for shape in (BatchShape.prefill([300] * 4), BatchShape.decode([300, 310, 320, 330])):
        assert cm.group_iteration_time_s([shape, shape]) == cm.iteration_time_s(shape)
    ctx = np.array([300, 310, 320, 330])
    assert np.array_equal(cm.group_decode_step_times_s([ctx, ctx], 40), cm.decode_step_times_s(ctx, 40))
    _, lock = run(spec)
    _, mean = run(spec, mean_model=True)
    for col in lock.requests:
        assert np.array_equal(lock.requests[col], mean.requests[col]), col


def test_a_long_prompt_on_one_rank_stalls_the_other_ranks_decode():
    """Rank 0 decodes one request (100 + 40 tokens); at 50 ms a 6,000-token prompt reaches rank 1.
    In lockstep rank 1's prefill starts at rank 0's next step boundary, the two ranks' steps end
    together, and rank 0's inter-token latency rises to the prefill's step; priced as before, each
    rank on its own, rank 0 never waits."""
    spec = two_ranks()
    reqs = Requests(np.array([100, 6000]), np.array([40, 1]), np.array([0.0, 0.05]))
    sim, lock = run(spec, reqs, step_mode=True)
    cm = sim.cost_model
    r0, r1 = rows(lock.series, 0), rows(lock.series, 1)
    assert len(r1) == 1
    stalled = r0[r0[:, COL["t_start_s"]] == r1[0, COL["t_start_s"]]]
    assert len(stalled) == 1 and stalled[0, COL["t_end_s"]] == r1[0, COL["t_end_s"]]
    step_s = np.diff(r0[:, [COL["t_start_s"], COL["t_end_s"]]], axis=1).ravel()
    prefill_s = r1[0, COL["t_end_s"]] - r1[0, COL["t_start_s"]]
    decode_s = np.median(step_s[1:])
    assert step_s.max() == prefill_s and prefill_s > 20 * decode_s
    # the stalled step: the group's, rank 0 decoding and rank 1 prefilling
    j = int(np.argmax(step_s))  # rank 0's j-th iteration: the prefill, then decode j - 1 at context 100 + j - 1
    assert step_s[j] == pytest.approx(
        cm.group_iteration_time_s([BatchShape.decode([100 + j - 1]), BatchShape.prefill([6000])]), rel=1e-12
    )
    _, mean = run(spec, reqs, step_mode=True, mean_model=True)
    m0 = rows(mean.series, 0)
    mean_step_s = np.diff(m0[:, [COL["t_start_s"], COL["t_end_s"]]], axis=1).ravel()
    assert mean_step_s[1:].max() < 1.5 * decode_s  # rank 0 never waited for rank 1
    # it finishes later by the stall, less what its other steps gain from an idle peer (the
    # experts see its own copies only, not twice them)
    late_s = lock.requests["finish_s"][0] - mean.requests["finish_s"][0]
    assert 0.5 * (step_s[j] - mean_step_s[j]) < late_s < step_s[j] - mean_step_s[j]


def _skewed(**serving) -> WorkloadSpec:
    return two_ranks(requests_section(40, (50, 3000), (10, 200), poisson(20.0)), **serving)


@pytest.mark.parametrize("serving", [{}, {"chunked_prefill": True, "max_batched_tokens": 512}])
def test_event_jumping_equals_stepping_for_a_group(serving):
    spec = _skewed(**serving)
    _, a = run(spec)
    _, b = run(spec, step_mode=True)
    for col in a.requests:
        assert np.array_equal(a.requests[col], b.requests[col], equal_nan=True), col
    assert a.sim_time_s == b.sim_time_s
    assert a.metrics.counters["iterations"] == b.metrics.counters["iterations"]
    assert a.metrics.counters["segments"] < b.metrics.counters["segments"]  # it did jump


def test_same_seed_same_results_bit_for_bit():
    spec = _skewed(chunked_prefill=True, max_batched_tokens=512)
    (_, a), (_, b) = run(spec), run(spec)
    for col in a.requests:
        assert np.array_equal(a.requests[col], b.requests[col], equal_nan=True), col
    assert np.array_equal(a.series, b.series)
