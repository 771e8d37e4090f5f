"""Prefix caching in the real executor: shared physical KV blocks keyed by real token ids,
reused after a request ends and evicted LRU, on the zoo's trained target over a multi-turn
workload (the simulator's conversation model made into real tokens: a shared system prompt,
each turn holding the previous turn and the model's own reply to it).

- the generated tokens are the same with caching on and off (sequential turns, a burst under
  swap and recompute preemption);
- the hits are the shared core's: the simulator's PrefixCachingBlockManager replayed on the
  conversation model's keys (not on the executed tokens) gives the same cached tokens per
  request, evictions included;
- a swap-out copies only the blocks no other sequence references, and a swap-in brings back
  the same K/V (real tensors, no model)."""

import json

import numpy as np
import pytest

import infersim.executor  # noqa: F401  (before torch: OpenMP threads wait passively)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from infersim.executor.engine import generate  # noqa: E402
from infersim.executor.kvcache import KVCacheConfig, PagedKVCache  # noqa: E402
from infersim.executor.prefix_kv import PrefixCachedKV  # noqa: E402
from infersim.executor.prompts import make_prompts  # noqa: E402
from infersim.executor.run import greedy_replies  # noqa: E402
from infersim.executor.sequence import CachedSequence  # noqa: E402
from infersim.simulator.engine.prefix_blocks import PrefixCachingBlockManager  # noqa: E402
from infersim.simulator.engine.sequence import Sequence  # noqa: E402
from infersim.simulator.policies.state import SchedulerLimits  # noqa: E402
from infersim.simulator.workload.prefixes import conversation_turns  # noqa: E402
from infersim.simulator.workload.schema import ServingSection, SharingModel  # noqa: E402

BS = 16
USER = [23, 9, 31, 14, 40, 6, 18, 27, 12, 35, 8, 21, 16, 29, 11, 24]
OUT = [12, 20, 7, 16, 9, 25, 14, 8, 19, 11, 22, 6, 13, 17, 10, 15]


@pytest.fixture(scope="module")
def chat(zoo_target):
    """16 turns of 4 conversations (max 5 turns) after a 40-token system prompt: prompt lengths,
    the conversation model's keys, real prompts and output lengths."""
    lengths, keys = conversation_turns(
        SharingModel(conversations=4, system_prompt_tokens=40, max_turns=5), np.array(USER), np.array(OUT), None
    )
    limits = SchedulerLimits(16, 4096, zoo_target.max_positions)
    prompts = make_prompts(
        lengths,
        tokenizer=zoo_target.tokenizer,
        vocab_size=zoo_target.vocab_size,
        seed=3,
        prefix=keys,
        outputs=OUT,
        reply=lambda ps, outs: greedy_replies(zoo_target, ps, outs, limits),
    )
    return [int(n) for n in lengths], keys, prompts


def _core_hits(lengths, keys, gpu_blocks: int) -> tuple[list[int], int]:
    """Cached prompt tokens per request and evictions, by the simulator's block accounting on the
    conversation model's keys, each request served alone in arrival order."""
    bm = PrefixCachingBlockManager(gpu_blocks, 0, BS)
    hits = []
    for i, (p, o) in enumerate(zip(lengths, OUT)):
        seq = Sequence(i, p, o, 0.0)
        seq.block_keys = keys.keys(i, p + o, BS)
        bm.admit(seq, p)
        bm.grow_to(seq, p + o - 1)  # the last output token's KV is never written
        bm.free(seq)
        hits.append(seq.cached_tokens)
    return hits, bm.evictions


def test_turns_hold_the_previous_turn_and_its_served_reply(chat, zoo_target):
    lengths, keys, prompts = chat
    assert [len(p) for p in prompts] == lengths
    got, _ = generate(zoo_target, prompts, OUT)
    conv = keys.conversation.tolist()
    follow = 0
    for i in range(len(prompts)):
        later = [j for j in range(i + 1, len(prompts)) if conv[j] == conv[i]]
        if later:
            j = later[0]
            assert prompts[j][: lengths[i] + OUT[i]] == prompts[i] + got[i]
            follow += 1
        assert prompts[i][:40] == prompts[0][:40]  # the system prompt
    assert follow == 12


@pytest.mark.parametrize("gpu_blocks", [400, 20])
def test_hits_are_the_shared_cores_and_outputs_do_not_change(chat, zoo_target, gpu_blocks):
    """Turns arriving one at a time (1000 s apart: each finishes before the next arrives): the
    cached tokens of every request are what the simulator's accounting computes from the
    conversation model's keys; with 20 blocks, LRU evictions included. Caching on and off give
    the same tokens."""
    lengths, keys, prompts = chat
    arrivals = [1000.0 * i for i in range(len(prompts))]
    off, _ = generate(zoo_target, prompts, OUT, ServingSection(gpu_blocks=gpu_blocks), arrival_s=arrivals)
    on, eng = generate(
        zoo_target, prompts, OUT, ServingSection(gpu_blocks=gpu_blocks, prefix_caching=True), arrival_s=arrivals
    )
    assert on == off
    cached = [s.cached_tokens for s in sorted(eng.finished, key=lambda s: s.rid)]
    want, evictions = _core_hits(lengths, keys, gpu_blocks)
    assert cached == want
    assert eng.kv.pool.evictions == evictions
    assert sum(cached) > 0 and eng.kv.stats["hit_tokens"] == sum(cached)
    if gpu_blocks == 20:
        assert evictions > 0
    else:
        assert evictions == 0
        # every turn after a conversation's first finds its previous turn's full blocks, the
        # first turns the system prompt's two full blocks (after the very first request)
        first = {}
        for i, c in enumerate(keys.conversation.tolist()):
            prev = first.get(c)
            expect = 0 if i == 0 else (2 * BS if prev is None else (lengths[prev] + OUT[prev] - 1) // BS * BS)
            assert cached[i] == min(expect, (lengths[i] - 1) // BS * BS)
            first[c] = i


@pytest.mark.parametrize("preemption, cpu_blocks", [("swap", 200), ("recompute", 0)])
def test_shared_blocks_under_preemption_keep_the_outputs(chat, zoo_target, preemption, cpu_blocks):
    """All 16 turns at once, with 48 more output tokens each, in 24 blocks: sequences sharing
    blocks are swapped out (only their unshared blocks move; some come back from the cache
    without a copy) or recomputed (a recompute finds its blocks cached again); the tokens are
    those of the run without caching, and every reference is returned at the end."""
    _, _, prompts = chat
    outs = [o + 48 for o in OUT]
    kw = dict(gpu_blocks=24, cpu_blocks=cpu_blocks, preemption=preemption, max_batch_size=16)
    off, _ = generate(zoo_target, prompts, outs, ServingSection(**kw))
    on, eng = generate(zoo_target, prompts, outs, ServingSection(prefix_caching=True, **kw))
    assert on == off
    st = eng.kv.stats
    assert eng.counters[f"preempt_{preemption}"] > 0 and st["hit_blocks"] > 0
    if preemption == "swap":
        assert st["swap_in_cache_hits"] > 0 and eng.counters["swap_out_blocks"] > 0
    else:  # re-admissions after a recompute look the cache up again
        assert st["admissions"] > len(prompts)
    assert eng.kv.pool.num_used == 0 and eng.kv.free_cpu == cpu_blocks == eng.cache.free_cpu


def test_swap_moves_only_unshared_blocks_and_restores_them():
    """Two sequences sharing two full blocks, on real tensors: swapping one out copies its own
    two blocks only and leaves the shared ones in place, referenced by both (so never evicted);
    swapping it back takes its registered block from the cache when it is still there and
    copies the rest, and its K/V is what it was."""
    cache = PagedKVCache(2, 2, 4, KVCacheConfig(12, 4, cpu_blocks=8, dtype=torch.float32))
    kv = PrefixCachedKV(cache)
    common = list(range(1, 9))
    a, b = CachedSequence(0, common + [20, 21, 22, 23, 24], 4, 0.0), CachedSequence(1, common + [30] * 7, 4, 0.0)
    kv.admit(a, a.num_tokens)
    kv.grow_to(a, a.num_tokens)  # a's prefill is scheduled: its full blocks are registered
    for layer in range(2):  # distinct K/V in every slot
        for pool in cache.flat(layer):
            pool.copy_(torch.arange(pool.numel(), dtype=torch.float32).view_as(pool) + 1000 * layer)
    kv.admit(b, b.num_tokens)
    assert b.computed == 8 and b.block_ids[:2] == a.block_ids[:2] and set(b.block_ids[2:]).isdisjoint(a.block_ids)
    kv.grow_to(b, b.num_tokens)
    shared = list(b.block_ids[:2])

    def kv_of(seq):
        return [pool[seq.block_ids].clone() for layer in range(2) for pool in (cache.k[layer], cache.v[layer])]

    before = kv_of(b)
    for pressure, copies in ((False, 1), (True, 2)):
        assert kv.swap_out([b]) == 2 and cache.free_cpu == 6
        assert b.block_ids[:2] == shared and b.block_ids[2:] == [None, None]
        if pressure:  # another sequence takes every free block: b's registered block is evicted
            c = CachedSequence(2, [7] * (4 * kv.free_gpu), 1, 0.0)
            kv.grow_to(c, c.num_tokens)
            kv.free(c)
        assert all(kv.pool.ref_count(x) == 2 for x in shared)  # a's and b's references
        assert kv.swap_in([b]) == copies and cache.free_cpu == 8
        assert b.block_ids[:2] == shared and None not in b.block_ids
        for x, y in zip(kv_of(b), before):
            assert torch.equal(x, y)
    assert kv.stats["swap_in_cache_hits"] == 1


def test_sim_exec_serves_the_same_multi_turn_prompts_with_caching_on_and_off(zoo_dir, tmp_path):
    """`sim exec` on a workload with requests.sharing: --prefix-caching on and off serve the same
    prompts and generate the same tokens; only the cached run has hits (summary, requests)."""
    import pyarrow.parquet as pq

    from infersim.cli.main import main

    wl = tmp_path / "chat.yaml"
    wl.write_text(
        "name: chat\nserving: {gpu_blocks: 256, cpu_blocks: 0, dtype: fp32}\n"
        "requests:\n  count: 8\n  arrival: {type: poisson, rate: 2.0}\n"
        "  prompt_tokens: {type: uniform, low: 8, high: 40}\n  output_tokens: {type: uniform, low: 8, high: 24}\n"
        "  sharing: {conversations: 2, system_prompt_tokens: 32, max_turns: 4}\nseed: 4\n"
    )
    runs = {}
    for mode in ("on", "off"):
        out = tmp_path / mode
        argv = ["exec", "-w", str(wl), "-m", "zoo-target", "--fast", "--no-plots", "-q", "--out", str(out)]
        assert main(argv + ["--prefix-caching", mode]) == 0
        runs[mode] = (
            pq.read_table(out / "outputs.parquet").to_pydict(),
            json.loads((out / "summary.json").read_text()),
        )
    (on, s_on), (off, s_off) = runs["on"], runs["off"]
    assert on["prompt_ids"] == off["prompt_ids"] and on["output_ids"] == off["output_ids"]
    assert "prefix_cache" not in s_off
    pc = s_on["prefix_cache"]
    assert pc["cached_prompt_tokens"] > 0 and pc["prompt_tokens"] == sum(len(p) for p in on["prompt_ids"])
    cached = pq.read_table(tmp_path / "on" / "requests.parquet").column("cached_tokens").to_pylist()
    assert sum(cached) == pc["cached_prompt_tokens"] and cached[0] == 0


@pytest.mark.parametrize("case", ["spec-draft", "offload-h2o"])
def test_prefix_caching_with_speculation_or_offload_is_refused_in_one_line(case, tmp_path):
    from infersim.analysis.validate.cases import get_case
    from infersim.executor.options import ExecOptions
    from infersim.executor.run import execute
    from infersim.simulator.errors import InfersimError

    spec = get_case(case).spec("zoo-target")
    spec = spec.model_copy(update={"serving": spec.serving.model_copy(update={"prefix_caching": True})})
    with pytest.raises(InfersimError, match="prefix_caching runs on the plain engine only") as err:
        execute(spec, None, "zoo-target", tmp_path / "out", ExecOptions(source="w.yaml"))
    assert "\n" not in str(err.value) and str(err.value).startswith("w.yaml: ")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["spec-draft", "offload-h2o"])
def test_sim_exec_refuses_prefix_caching_beside_speculation_or_offload_naming_the_file(case, tmp_path, capsys):
    """`sim exec` names its workload file and the field in one line, exits 2, writes nothing."""
    import copy

    import yaml

    from infersim.analysis.validate.cases import get_case
    from infersim.cli.main import main

    c = get_case(case)
    d = {**copy.deepcopy(c.workload), "name": c.name, "model": "zoo-target"}
    d.setdefault("serving", {})["prefix_caching"] = True
    wl = tmp_path / "pc.yaml"
    wl.write_text(yaml.safe_dump(d))
    section = "speculation" if "speculation" in d else "offload"
    out = tmp_path / "out"
    assert main(["exec", "-w", str(wl), "-m", "zoo-target", "--fast", "-q", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert str(wl) in err and "serving.prefix_caching" in err and section in err
    assert not out.exists()


def test_trace_hash_ids_become_shared_token_stretches():
    """A trace's hash ids as real tokens: one stretch of hash_block_tokens tokens per id, equal
    leading ids giving equal leading tokens, a new id new tokens; the same seed gives the same
    prompts."""
    from infersim.simulator.workload.prefixes import TraceBlockKeys

    ids = TraceBlockKeys([[1, 2], [1, 2, 3], [1, 4], [5]], block_tokens=32)
    lengths = [64, 80, 50, 32]
    prompts = make_prompts(lengths, vocab_size=1000, seed=2, prefix=ids)
    assert [len(p) for p in prompts] == lengths
    assert prompts[1][:64] == prompts[0] and prompts[2][:32] == prompts[0][:32]
    assert prompts[2][32:50] != prompts[0][32:50] and prompts[3][:32] != prompts[0][:32]
    assert make_prompts(lengths, vocab_size=1000, seed=2, prefix=ids) == prompts
