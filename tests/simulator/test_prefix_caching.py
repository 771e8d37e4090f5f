"""Automatic prefix caching in the simulator (serving.prefix_caching): hits skip their part of
the prefill (hand-checked times), the last prompt token is always computed, swap and recompute
keep working with shared blocks, event mode equals step mode, the Mooncake replay's hit rate
for an unbounded cache equals the one computed straight from the trace's hash ids."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from infersim.simulator.costmodel import BatchShape
from infersim.simulator.engine.prefix_blocks import PrefixCachingBlockManager
from infersim.simulator.engine.sequence import Sequence
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.summary import summarize
from infersim.simulator.simulation import Simulation, simulate
from infersim.simulator.workload.builder import build_requests, load_workload
from infersim.simulator.workload.prefixes import TraceBlockKeys, conversation_turns
from infersim.simulator.workload.schema import SharingModel, WorkloadSpec


def _sharing_spec(sharing: dict, count: int, prompt: dict, output: dict, arrival=None, **serving) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {
            "model": "opt-1.3b",
            "hardware": {"profile": "a100-80gb-pcie"},
            "serving": {"block_size": 16, "prefix_caching": True, **serving},
            "requests": {
                "count": count,
                "arrival": arrival or {"type": "burst"},
                "prompt_tokens": prompt,
                "output_tokens": output,
                "sharing": sharing,
            },
            "seed": 1,
        }
    )


def _fixed(n: int) -> dict:
    return {"type": "fixed", "value": n}


# ---- the synthetic conversation model --------------------------------------------------------
def test_conversation_turns_grow_by_the_previous_turn_and_restart_after_max_turns():
    sharing = SharingModel(conversations=2, system_prompt_tokens=32, max_turns=2)
    user = np.array([10, 20, 5, 6, 7, 8])
    out = np.array([3, 4, 5, 6, 7, 8])
    prompt, keys = conversation_turns(sharing, user, out, None)
    # slot 0: requests 0, 2, 4; slot 1: requests 1, 3, 5; a slot restarts after 2 turns
    assert prompt.tolist() == [32 + 10, 32 + 20, 42 + 3 + 5, 52 + 4 + 6, 32 + 7, 32 + 8]
    assert keys.conversation.tolist() == [0, 1, 0, 1, 2, 3]


def test_conversation_keys_share_the_system_prompt_and_the_own_history_only():
    sharing = SharingModel(conversations=2, system_prompt_tokens=40, max_turns=8)
    prompt, keys = conversation_turns(sharing, np.array([30, 30, 30]), np.array([20, 20, 20]), None)
    k0, k1, k2 = (keys.keys(i, int(prompt[i]), 16) for i in range(3))
    assert k0[:2] == k1[:2] == [0, 1]  # blocks 0-1 lie wholly in the 40-token system prompt
    assert k0[2] != k1[2]  # block 2 holds conversation tokens
    assert k2[: len(k0)] == k0  # turn 2 of conversation 0 starts with all of turn 1's blocks
    assert len(k2) == prompt[2] // 16


def test_trace_hash_ids_map_onto_engine_blocks():
    keys = TraceBlockKeys([[7, 9], [7, 4]], block_tokens=64)
    a = keys.keys(0, 100, 16)  # 6 full blocks of 16 from 100 tokens: 4 of id 7, 2 of id 9
    b = keys.keys(1, 128, 16)
    assert a == [28, 29, 30, 31, 36, 37] and b[:4] == a[:4] and b[4] == 16
    with pytest.raises(InfersimError, match="block_size 48 does not divide"):
        keys.check_block_size(48, "w.yaml")


# ---- hits skip prefill, by hand -------------------------------------------------------------
def test_a_shared_system_prompt_is_computed_once_in_the_same_iteration():
    # two conversations admitted together: 64 shared system-prompt tokens + 16 of their own each
    spec = _sharing_spec({"conversations": 2, "system_prompt_tokens": 64}, 2, _fixed(16), _fixed(1))
    res = simulate(spec, build_requests(spec, "."))
    assert res.requests["cached_tokens"].tolist() == [0, 64]
    cm = Simulation(spec, build_requests(spec, ".")).cost_model
    # one prefill iteration: 80 tokens, then 16 new tokens on top of 64 cached ones
    t = cm.iteration_time_s(BatchShape(np.array([80, 16]), np.array([0, 64]), np.array([1, 1])))
    assert res.requests["first_token_s"].tolist() == [t, t]
    s = summarize(res)["prefix_cache"]
    assert s["hit_rate_tokens"] == 64 / 160 and s["hit_rate_blocks"] == 4 / 10
    assert s["prefill_tokens_saved"] == 64


def test_the_last_prompt_token_is_always_computed(tmp_path):
    rows = [{"t": 0, "p": 512, "o": 2, "h": [5]}, {"t": 1000, "p": 512, "o": 2, "h": [5]}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = {"file": "t.jsonl", "arrival_column": "t", "time_unit": "ms", "prompt_column": "p"}
    trace.update(output_column="o", hash_column="h")
    spec = WorkloadSpec.model_validate(
        {"model": "opt-1.3b", "serving": {"prefix_caching": True}, "requests": {"trace": trace}}
    )
    res = simulate(spec, build_requests(spec, tmp_path / "t.jsonl"))
    # 32 blocks of 16 cached, but only 31 may be shared: the last token is computed again
    assert res.requests["cached_tokens"].tolist() == [0, 496]
    cm = Simulation(spec, build_requests(spec, tmp_path / "t.jsonl")).cost_model
    prefill = cm.iteration_time_s(BatchShape(np.array([16]), np.array([496]), np.array([1])))
    assert res.requests["first_token_s"][1] - 1.0 == pytest.approx(prefill, rel=1e-12)


def test_caching_off_ignores_the_identity_and_on_cuts_ttft():
    kw = dict(sharing={"conversations": 4, "system_prompt_tokens": 256, "max_turns": 6}, count=40)
    kw.update(prompt={"type": "uniform", "low": 20, "high": 120}, output=_fixed(20))
    kw["arrival"] = {"type": "poisson", "rate": 20.0}
    on = summarize(simulate(spec := _sharing_spec(**kw), build_requests(spec, ".")))
    off_spec = _sharing_spec(**kw, prefix_caching=False)
    off = summarize(simulate(off_spec, build_requests(off_spec, ".")))
    assert "prefix_cache" not in off and on["prefix_cache"]["hit_rate_tokens"] > 0.5
    assert on["ttft_s"]["mean"] < off["ttft_s"]["mean"]
    again = summarize(simulate(spec, build_requests(spec, ".")))
    assert json.dumps(again, sort_keys=True) == json.dumps(on, sort_keys=True)  # deterministic


# ---- swap and recompute with shared blocks ---------------------------------------------------------
def _seq(rid: int, keys: list, tokens: int) -> Sequence:
    seq = Sequence(rid, tokens, 10, 0.0)
    seq.block_keys = keys
    return seq


def test_a_block_shared_with_a_swapped_out_sequence_is_never_evicted():
    m = PrefixCachingBlockManager(6, 8, 16)
    a, b = _seq(0, [1, 2, 3], 48), _seq(1, [1, 2, 4], 48)
    assert m.admit(a, 48) == 48
    assert m.admit(b, 48) == 16 and b.computed == 32  # blocks 1, 2 shared
    assert m.free_gpu == 2
    assert m.releasable(b) == 1  # preempting b frees only its own block
    assert m.swap_out([b]) == 1 and b.num_cpu_blocks == 1 and b.num_gpu_blocks == 2
    m.free(a)  # a finishes: the shared blocks stay, referenced by the swapped-out b
    assert m.free_gpu == 4
    taken = m.pool.allocate(4)  # the pool runs dry: a's and b's released blocks are evicted ...
    assert m.pool.evictions == 2 and m.pool.lookup([1, 2, 3]) == 2  # ... but not the two b holds
    m.pool.free(taken)
    assert m.swap_in([b]) == 1  # its own block was evicted: copied back into a new block
    assert b.num_gpu_blocks == 3 and b.num_cpu_blocks == 0 and m.free_cpu == 8
    assert m.swap_out([b]) == 3  # nobody shares its blocks now: all three move
    assert m.swap_in([b]) == 0 and m.stats["swap_in_cache_hits"] == 3  # still cached: no copy


def test_recompute_drops_references_and_the_readmission_finds_its_blocks():
    m = PrefixCachingBlockManager(8, 0, 16)
    a = _seq(0, [1, 2, 3], 50)
    m.admit(a, 50)
    assert m.pool.num_cached == 3
    m.free(a)  # a recompute preemption: every reference goes, the blocks stay cached
    a.computed = 0
    assert m.free_gpu == 8 and m.pool.num_evictable == 3
    assert m.admit(a, 50) == 2 and a.cached_tokens == 0  # the first admission's hit is kept
    assert m.stats["hit_tokens"] == 48


@pytest.mark.parametrize(
    "preemption,chunked", [("recompute", False), ("swap", False), ("recompute", True), ("swap", True)]
)
def test_event_mode_equals_step_mode_with_caching(preemption, chunked):
    spec = _sharing_spec(
        {"conversations": 6, "system_prompt_tokens": 40, "max_turns": 4},
        60,
        {"type": "lognormal", "mean": 60, "cv": 0.8, "max": 300},
        {"type": "lognormal", "mean": 40, "cv": 0.8, "max": 200},
        arrival={"type": "poisson", "rate": 200.0},
        preemption=preemption,
        chunked_prefill=chunked,
        max_batched_tokens=256 if chunked else None,
        gpu_blocks=120,
        cpu_blocks=120,
    )
    sims = [Simulation(spec, build_requests(spec, "."), step_mode=mode) for mode in (False, True)]
    a, b = (sim.run() for sim in sims)
    for col in a.requests:
        assert np.array_equal(a.requests[col], b.requests[col], equal_nan=True), col
    assert a.sim_time_s == b.sim_time_s and a.extra == b.extra
    assert a.metrics.counters["segments"] < b.metrics.counters["segments"]
    assert a.metrics.counters[f"preempt_{preemption}"] > 0 and a.extra["prefix_cache"]["hit_tokens"] > 0
    for sim in sims:  # every reference is returned: only cached, unreferenced blocks are left
        pool = sim.replicas[0].blocks.pool
        assert pool.num_used == 0 and pool.num_evictable == pool.num_cached


def test_offload_serves_with_caching():
    spec = _sharing_spec(
        {"conversations": 3, "system_prompt_tokens": 300},
        12,
        {"type": "uniform", "low": 50, "high": 200},
        _fixed(20),
        arrival={"type": "poisson", "rate": 2.0},
    )
    spec = WorkloadSpec.model_validate({**spec.model_dump(), "offload": {"policy": "infinigen", "sparsity": "opt-13b"}})
    a = simulate(spec, build_requests(spec, "."))
    b = simulate(spec, build_requests(spec, "."), step_mode=True)
    for col in a.requests:
        assert np.array_equal(a.requests[col], b.requests[col], equal_nan=True), col
    assert (a.requests["aborted"] == 0).all() and a.requests["cached_tokens"].sum() >= 11 * 288


def test_speculation_with_caching_is_refused():
    data = _sharing_spec({"conversations": 2}, 2, _fixed(16), _fixed(4)).model_dump()
    draft = {"model": "opt-125m", "acceptance": {"kind": "iid", "alpha": 0.8}}
    data["speculation"] = {"method": "draft", "drafts": [draft], "speculation_length": 4}
    with pytest.raises(InfersimError, match="prefix_caching"):
        Simulation(WorkloadSpec.model_validate(data), build_requests(WorkloadSpec.model_validate(data), "."))


def test_a_bad_hash_column_is_one_line_naming_file_column_and_row(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"p": 10, "o": 2, "h": [1]}\n{"p": 10, "o": 2, "h": "x"}\n')
    trace = {"file": "t.jsonl", "prompt_column": "p", "output_column": "o", "hash_column": "h"}
    spec = WorkloadSpec.model_validate(
        {"requests": {"trace": trace, "arrival": {"type": "burst"}}, "serving": {"prefix_caching": True}}
    )
    with pytest.raises(InfersimError) as e:
        build_requests(spec, tmp_path / "t.jsonl")
    msg = str(e.value)
    assert "\n" not in msg and "t.jsonl" in msg and "'h'" in msg and "row 2" in msg


# ---- Mooncake: the simulator's hit rate is the trace's ----------------------------------------
MOONCAKE_PREFIX = 1000  # requests: the first 333 s of the trace


def test_mooncake_unbounded_cache_hit_rate_equals_the_traces_own():
    """With a cache larger than the trace's distinct blocks nothing is evicted, so a request's
    hit is the run of its leading blocks some earlier request (in arrival order) had: computed
    here in plain Python from the hash ids, 512-token ids split into 32 blocks of 16, at most
    (prompt - 1) // 16 blocks (the last token is computed again); prompts longer than the model's
    32,768 positions are rejected and cache nothing."""
    spec, path = load_workload("replay-mooncake")
    assert spec.serving.prefix_caching and spec.requests.trace.hash_column == "hash_ids"
    data = spec.model_dump()
    data["requests"]["count"] = MOONCAKE_PREFIX
    data["serving"].update(gpu_blocks=10_000_000)
    spec = WorkloadSpec.model_validate(data)
    res = simulate(spec, build_requests(spec, path))
    got = summarize(res)["prefix_cache"]

    bs, per_id, max_len = 16, 512 // 16, 32768
    seen, hit, total = set(), 0, 0
    with gzip.open(path.parent / spec.requests.trace.file, "rt") as fh:
        rows = [json.loads(next(fh)) for _ in range(MOONCAKE_PREFIX)]
    for row in rows:
        n = row["input_length"]
        if n > max_len:
            continue
        keys = [(row["hash_ids"][j // per_id], j % per_id) for j in range(n // bs)]
        k = 0
        while k < min(len(keys), (n - 1) // bs) and keys[k] in seen:
            k += 1
        hit += k
        total += -(-n // bs)
        seen.update(keys)
    assert got["evictions"] == 0
    assert got["hit_rate_blocks"] == hit / total
    assert 0.2 < hit / total < 0.3
