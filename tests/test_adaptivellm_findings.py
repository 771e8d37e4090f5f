"""AdaptiveLLM's claims that the simulator reproduces, on a small version of its setup:
OPT-13B on an A800, the chatbot workload cut to 300 requests, max output 64, 128 GPU + 64 CPU
KV blocks. The full study (all models, datasets, max outputs) is
`python -m analysis.reproduce.adaptivellm`; docs/findings/adaptivellm.md explains the claims
left out here: recompute-only beating swap-only and the size of the gains over vLLM_s (the
simulator does not show them), and the full AdaptiveLLM (cost_aware+fairness) beating vLLM on
throughput (it does only on chatbot at max output 64, by ~2%, and loses elsewhere)."""
import pytest

from analysis.reproduce.adaptivellm import CONFIGS, PAPER_TABLE4, simulate_point, task

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
