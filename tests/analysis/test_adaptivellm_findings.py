"""AdaptiveLLM's claims that the simulator reproduces, on a small version of its setup:
OPT-13B on an A800, the chatbot workload cut to 300 requests, max output 64, 128 GPU + 64 CPU
KV blocks. The full study (all models, datasets, max outputs) is
`python -m infersim.analysis.reproduce.adaptivellm`; docs/findings/adaptivellm.md explains the claims
left out here: recompute-only beating swap-only and the size of the gains over vLLM_s (the
simulator does not show them), and the full AdaptiveLLM (cost_aware+fairness) beating vLLM on
throughput (it does only on chatbot at max output 64, by ~2%, and loses elsewhere).

The second half checks the swap path that finding rests on: vLLM 0.2 copies a swap block by
block and layer by layer, the cost model prices such a stream of copies, the engine charges it,
and the two readings of swap-only with a full CPU pool behave as documented."""

from types import SimpleNamespace

import numpy as np
import pytest

from infersim.analysis.reproduce.adaptivellm import (
    _COL,
    CONFIGS,
    PAPER_TABLE3,
    PAPER_TABLE4,
    _hardware_variants,
    simulate_point,
    task,
)
from infersim.simulator.costmodel import RooflineCostModel
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.models.catalog import load_model
from infersim.simulator.policies import build_scheduler
from infersim.simulator.policies.preemption import CostAwarePreemption
from infersim.simulator.simulation import Simulation
from tests.utils import scheduler_state, seq

N_REQUESTS = 300


@pytest.fixture(scope="module")
def runs():
    return {c: simulate_point(task("test", "opt-13b", "chatbot", 64, c, count=N_REQUESTS)) for c in CONFIGS}


def test_every_request_finishes(runs):
    for c, r in runs.items():
        assert r["finished"] == N_REQUESTS and r["aborted"] == 0, c


def test_cost_aware_preemption_beats_recompute_only(runs):
    """Table 3, left numbers: AdaptiveLLM (Algorithm 1) over vLLM. Smaller here (~1.12x) than
    the paper's 1.38x, but a real gain, and for the paper's reason: far fewer recomputations."""
    ca, v = runs["cost_aware_fcfs"], runs["vllm"]
    assert ca["throughput_tok_s"] > 1.05 * v["throughput_tok_s"]
    assert ca["throughput_req_s"] > v["throughput_req_s"]
    assert ca["recomputed_tokens"] < 0.25 * v["recomputed_tokens"]
    assert ca["prefill_iters"] < v["prefill_iters"]


def test_cost_aware_beats_swap_only_on_chatbot(runs):
    """Table 3, right numbers, in direction only (the paper's 2.46x is not reproduced): the
    cost-aware choice recomputes when the CPU pool is full instead of stalling."""
    ca, s = runs["cost_aware_fcfs"], runs["vllm_s"]
    assert ca["throughput_tok_s"] > s["throughput_tok_s"]
    assert s["preempt_recompute"] == s["preempt_forced"]  # swap-only recomputes only when forced
    assert ca["preempt_forced"] == 0


def test_cost_aware_mostly_swaps_and_recomputes_far_less_than_vllm(runs):
    """Table 4's pattern: AdaptiveLLM makes mostly swaps and a few recomputations (OPT-13B
    chatbot: 0.11k recomputes, 1.13k swaps), vLLM only recomputations (1.77k)."""
    paper_rc, paper_sw, paper_vllm_rc, _ = PAPER_TABLE4[("opt-13b", "chatbot")]
    assert paper_sw > 5 * paper_rc and paper_vllm_rc > 10 * paper_rc
    ca, v = runs["cost_aware_fcfs"], runs["vllm"]
    assert ca["preempt_swap"] > 5 * ca["preempt_recompute"]
    assert v["preempt_recompute"] > 5 * ca["preempt_recompute"]
    assert v["preempt_swap"] == 0


def test_fairness_lowers_mean_weighted_turnaround(runs):
    """Section 4.4 / Figure 8: Algorithm 2 lowers mean weighted turnaround (eq. 5) against
    FCFS, with either preemption policy, and the full AdaptiveLLM beats both baselines."""
    wt = {c: r["weighted_turnaround_mean"] for c, r in runs.items()}
    assert wt["cost_aware_fairness"] < 0.8 * wt["cost_aware_fcfs"]
    assert wt["recompute_fairness"] < 0.8 * wt["vllm"]
    assert wt["cost_aware_fairness"] < 0.8 * min(wt["vllm"], wt["vllm_s"])
    # fairness starts requests sooner: that is what eq. 5 rewards
    assert runs["cost_aware_fairness"]["queueing_mean_s"] < runs["cost_aware_fcfs"]["queueing_mean_s"]


# ---- the swap path behind "swap-only is not slower than recompute-only" -----------------


@pytest.fixture(scope="module")
def opt13b():
    return RooflineCostModel(load_model("opt-13b"), load_hardware("a800-80gb-pcie"))


def test_swap_copy_stream_is_bandwidth_or_issue_bound(opt13b):
    """A swap issued as many async copies runs at the slower of the link's bandwidth and the
    host's cost per copy, after one latency. OPT-13B's per-layer K/V block is 164 KB, above
    the 4 us x 25.2 GB/s = 101 KB where the two meet: its swaps run at the link's rate."""
    link = opt13b.hardware.host_link
    m = opt13b.model
    block_bytes = m.bytes_kv_per_block(16, "fp16")
    per_copy = block_bytes / (2 * m.num_layers)
    assert per_copy == 16 * m.kv_dim * 2  # 16 tokens x 5120 values x 2 bytes
    nbytes, copies = 5 * block_bytes, 5 * 2 * m.num_layers
    by_hand = link.latency_us * 1e-6 + max(nbytes / (link.d2h_gbps * 1e9), copies * link.copy_issue_us * 1e-6)
    assert opt13b.kv_transfer_time_s(nbytes, "d2h", copies) == pytest.approx(by_hand, rel=1e-12)
    assert per_copy > link.copy_issue_us * 1e-6 * link.d2h_gbps * 1e9  # bandwidth-bound ...
    assert opt13b.kv_transfer_time_s(nbytes, "d2h", copies) == pytest.approx(opt13b.transfer_time_s(nbytes, "d2h"))
    # ... while the same bytes as 8x more, 8x smaller copies (a GQA model's 20-KB blocks) are issue-bound
    small = opt13b.kv_transfer_time_s(nbytes, "d2h", 8 * copies)
    assert small == pytest.approx(link.latency_us * 1e-6 + 8 * copies * link.copy_issue_us * 1e-6, rel=1e-12)
    assert small > 1.5 * opt13b.transfer_time_s(nbytes, "d2h")
    assert opt13b.kv_transfer_time_s(0.0, "h2d", 10) == 0.0


def test_cost_aware_prices_the_swap_as_the_engine_copies_it(opt13b):
    """Algorithm 1's swap estimate uses the same copy count as the engine (2 x layers per
    block when the state carries it, one copy per sequence when it does not)."""
    pol = CostAwarePreemption()
    s = seq(0, 70, generated=10, gpu=5)  # 80 tokens, 79 of them computed
    kvb = opt13b.model.bytes_kv_per_block(16, "fp16")

    def st(copies_per_block):
        return scheduler_state(
            opt13b,
            running=[s],
            free_gpu_blocks=0,
            free_cpu_blocks=64,
            total_gpu_blocks=128,
            watermark_blocks=1,
            kv_bytes_per_block=kvb,
            kv_copies_per_block=copies_per_block,
        )

    link = opt13b.hardware.host_link
    huge = 1e9  # copies per block: makes the per-copy floor dominate, to see it used
    expect = 2 * (link.latency_us * 1e-6 + 5 * huge * link.copy_issue_us * 1e-6)
    assert pol.swap_cost_s(s, st(huge)) == pytest.approx(expect, rel=1e-12)
    one = 2 * (link.latency_us * 1e-6 + 5 * kvb / (link.d2h_gbps * 1e9))
    assert pol.swap_cost_s(s, st(None)) == pytest.approx(one, rel=1e-12)
    assert pol.swap_cost_s(s, st(80)) == pytest.approx(one, rel=1e-12)  # OPT-13B: bandwidth-bound


def test_engine_charges_each_swap_as_its_copies(tmp_path):
    """With a host cost per copy large enough to dominate, the time the engine spends on the
    host link equals, iteration by iteration, latency + copies x cost per copy for each
    direction, copies = swapped blocks x 2 x layers."""
    t = task("test", "opt-13b", "chatbot", 64, "vllm_s", count=120, copy_us=200.0)
    _hardware_variants([t], tmp_path)
    from infersim.analysis.reproduce.adaptivellm import build_spec
    from infersim.simulator.workload.builder import build_requests

    spec, path = build_spec(t)
    sim = Simulation(spec, build_requests(spec, path))
    res = sim.run()
    S = res.series
    link = sim.hardware.host_link
    assert link.copy_issue_us == 200.0
    kvb, per_block = sim.memory.kv_bytes_per_block, sim.kv_copies_per_block
    assert per_block == 2 * sim.model.num_layers
    expect = 0.0
    for col in ("swap_out_bytes", "swap_in_bytes"):
        nbytes = S[:, _COL[col]]
        blocks = np.round(nbytes / kvb)
        assert np.allclose(blocks * kvb, nbytes)  # whole blocks only
        moved = nbytes > 0
        expect += float(
            np.sum(
                link.latency_us * 1e-6
                + np.maximum(nbytes[moved] / (link.d2h_gbps * 1e9), blocks[moved] * per_block * 200e-6)
            )
        )
    assert expect > 0
    busy = float(np.sum(S[:, _COL["t_end_s"]] - S[:, _COL["t_start_s"]]))
    assert res.sim_time_s - busy == pytest.approx(expect, rel=1e-9)  # burst arrivals: never idle


def test_paper_counts_rule_out_the_cost_of_swapping():
    """The paper's own numbers: AdaptiveLLM swapped more often than vLLM_s in every Table 4
    group yet ran 1.64-2.55x faster than it (Table 3), so vLLM_s's loss was not swap time."""
    for k, (_, a_sw, _, s_sw) in PAPER_TABLE4.items():
        assert a_sw > s_sw, k
        assert PAPER_TABLE3[k][1] > 1.6, k


def test_swap_only_keeps_its_batch_here(runs):
    """The paper explains vLLM_s's loss by smaller batches under the CPU limit; here swap-only's
    decode batch stays close to recompute-only's (documented non-reproduction)."""
    s, v = runs["vllm_s"], runs["vllm"]
    assert s["mean_decode_batch"] > 0.8 * v["mean_decode_batch"]
    assert s["throughput_tok_s"] > 0.9 * v["throughput_tok_s"]  # nowhere near the paper's 0.56


def test_swap_tail_stalls_the_rest_of_the_queue(opt13b):
    """`swap_tail`: once a victim does not fit on the CPU, the sequence that needed a block and
    every lower-priority one sit the iteration out; `swap` stalls only that one sequence."""
    kvb = opt13b.model.bytes_kv_per_block(16, "fp16")

    def seq(rid, blocks):
        n = 16 * blocks  # last block full: the next token needs a new block
        return SimpleNamespace(
            rid=rid,
            prompt_len=n - 1,
            generated=1,
            arrival_s=float(rid),
            first_enqueue_s=0.0,
            computed=n,
            num_gpu_blocks=blocks,
            num_cpu_blocks=0,
            num_tokens=n + 1,
        )

    running = [seq(0, 2), seq(1, 3), seq(2, 2), seq(3, 4)]

    def decide(policy):
        st = scheduler_state(
            opt13b,
            now_s=1.0,
            running=list(running),
            free_gpu_blocks=1,
            free_cpu_blocks=0,
            total_gpu_blocks=12,
            watermark_blocks=0,
            kv_bytes_per_block=kvb,
        )
        return build_scheduler("fcfs", policy).schedule(st)

    plain, tail = decide("swap"), decide("swap_tail")
    # one free block: rid 0 takes it; rid 1 needs one, the CPU is full, so it waits ...
    assert [s.rid for s, _ in plain.batch] == [0] and not plain.preempt  # rid 2, 3 wait for blocks too
    assert [s.rid for s, _ in tail.batch] == [0] and not tail.preempt
    # ... and with a block to spare for rid 2, plain swap runs it while swap_tail does not
    running[2] = seq(2, 2)
    running[2].computed -= 1  # its next token still fits in its last block: needs no new one
    running[2].num_tokens -= 1
    plain, tail = decide("swap"), decide("swap_tail")
    assert [s.rid for s, _ in plain.batch] == [0, 2]
    assert [s.rid for s, _ in tail.batch] == [0]
