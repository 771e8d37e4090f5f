"""Speculative decoding in the serving engine: draft models, Minions (voting, selector,
pipeline) and Medusa keep continuous batching, preemption and block accounting intact."""

import numpy as np
import pytest
import simpy

from infersim.simulator.costmodel import BatchShape
from infersim.simulator.engine.replica import Replica
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.summary import summarize
from infersim.simulator.simulation import Simulation
from infersim.simulator.speculative.device import SharedDevice
from infersim.simulator.speculative.replica import PipelinedReplica, SpeculativeReplica
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import WorkloadSpec
from tests.utils import fixed_lengths_spec, requests_section, small_workload_spec

DRAFTS = [{"model": "opt-125m", "acceptance": {"kind": "iid", "alpha": a}} for a in (0.8, 0.6, 0.4)]
CASES = {
    "draft": {"method": "draft", "drafts": DRAFTS[:1], "speculation_length": 5},
    "minions_coupled": {
        "method": "minions",
        "drafts": DRAFTS,
        "pipeline": {"enabled": False},
        "selector": {"decision_threshold": 4},
    },
    "minions_pipelined": {"method": "minions", "drafts": DRAFTS, "selector": {"decision_threshold": 4}},
    "medusa": {"method": "medusa"},
    "medusa_typical": {
        "method": "medusa",
        "sampling": {"mode": "typical", "temperature": 0.7},
        "medusa": {"tree": {"type": "greedy", "nodes": 24}},
    },
}


def _small(speculation, **serving):
    return small_workload_spec(count=50, speculation=speculation, **serving)


def _sim(spec):
    sim = Simulation(spec, build_requests(spec, "."))
    return sim, sim.run()


@pytest.fixture
def finish_log(monkeypatch):
    """Every finished sequence's (generated, output_len)."""
    log = []
    orig = Replica._finish

    def spy(self, seq, now):
        log.append((seq.generated, seq.output_len))
        orig(self, seq, now)

    monkeypatch.setattr(Replica, "_finish", spy)
    return log


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(
    "scheduler,preemption,chunked",
    [("fcfs", "recompute", False), ("fairness", "cost_aware", False), ("fcfs", "swap", True)],
)
def test_speculation_keeps_serving_invariants(case, scheduler, preemption, chunked, finish_log):
    spec = _small(
        CASES[case],
        scheduler=scheduler,
        preemption=preemption,
        chunked_prefill=chunked,
        max_batched_tokens=256 if chunked else None,
    )
    sim, res = _sim(spec)
    rep = sim.replicas[0]
    assert isinstance(rep, PipelinedReplica if case == "minions_pipelined" else SpeculativeReplica)
    # every KV block comes back, on both pools
    assert rep.blocks.free_gpu == rep.blocks.total_gpu and rep.blocks.free_cpu == rep.blocks.total_cpu
    # every request finished with exactly its output length: never more
    assert len(finish_log) == 50 and all(g == o for g, o in finish_log)
    r = res.requests
    assert (r["aborted"] == 0).all() and np.all(r["finish_s"] >= r["first_token_s"])
    c = res.metrics.counters
    assert c["preempt_recompute"] + c["preempt_swap"] > 0  # the tiny pool forces preemption
    sx = summarize(res)["speculation"]
    assert sx["kv_blocks_released_on_rejection"] > 0
    assert 1.0 <= sx["acceleration_rate"]
    if case.startswith("medusa"):
        assert sx["acceleration_rate"] <= rep.proposer.depth + 1
    else:
        assert sx["acceleration_rate"] <= rep.proposer.s_cap + 1


def test_acceleration_rate_matches_the_acceptance_model():
    """Long outputs, no preemption: tokens per step ~ (1 - a^(s+1)) / (1 - a). Kernels only
    (NAME:datasheet): the busy times compare the two models' kernels, which an engine overhead
    paid on every draft step would hide."""
    spec = fixed_lengths_spec(
        "opt-1.3b",
        count=64,
        prompt_tokens=32,
        output_tokens=1001,
        profile="a100-80gb-pcie:datasheet",
        serving={"max_batch_size": 32},
        speculation={
            "method": "draft",
            "speculation_length": 4,
            "drafts": [{"model": "opt-125m", "acceptance": {"kind": "iid", "alpha": 0.7}}],
        },
    )
    sim, res = _sim(spec)
    sx = summarize(res)["speculation"]
    expect = (1 - 0.7**5) / 0.3
    assert sx["acceleration_rate"] == pytest.approx(expect, rel=0.02)
    assert sx["acceptance_rate"] == pytest.approx((expect - 1) / 4, rel=0.03)
    # one verification costs q = s + 1 tokens per sequence: the step time is draft + verify
    rep = sim.replicas[0]
    ctx = np.full(32, 500)
    verify = rep.cost.iteration_time_s(BatchShape.verify(ctx, 5))
    assert verify > rep.cost.iteration_time_s(BatchShape.decode(ctx))
    assert sx["engines"]["ssm"]["busy_s"] > 0 and sx["engines"]["llm"]["busy_s"] > sx["engines"]["ssm"]["busy_s"]


def test_single_request_round_times_by_hand():
    spec = fixed_lengths_spec(
        "llama-2-7b",
        count=1,
        prompt_tokens=100,
        output_tokens=12,
        speculation={
            "method": "draft",
            "speculation_length": 4,
            "drafts": [{"model": "llama-68m", "acceptance": {"kind": "iid", "alpha": 1.0}}],
        },
    )
    sim, res = _sim(spec)
    rep = sim.replicas[0]
    cm, dm = rep.cost, rep.proposer.drafts[0].cost
    t = cm.iteration_time_s(BatchShape.prefill([100])) + dm.iteration_time_s(BatchShape.prefill([100]))
    # alpha = 1: rounds of 5 tokens (ctx 100, 105), then the last token alone (k = 0)
    for ctx, k in ((100, 4), (105, 4), (110, 0)):
        t += sum(dm.iteration_time_s(BatchShape.decode([ctx + j])) for j in range(k))
        t += cm.iteration_time_s(BatchShape.verify([ctx], k + 1))
    assert res.requests["finish_s"][0] == pytest.approx(t, rel=1e-12)
    assert summarize(res)["speculation"]["rounds"] == 3


def test_same_seed_same_run_and_seeds_differ():
    spec = _small(CASES["minions_pipelined"])
    a, b = _sim(spec)[1], _sim(spec)[1]
    for col in a.requests:
        assert np.array_equal(a.requests[col], b.requests[col], equal_nan=True), col
    sa, sb = summarize(a)["speculation"], summarize(b)["speculation"]
    assert sa == sb
    c = _sim(spec.model_copy(update={"seed": 4}))[1]
    assert not np.array_equal(a.requests["finish_s"], c.requests["finish_s"])


def test_shared_device_processor_sharing_by_hand():
    env = simpy.Environment()
    dev = SharedDevice(env, {"llm": 0.8, "ssm": 0.5})
    done = {}

    def job(name, work, at=0.0):
        yield env.timeout(at)
        yield from dev.run(name, work)
        done[name] = env.now

    env.process(job("llm", 1.0))
    env.process(job("ssm", 0.25))
    env.run()
    # ssm at half speed finishes at 0.5; llm did 0.4 by then, the last 0.6 alone
    assert done["ssm"] == pytest.approx(0.5) and done["llm"] == pytest.approx(1.1)
    env = simpy.Environment()
    dev = SharedDevice(env, None)
    done.clear()
    env.process(job("llm", 1.0))
    env.process(job("ssm", 0.25))
    env.run()
    assert done == {"llm": pytest.approx(1.0), "ssm": pytest.approx(0.25)}


def test_pipelined_round_throughput_beats_coupled():
    """Minions (c) on a fixed setting: three SSMs drafting s = 4 for a verify batch of 16;
    coupled runs them serially, pipelined overlaps them on a separate device."""

    def spec(pipeline):
        return _pipe_spec(pipeline, 500.0, shares=None, count=96, output_tokens=128)

    coupled = summarize(_sim(spec(False))[1])
    piped = summarize(_sim(spec(True))[1])
    assert piped["throughput_output_tokens_per_s"] > coupled["throughput_output_tokens_per_s"]
    ps = piped["speculation"]
    assert ps["mode"] == "pipelined" and ps["pool"]["max_depth"] <= 16 + 16  # back-pressure bounds the pool
    assert ps["engines"]["llm"]["busy_fraction"] > coupled["speculation"]["engines"]["llm"]["busy_fraction"]
    assert len(ps["series"]["pool_depth"]["rows"]) > 10


def test_voting_weights_and_selector_series_are_reported():
    spec = _small(
        {
            "method": "minions",
            "drafts": DRAFTS,
            "pipeline": {"enabled": False},
            "selector": {"decision_threshold": 3},
            "voting": {"threshold_mode": "absolute", "reward_threshold": 0.5, "punish_threshold": 0.3},
        }
    )
    sim, res = _sim(spec)
    sx = summarize(res)["speculation"]
    v = sx["voting"]
    assert v["ssms"] == ["opt-125m"] * 3 and sum(v["voted_outputs"]) > 0
    assert v["final_weights"][0] > max(v["final_weights"][1:])  # the best SSM gains weight over the others
    assert sx["s"]["changes"] > 0 and len(sx["series"]["s"]["rows"]) == sx["s"]["changes"] + 1
    assert len(sx["series"]["weights"]["rows"]) > 1


def test_medusa_costs_tree_and_heads():
    spec = fixed_lengths_spec(
        "vicuna-7b", count=1, prompt_tokens=100, output_tokens=200, speculation={"method": "medusa"}
    )
    sim, res = _sim(spec)
    sx = summarize(res)["speculation"]
    assert sx["proposer"]["tree_nodes"] == 64 and sx["proposer"]["tree"] == "mc_sim_7b_63"
    assert sx["acceleration_rate"] == pytest.approx(sx["proposer"]["expected_tokens_per_step"], rel=0.1)
    rep = sim.replicas[0]
    ctx = np.array([300])
    assert sx["overhead"] > rep.cost.iteration_time_s(BatchShape.verify(ctx, 64)) / rep.cost.iteration_time_s(
        BatchShape.decode(ctx)
    )
    assert sx["memory"]["kv_blocks_taken"] > 0  # the heads' weights come out of the KV pool


@pytest.mark.parametrize("name", ["draft", "minions", "medusa"])
def test_examples_run(name):
    from pathlib import Path

    from infersim.simulator.workload.builder import load_workload

    path = Path(__file__).resolve().parents[2] / "examples" / "speculative" / f"{name}.yaml"
    spec, p = load_workload(str(path))
    spec = spec.model_copy(update={"requests": spec.requests.model_copy(update={"count": 24})})
    sim, res = _sim(spec)
    sx = summarize(res)["speculation"]
    assert sx["method"] == spec.speculation.method and sx["acceleration_rate"] > 1.2
    rep = sim.replicas[0]
    assert rep.blocks.free_gpu == rep.blocks.total_gpu


def test_reproduction_plans_build_valid_workloads():
    """The Minions and Medusa reproductions' settings validate and one of each runs."""
    from infersim.analysis.reproduce import medusa_trees, minions

    tasks = minions.plan(quick=True)
    assert {t["study"] for t in tasks} == {"fig2", "selector", "ablation", "voting", "pipeline", "pipegain"}
    for t in tasks[::7]:
        minions.build_spec(t)
    row = minions.simulate(minions.task("fig2", "opt-13b", "dialogue", 16, "s=3", s=3, n=16))
    assert row["acceleration_rate"] > 1 and row["requests"] == 16
    r = medusa_trees.simulate("greedy 16", "greedy", {"type": "greedy", "nodes": 16}, 1, 2, 64, 32)
    assert r["nodes"] == 16 and r["acceleration_rate"] > 1.5


# ---- pipelined vs coupled: what the pipeline's gain depends on -----------------
def _pipe_spec(
    pipeline: bool,
    overhead_us: float,
    placement: str = "separate",
    shares=(0.8, 0.5),
    count: int = 64,
    output_tokens: int = 96,
):
    """Three SSMs at fixed s = 4, LLM batch 16 (coupled: 16 in flight; pipelined: 32, Fig. 3's
    two batches), all `count` requests (64-token prompts) at t = 0; `shares` (LLM, SSM) of a
    shared device, None: the defaults."""
    pipe = {"enabled": pipeline, "placement": placement, "llm_batch_size": 16}
    if shares is not None:
        pipe.update(llm_share=shares[0], ssm_share=shares[1])
    return WorkloadSpec.model_validate(
        {
            "model": "opt-6.7b",
            "hardware": {"profile": "a100-80gb-sxm"},
            "serving": {"max_batch_size": 32 if pipeline else 16},
            "requests": requests_section(count, 64, output_tokens),
            "speculation": {
                "method": "minions",
                "drafts": DRAFTS,
                "speculation_length": 4,
                "draft_step_overhead_us": overhead_us,
                "selector": {"enabled": False},
                "pipeline": pipe,
            },
        }
    )


def _tput(spec) -> tuple[float, dict]:
    s = summarize(_sim(spec)[1])
    return s["throughput_output_tokens_per_s"], s["speculation"]


def test_draft_overhead_is_the_fixed_part_of_draft_time():
    sim, _ = _sim(_pipe_spec(False, 700.0))
    p = sim.replicas[0].proposer
    ctx, k = np.array([100, 200, 300]), np.array([4, 2, 3])
    assert p.draft_overhead_s(k) == pytest.approx(4 * 700e-6)  # once per step of the longest draft
    assert p.draft_overhead_s(np.array([0, 0])) == 0.0
    bare = _sim(_pipe_spec(False, 0.0))[0].replicas[0].proposer
    assert p.draft_time_s(ctx, k) - p.draft_overhead_s(k) == pytest.approx(bare.draft_time_s(ctx, k), rel=1e-12)


def test_ssm_host_overhead_leaves_the_shared_gpu_to_the_llm():
    """Shares 0.5 / 0.5 split the GPU's throughput (no overlap gain for kernels), but the SSMs'
    per-step host time (launches, sampling) leaves the GPU idle for the LLM: with steps dominated
    by it the pipeline must still beat coupled execution on one shared GPU. Shares of 1 / 1 are the
    same as separate devices."""
    coupled, _ = _tput(_pipe_spec(False, 3000.0))
    split, _ = _tput(_pipe_spec(True, 3000.0, "shared", (0.5, 0.5)))
    assert split > 1.2 * coupled
    free, _ = _tput(_pipe_spec(True, 3000.0, "shared", (1.0, 1.0)))
    sep, _ = _tput(_pipe_spec(True, 3000.0, "separate"))
    assert free == pytest.approx(sep, rel=1e-12)


@pytest.mark.parametrize("overhead_us", [0.0, 2000.0])
def test_pipeline_gain_is_bounded_by_the_hidden_ssm_time(overhead_us):
    """Coupled, a round costs T_ssm + T_llm; a two-batch pipeline at best max(T_ssm, T_llm). With
    f the SSM engine's busy fraction when coupled, the gain is at most 1 / max(f, 1 - f) - 1, and
    on a separate device it gets most of it."""
    coupled, cs = _tput(_pipe_spec(False, overhead_us))
    piped, ps = _tput(_pipe_spec(True, overhead_us))
    f = cs["engines"]["ssm"]["busy_fraction"]
    ideal = 1.0 / max(f, 1.0 - f)
    gain = piped / coupled
    # a few % of slack: with 32 requests in flight the pipelined engine also batches twice as
    # many prefills per pass, so its LLM does slightly less work than the coupled one's
    assert 1.0 < gain <= ideal * 1.06
    assert gain - 1.0 > 0.4 * (ideal - 1.0)
    # coupled, the engines alternate (busy times add up to the makespan); pipelined, the makespan
    # (coupled makespan x coupled / pipelined throughput) cannot be shorter than the LLM's busy time
    assert cs["engines"]["llm"]["busy_s"] + cs["engines"]["ssm"]["busy_s"] == pytest.approx(
        cs["engines"]["llm"]["busy_s"] + cs["engines"]["llm"]["idle_s"], rel=1e-9
    )
    assert (
        coupled / piped * (cs["engines"]["llm"]["busy_s"] + cs["engines"]["ssm"]["busy_s"])
        >= ps["engines"]["llm"]["busy_s"] - 1e-9
    )
    assert ps["engines"]["llm"]["busy_fraction"] > cs["engines"]["llm"]["busy_fraction"]


def test_pipeline_gain_grows_with_the_ssm_step_cost():
    gains = []
    for ov in (0.0, 1000.0, 3000.0):
        coupled, _ = _tput(_pipe_spec(False, ov))
        piped, _ = _tput(_pipe_spec(True, ov, "shared"))
        gains.append(piped / coupled)
    assert gains[0] < gains[1] < gains[2]


def test_pipeline_handoff_delays_each_return_to_the_drafts_by_hand():
    """One request, one SSM: the engines strictly alternate, so each verifying pass's hand-over
    (pipeline.handoff_s) lands on the request's path once per pass before the last: the prefill
    pass and every verification but the final one, `rounds` in all. The acceptance draws do not
    depend on time, so both runs make the same rounds; the LLM's busy time is unchanged (the
    hand-over is host work)."""

    def run(handoff_s):
        spec = fixed_lengths_spec(
            "opt-6.7b",
            count=1,
            prompt_tokens=64,
            output_tokens=40,
            profile="a100-80gb-sxm",
            speculation={
                "method": "minions",
                "drafts": DRAFTS[:1],
                "speculation_length": 4,
                "selector": {"enabled": False},
                "voting": {"enabled": False},
                "pipeline": {"placement": "separate", "handoff_s": handoff_s},
            },
        )
        return summarize(_sim(spec)[1])

    base, slow = run(0.0), run(1e-3)
    rounds = base["speculation"]["rounds"]
    assert rounds == slow["speculation"]["rounds"] and rounds > 5
    assert slow["e2e_s"]["mean"] - base["e2e_s"]["mean"] == pytest.approx(rounds * 1e-3, rel=1e-9)
    llm = (base["speculation"]["engines"]["llm"], slow["speculation"]["engines"]["llm"])
    assert llm[0]["busy_s"] == pytest.approx(llm[1]["busy_s"], rel=1e-12)


def test_kv_pool_reported_is_what_the_draft_leaves_the_target():
    """Llama-3-70B at TP 4 on H100 with a Llama-3-8B draft (draft TP 1): the draft's 16 GB of
    weights and its KV (128 KiB per token against the target's 80 KiB per GPU) come out of the
    pool, and the summary's pool and KV utilisation refer to what is left."""
    spec = WorkloadSpec.model_validate(
        {
            "model": "llama-3-70b",
            "hardware": {"profile": "h100-sxm", "tensor_parallel": 4},
            "serving": {"max_batch_size": 64},
            "requests": requests_section(8, 500, 40),
            "speculation": {
                "method": "draft",
                "drafts": [{"model": "llama-3-8b", "acceptance": {"kind": "iid", "alpha": 0.8}}],
            },
        }
    )
    block = 16 * 80 * 2 * 2 * 128 * 2  # tokens x layers x K,V x KV heads per GPU x head dim x bytes
    act = 8192 * (4 * 8192 + 2 * 28672 / 4) * 2 + 64 * 128256 * 4
    usable = 79.22 * 2**30 * 0.9 - 0.25 * 2**30  # driver-visible total x 0.9, less the non-torch reserve
    pool = int((usable - 70_553_706_496 * 2 / 4 - act) // block)
    draft_weight_blocks = -(-8_030_261_248 * 2 // block)
    left = int((pool - draft_weight_blocks) / (1 + (32 * 2 * 8 * 128 * 2) / (block / 16)))
    sim, res = _sim(spec)
    s = summarize(res)
    assert s["speculation"]["memory"]["kv_blocks_left"] == left == s["gpu_blocks"] == sim.replicas[0].blocks.total_gpu
    assert res.resolved["memory"]["gpu_blocks"] == left
    assert 0 < s["kv_utilization"]["max"] <= 1


def test_a_draft_that_leaves_the_target_no_sequence_is_refused():
    """A Llama-3-70B draft (141 GB of fp16 weights) beside a Llama-3-8B target on one 80 GB H100
    leaves the target no KV at all: refused in one line naming the field, where it used to run
    with a one-block pool and every request aborted."""
    spec = WorkloadSpec.model_validate(
        {
            "model": "llama-3-8b",
            "hardware": {"profile": "h100-sxm"},
            "requests": requests_section(4, 100, 20),
            "speculation": {
                "method": "draft",
                "drafts": [{"model": "llama-3-70b", "acceptance": {"kind": "iid", "alpha": 0.8}}],
            },
        }
    )
    with pytest.raises(InfersimError) as info:
        Simulation(spec, build_requests(spec, "."), source="w.yaml")
    assert str(info.value).startswith(
        "w.yaml: field 'speculation.drafts': 141.1 GB of colocated weights and their KV leave 0 tokens of the "
    )
    assert "to llama-3-8b, fewer than max_model_len 8,192;" in str(info.value)


@pytest.mark.parametrize("placement", ["shared", "separate"])
def test_ssms_on_a_gpu_of_their_own_leave_the_targets_pool(placement):
    """Pipelined Minions SSMs placed on a separate GPU hold their weights and KV there: the
    target's pool is the plain plan's; shared on the target's GPU, they shrink it."""

    def spec(speculation=None):
        return fixed_lengths_spec(
            "opt-13b",
            count=4,
            prompt_tokens=100,
            output_tokens=20,
            speculation=speculation,
            serving={"max_batch_size": 16},
        )

    plain = summarize(_sim(spec())[1])["gpu_blocks"]
    section = {"method": "minions", "drafts": DRAFTS, "pipeline": {"placement": placement, "llm_batch_size": 16}}
    s = summarize(_sim(spec(section))[1])
    if placement == "separate":
        assert s["gpu_blocks"] == plain and s["speculation"]["memory"] == {"kv_blocks_taken": 0}
    else:
        assert s["gpu_blocks"] == s["speculation"]["memory"]["kv_blocks_left"] < plain


def test_draft_steps_pay_kernels_only_the_target_pays_the_engine_overhead():
    # a100-80gb-pcie carries vLLM's engine overhead (1,720 us per iteration): the target's step
    # pays it once per round; a draft step pays its kernels (plus draft_step_overhead_us, which
    # the round adds), never the engine's iteration a second time
    from infersim.simulator.costmodel import build_cost_model
    from infersim.simulator.models.catalog import load_model

    spec = _small(CASES["draft"])
    sim = Simulation(spec, build_requests(spec, "."))
    draft = sim.replicas[0].proposer.drafts[0].cost
    hw = sim.hardware
    kernels = build_cost_model(
        "roofline", load_model("opt-125m"), hw.model_copy(update={"overheads": hw.overheads.kernels_only()})
    )
    shape = BatchShape.decode([100, 200, 300])
    assert hw.overheads.iteration_us == 1720.0 and sim.cost_model.iteration_overhead_s == pytest.approx(1720e-6)
    assert draft.iteration_overhead_s == 0.0
    assert draft.iteration_time_s(shape) == kernels.iteration_time_s(shape)
