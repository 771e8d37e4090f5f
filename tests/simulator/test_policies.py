"""Scheduling and preemption policies on hand-built states (no SimPy, no engine)."""

import pytest

from infersim.simulator.costmodel import RooflineCostModel
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.models.catalog import load_model
from infersim.simulator.policies import SchedulerLimits, build_scheduler
from infersim.simulator.policies.preemption import CostAwarePreemption
from infersim.simulator.policies.state import AllocStatus
from tests.utils import scheduler_state, seq


@pytest.fixture(scope="module")
def cost():
    return RooflineCostModel(load_model("opt-13b"), load_hardware("a800-80gb-pcie"))


def state(cost, waiting=(), running=(), swapped=(), free=100, free_cpu=50, total=100, now=10.0, **lim):
    return scheduler_state(
        cost,
        now_s=now,
        waiting=list(waiting),
        running=list(running),
        swapped=list(swapped),
        free_gpu_blocks=free,
        free_cpu_blocks=free_cpu,
        total_gpu_blocks=total,
        watermark_blocks=1,
        kv_bytes_per_block=16 * 819200.0,
        limits=SchedulerLimits(**lim),
    )


def test_admission_ok_later_never(cost):
    st = state(cost, total=10)
    assert st.admission(16 * 9, free_blocks=10) is AllocStatus.OK  # 9 blocks, 1 left = watermark
    assert st.admission(16 * 9, free_blocks=9) is AllocStatus.LATER
    assert st.admission(16 * 10, free_blocks=10) is AllocStatus.NEVER  # would eat the watermark of an empty pool


def test_fcfs_admits_prefix_and_stops_at_first_later(cost):
    w = [seq(0, 100, arrival=0), seq(1, 900, arrival=1), seq(2, 10, arrival=2)]
    d = build_scheduler("fcfs", "recompute").schedule(state(cost, waiting=w, free=40))
    assert d.admit == [w[0]]  # w[1] needs 57 blocks: LATER, and FCFS does not skip it
    assert d.batch == [(w[0], 100)]


def test_fcfs_no_new_prefill_while_something_is_swapped(cost):
    run = [seq(0, 32, generated=1, gpu=3)]
    d = build_scheduler("fcfs", "recompute").schedule(
        state(cost, waiting=[seq(1, 10)], running=run, swapped=[seq(2, 40, generated=3, cpu=3)], free=90)
    )
    assert not d.admit
    assert [s.rid for s in d.swap_in] == [2]
    assert sorted(s.rid for s, q in d.batch) == [0, 2] and all(q == 1 for _, q in d.batch)


def test_fcfs_preempts_latest_arrival_first(cost):
    # each running sequence sits at a block boundary and needs one new block; only one is free
    run = [seq(i, 16 * (i + 1), generated=1, arrival=float(i), gpu=i + 1) for i in range(3)]
    d = build_scheduler("fcfs", "recompute").schedule(state(cost, running=run, free=1))
    assert [(s.rid, m) for s, m in d.preempt] == [(2, "recompute")]
    assert sorted(s.rid for s, _ in d.batch) == [0, 1]


def test_fairness_picks_queue_with_higher_mean_priority(cost):
    sched = build_scheduler("fairness", "recompute")
    waiting = [seq(1, 100, arrival=9.0)]  # priority (10-9)/100 = 0.01
    swapped = [seq(2, 10, generated=2, arrival=0.0, cpu=1)]  # priority 10/12 = 0.83
    d = sched.schedule(state(cost, waiting=waiting, swapped=swapped, free=50))
    assert d.swap_in == swapped and not d.admit
    waiting = [seq(1, 5, arrival=0.0)]  # priority 10/5 = 2.0
    d = sched.schedule(state(cost, waiting=waiting, swapped=swapped, free=50))
    assert d.admit == waiting and not d.swap_in and d.batch == [(waiting[0], 5)]


def test_cost_aware_compares_swap_and_recompute_costs(cost):
    pol = CostAwarePreemption()
    st = state(cost)
    for tokens in (20, 200, 2000):
        s = seq(0, tokens, generated=1, gpu=-(-(tokens + 1) // 16))
        want = "swap" if pol.swap_cost_s(s, st) < pol.recompute_cost_s(s, st) else "recompute"
        assert pol.choose(s, st, free_cpu_blocks=1000) == want
        # by hand: blocks x block bytes over each direction's bandwidth, plus link latency
        nbytes = s.num_gpu_blocks * st.kv_bytes_per_block
        link = cost.hardware.host_link
        by_hand = nbytes / (link.d2h_gbps * 1e9) + nbytes / (link.h2d_gbps * 1e9) + 2 * link.latency_us * 1e-6
        assert pol.swap_cost_s(s, st) == pytest.approx(by_hand, rel=1e-12)
        assert pol.choose(s, st, free_cpu_blocks=0) == "recompute"  # CPU full: Algorithm 1 recomputes


def test_swap_only_stalls_when_cpu_full_and_recomputes_only_when_all_stall(cost):
    sched = build_scheduler("fcfs", "swap")
    run = [seq(i, 16, generated=1, arrival=float(i), gpu=1) for i in range(2)]  # both need a 2nd block
    d = sched.schedule(state(cost, running=run, free=0, free_cpu=0))
    assert [(s.rid, m) for s, m in d.preempt] == [(1, "recompute")]  # every sequence stalled: one forced
    run = [seq(0, 16, generated=1, gpu=1), seq(1, 20, generated=1, arrival=1.0, gpu=2)]  # 1 needs no block
    d = sched.schedule(state(cost, running=run, free=0, free_cpu=0))
    assert not d.preempt and [s.rid for s, _ in d.batch] == [1]
