"""Medusa on the zoo target (executor/medusa): trees, acceptance, heads, training, decoding.

Greedy Medusa must reproduce the target's own greedy output token for token (for every tree
kind, batch 1 and > 1), typical acceptance must reduce to greedy where the paper says it does,
trained heads must round-trip and be keyed to their target, training must be deterministic, and
the measured accuracies must load in the simulator's Medusa path."""

import dataclasses
import math

import numpy as np
import pytest

import infersim.executor  # noqa: F401

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from infersim.executor.medusa.acceptance import Acceptance, accept, accept_greedy_lists, typical_threshold  # noqa: E402
from infersim.executor.medusa.heads import MedusaHeads, load_heads, save_heads  # noqa: E402
from infersim.executor.medusa.train import (
    TINY_RECIPE,
    loss_weights,
    medusa_loss,
    shifted_labels,  # noqa: E402
    train_heads,
)
from infersim.executor.medusa.tree import build_tree, layout  # noqa: E402
from infersim.simulator.errors import InfersimError  # noqa: E402
from tests.utils import fixed_lengths_spec, write_yaml, zoo_workload  # noqa: E402


# ---- pieces checked by hand ------------------------------------------------------------------
def test_loss_weights_are_point_eight_to_the_k():
    assert loss_weights(3).tolist() == pytest.approx([0.8, 0.64, 0.512])
    # two heads, two positions, vocabulary 2: CE by hand
    logits = torch.tensor(
        [
            [[0.0, 0.0], [math.log(3.0), 0.0]],  # head 1: p = (.5, .5), (.75, .25)
            [[0.0, 0.0], [0.0, 0.0]],
        ]
    )  # head 2: uniform
    labels = torch.tensor([[0, 0], [1, -100]])  # head 2 has no label at position 2
    total, per = medusa_loss(logits, labels, loss_weights(2))
    ce1 = -(math.log(0.5) + math.log(0.75)) / 2
    ce2 = -math.log(0.5)
    assert per == pytest.approx([ce1, ce2], rel=1e-6)
    assert float(total) == pytest.approx(0.8 * ce1 + 0.64 * ce2, rel=1e-6)


def test_head_labels_are_the_tokens_k_plus_one_ahead():
    tokens = torch.tensor([[10, 11, 12, 13, 14]])
    pos, labels = shifted_labels(tokens, num_heads=2, first=1)
    assert pos.tolist() == [[0, 1], [0, 2], [0, 3]]
    # head 1 at t reads the token at t + 2, head 2 the one at t + 3 (the LM head predicts t + 1)
    assert labels.tolist() == [[13, 14, -100], [14, -100, -100]]


def test_tree_layout():
    t = layout([(0,), (1,), (0, 0), (1, 2)], "t")
    assert t.depths == [0, 1, 1, 2, 2] and t.nodes == 5 and t.depth == 2 and t.top_k == 3
    assert t.parent.tolist() == [0, 0, 0, 1, 2]
    assert t.head.tolist() == [0, 0, 1, 1] and t.rank.tolist() == [0, 1, 0, 2]
    assert t.node_paths == [[0], [0, 1], [0, 2], [0, 1, 3], [0, 2, 4]]
    want = [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]]
    assert t.ancestors.int().tolist() == want
    assert build_tree("cartesian", heads=3, sizes=[2, 2]).nodes == 1 + 2 + 4
    # a tree deeper than the heads is cut to them (the simulator's restrict)
    assert build_tree("cartesian", heads=1, sizes=[2, 2]).nodes == 3
    g = build_tree("greedy", heads=2, nodes=4, accuracies=np.array([[0.6, 0.3], [0.5, 0.1]]))
    # expected gains: [0] .6, [1] .3, [0,0] .3, [0,1] .06 -> [0], then [1] / [0,0] (tie)
    assert g.nodes == 4 and (0,) in g.paths and (0, 1) not in g.paths
    with pytest.raises(InfersimError):
        build_tree("star", heads=2)


def _one_hot_logits(rows, vocab=4, hi=10.0):
    out = torch.zeros(1, len(rows), vocab)
    for i, t in enumerate(rows):
        out[0, i, t] = hi
    return out


def test_greedy_acceptance_by_hand():
    t = layout([(0,), (1,), (0, 0), (1, 0)], "t")
    # root predicts 2; node 1 (token 3) wrong, node 2 (token 2) right; under node 2 the argmax is 1
    tokens = torch.tensor([[0, 3, 2, 1, 1]])
    logits = _one_hot_logits([2, 0, 1, 0, 3])
    best, n_acc, bonus = accept(t.on("cpu"), tokens, logits, Acceptance("greedy"))
    assert best.tolist() == [4] and n_acc.tolist() == [2] and bonus.tolist() == [3]
    # nothing matches: only the root, and the bonus is the root's argmax
    best, n_acc, bonus = accept(t.on("cpu"), torch.tensor([[0, 3, 1, 1, 1]]), logits, Acceptance("greedy"))
    assert best.tolist() == [0] and n_acc.tolist() == [0] and bonus.tolist() == [2]


def test_greedy_acceptance_python_walk_equals_tensor_version():
    t = build_tree("cartesian", heads=3, sizes=[3, 2, 2]).on("cpu")
    g = torch.Generator().manual_seed(0)
    for _ in range(20):  # a vocabulary of 3: many candidates match, deep paths get accepted
        tokens = torch.randint(0, 3, (4, t.nodes), generator=g)
        logits = torch.randn(4, t.nodes, 3, generator=g)
        best, n_acc, bonus = accept(t, tokens, logits, Acceptance("greedy"))
        assert accept_greedy_lists(t, tokens.tolist(), logits) == (best.tolist(), n_acc.tolist(), bonus.tolist())


def test_typical_threshold_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    p, thr = typical_threshold(logits, Acceptance("typical", temperature=1.0, epsilon=0.3, delta=0.6))
    h = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    assert p[0].tolist() == pytest.approx([0.5, 0.25, 0.25], rel=1e-5)
    assert float(thr[0]) == pytest.approx(min(0.3, 0.6 * math.exp(-h)), rel=1e-5)  # 0.6 e^-1.04 = 0.212
    t = layout([(0,), (1,)], "t").on("cpu")
    rows = logits.expand(3, 3)[None]  # every node's logits: the same distribution
    # both children (tokens 1 and 2, p = 0.25 > 0.212) pass: equal depth, the first wins the tie
    best, n_acc, bonus = accept(t, torch.tensor([[0, 1, 2]]), rows, Acceptance("typical", 1.0, 0.3, 0.6))
    assert best.tolist() == [1] and n_acc.tolist() == [1] and bonus.tolist() == [0]
    best, _, _ = accept(t, torch.tensor([[0, 1, 2]]), rows, Acceptance("typical", 1.0, 0.3, 1.2))
    assert best.tolist() == [0]  # threshold min(0.3, 0.42) = 0.3 > 0.25: neither passes


# ---- heads: save, load, keyed to the target -----------------------------------------------------
def test_heads_round_trip_and_refuse_another_target(tmp_path):
    torch.manual_seed(0)
    heads = MedusaHeads.from_lm_head(3, torch.randn(50, 8))
    with torch.no_grad():
        heads.w1.normal_()
        heads.b1.normal_()
    save_heads(heads, tmp_path / "h", {"target_sha256": "abc"})
    back, meta = load_heads(tmp_path / "h", "abc")
    assert meta["heads_sha256"] == heads.weights_sha256() == back.weights_sha256()
    x = torch.randn(5, 8)
    assert torch.equal(heads.propose(x, 4), back.propose(x, 4))
    assert torch.allclose(heads(x), back(x))
    with pytest.raises(InfersimError, match="other|not"):
        load_heads(tmp_path / "h", "def")
    with pytest.raises(InfersimError, match="no medusa.json"):
        load_heads(tmp_path / "missing")
    # heads sharing one LM head: one [1, V, h] projection, the same logits as K copies of it
    w = torch.randn(50, 8)
    shared = MedusaHeads.from_lm_head(3, w, shared=True)
    own = MedusaHeads.from_lm_head(3, w)
    with torch.no_grad():
        for m in (shared, own):
            m.w1.copy_(heads.w1)
            m.b1.copy_(heads.b1)
    assert shared.w2.shape == (1, 50, 8) and not shared.w2.requires_grad
    assert shared.parameters_per_head == 8 * 8 + 8 and own.parameters_per_head == 8 * 8 + 8 + 8 * 50
    assert torch.allclose(shared(x), own(x), atol=1e-5)
    save_heads(shared, tmp_path / "s", {"target_sha256": "abc"})
    back, meta = load_heads(tmp_path / "s", "abc")
    assert meta["shared_lm_head"] and torch.equal(back.propose(x, 4), shared.propose(x, 4))


def test_fresh_heads_are_the_target_lm_head():
    w = torch.randn(30, 6)
    heads = MedusaHeads.from_lm_head(2, w)
    x = torch.randn(4, 6)
    assert torch.allclose(heads(x), (x @ w.T)[None].expand(2, 4, 30), atol=1e-6)
    # propose (decoding's path, with its cached transposed copy of W2) = top-k of forward
    assert torch.equal(heads.propose(x, 5), heads(x).topk(5, dim=-1).indices.transpose(0, 1))
    with torch.no_grad():
        heads.w2[1].neg_()  # a changed W2 must not be served from the stale copy
    assert torch.equal(heads.propose(x, 5), heads(x).topk(5, dim=-1).indices.transpose(0, 1))


# ---- the zoo target ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def target(zoo_target):
    from infersim.executor.runner import build_runner

    return zoo_target, build_runner(zoo_target)


@pytest.fixture(scope="module")
def trained(target):
    """The default heads: shipped with the zoo (executor/zoo/shipped.py), else trained once
    (~2 minutes) and cached beside it."""
    from infersim.executor.medusa.store import ensure_heads

    heads, meta, _ = ensure_heads(target[0])
    return heads, meta


@pytest.fixture(scope="module")
def prompts(target):
    from infersim.executor.prompts import make_prompts

    lm = target[0]
    return make_prompts([40, 57, 33], tokenizer=lm.tokenizer, vocab_size=lm.vocab_size, seed=11)


def _decode(target, heads, tree, prompts, new, acc=Acceptance("greedy")):
    from infersim.executor.medusa.decode import greedy_decode, make_cache, medusa_decode

    _, runner = target
    cache = make_cache(runner, prompts, new, tree.nodes, "cpu", block_size=8)
    ref, _ = greedy_decode(runner, cache, prompts, new)
    assert cache.used_gpu == 0
    out, st = medusa_decode(runner, heads, tree, cache, prompts, new, acc)
    assert cache.used_gpu == 0  # every block, speculative ones included, came back
    return ref, out, st


TREES = {
    "choices": dict(choices=[[0], [1], [0, 0], [0, 1], [2], [0, 0, 0], [1, 0]]),
    "cartesian": dict(sizes=[2, 2, 1]),
    "greedy": dict(nodes=12),
}


@pytest.mark.parametrize("kind", list(TREES))
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_medusa_equals_target_greedy(target, trained, prompts, kind, batch):
    heads, meta = trained
    acc = np.array(meta["accuracies"]["greedy"]["per_rank"])
    tree = build_tree(kind, heads=heads.num_heads, accuracies=acc, **TREES[kind])
    ref, out, st = _decode(target, heads, tree, prompts[:batch], 40)
    assert out == ref and all(len(o) == 40 for o in out)
    # the tree paths were really exercised: candidates accepted, fewer steps than tokens
    assert max(st.accepted_hist) >= 2 and st.acceleration_rate > 1.2
    assert st.decode_tokens == batch * 39 and st.seq_steps < st.decode_tokens


def test_runner_greedy_equals_hugging_face(target, prompts):
    from infersim.executor.medusa.decode import greedy_decode, make_cache
    from infersim.executor.models import hf_greedy_generate

    lm, runner = target
    ref = hf_greedy_generate(lm.model, prompts[:2], [24, 24])
    out, _ = greedy_decode(runner, make_cache(runner, prompts[:2], 24, 1, "cpu"), prompts[:2], 24)
    assert out == ref


def test_typical_acceptance_limits(target, trained, prompts):
    heads, _ = trained
    tree = build_tree("cartesian", heads=heads.num_heads, sizes=[2, 2, 1])
    # temperature 0: p is one-hot, typical acceptance is greedy acceptance
    ref, out, st0 = _decode(target, heads, tree, prompts, 30, Acceptance("typical", temperature=0.0))
    assert out == ref
    # epsilon 0: the threshold is 0, every candidate passes: every step takes the full depth
    _, _, st = _decode(target, heads, tree, prompts, 30, Acceptance("typical", temperature=0.7, epsilon=0.0))
    assert set(st.accepted_hist) == {tree.depth}
    # threshold min(1, delta e^-H) = 1 for a huge delta: nothing passes, one (greedy) token per step
    ref, out, st = _decode(target, heads, tree, prompts, 30, Acceptance("typical", 0.7, epsilon=1.0, delta=1e9))
    assert out == ref and set(st.accepted_hist) == {0} and st.acceleration_rate == 1.0


def test_tiny_training_is_deterministic_and_cached(target, tmp_path):
    from infersim.executor.medusa.store import ensure_heads, heads_dir, heads_key
    from infersim.executor.medusa.train import corpus_streams

    lm, _ = target
    train_stream, _ = corpus_streams(lm.tokenizer, TINY_RECIPE.files_every)
    a, sa = train_heads(lm.model, train_stream, TINY_RECIPE)
    b, sb = train_heads(lm.model, train_stream, TINY_RECIPE)
    assert a.weights_sha256() == b.weights_sha256() and sa["final_loss"] == sb["final_loss"]
    c, _ = train_heads(lm.model, train_stream, dataclasses.replace(TINY_RECIPE, seed=1))
    assert c.weights_sha256() != a.weights_sha256()
    # cached by (target weights, recipe): a second call loads, a different target hash is elsewhere
    h1, m1, f1 = ensure_heads(lm, TINY_RECIPE, root=tmp_path, log=lambda m: None)
    h2, m2, f2 = ensure_heads(lm, TINY_RECIPE, root=tmp_path, log=lambda m: None)
    assert f1 == f2 and m1["heads_sha256"] == m2["heads_sha256"] == a.weights_sha256()
    assert heads_key("0" * 64, TINY_RECIPE) != heads_key(m1["target_sha256"], TINY_RECIPE)
    assert heads_dir(lm, TINY_RECIPE, tmp_path) == f1
    acc = np.array(m1["accuracies"]["greedy"]["per_rank"])
    assert acc.shape == (2, 10) and (acc.sum(1) <= 1 + 1e-9).all()


def test_heads_serve_a_half_precision_target(target, tmp_path):
    """Heads belong to the checkpoint, not to the precision it is served in: a bf16 (or, on a
    GPU, fp16) load of the target finds the heads trained for its fp32 weights, and where none
    exist trains them on an fp32 CPU copy, keyed the same (a half-precision target used to be
    refused: 'train Medusa heads on a cpu fp32 target')."""
    from infersim.executor.medusa.store import ensure_heads, heads_dir, target_sha256
    from infersim.executor.models import load_model

    lm, _ = target
    half = load_model(str(lm.path), "cpu", "bf16")
    assert target_sha256(half) == target_sha256(lm) == lm.meta["weights_sha256"]
    assert heads_dir(half) == heads_dir(lm)
    quiet = lambda m: None  # noqa: E731
    h1, m1, f1 = ensure_heads(half, TINY_RECIPE, root=tmp_path, log=quiet)  # trained on the fp32 copy
    h2, m2, f2 = ensure_heads(lm, TINY_RECIPE, root=tmp_path, log=quiet)  # found by the fp32 target
    assert f1 == f2 and m1["heads_sha256"] == m2["heads_sha256"]
    assert m1["target_sha256"] == lm.meta["weights_sha256"]


def test_a_half_precision_checkpoint_without_a_recorded_hash_loads_one_fp32_copy(target, tmp_path, monkeypatch):
    """A checkpoint of one's own (no zoo.json) served in bf16: its fp32 hash is taken on an fp32
    CPU copy, and the heads train on that same copy (one load, not one per use)."""
    import shutil

    from infersim.executor.medusa import store
    from infersim.executor.models import load_model

    lm, _ = target
    own = tmp_path / "own-target"
    shutil.copytree(lm.path, own, ignore=shutil.ignore_patterns("zoo.json"))
    half = load_model(str(own), "cpu", "bf16")
    assert not half.meta
    loads = []
    monkeypatch.setattr(store, "load_model", lambda *a, **k: loads.append(a) or load_model(*a, **k))
    _, meta, _ = store.ensure_heads(half, TINY_RECIPE, root=tmp_path / "heads", log=lambda m: None)
    assert len(loads) == 1 and loads[0][1:] == ("cpu", "fp32")
    assert meta["target_sha256"] == lm.meta["weights_sha256"]


def test_measured_accuracies_load_in_the_simulator(trained):
    from infersim.simulator.speculative.medusa_heads import load_accuracies
    from infersim.simulator.speculative.medusa_tree import expected_length

    table = load_accuracies("zoo-target")
    acc = table.rank_accuracies()
    heads, meta = trained
    assert acc.shape == (heads.num_heads, 10) and (acc.sum(1) <= 1).all()
    assert (np.diff(acc[:, 0]) < 0).all()  # later heads guess further ahead: less accurate
    if table.source.find(meta["key"]) >= 0:  # the recorded table comes from these very heads
        assert acc == pytest.approx(np.array(meta["accuracies"]["greedy"]["per_rank"]), abs=1e-4)
    # the simulator's Medusa path runs on them: tokens per step as the table predicts
    from infersim.simulator.metrics.summary import summarize
    from infersim.simulator.simulation import Simulation
    from infersim.simulator.workload.builder import build_requests

    spec = fixed_lengths_spec(
        "opt-1.3b",
        count=8,
        prompt_tokens=64,
        output_tokens=400,
        serving={"max_batch_size": 8},
        speculation={"method": "medusa", "medusa": {"accuracies": "zoo-target"}},
        seed=1,
    )
    sim = Simulation(spec, build_requests(spec, "."))
    sx = summarize(sim.run())["speculation"]
    assert sx["proposer"]["accuracies"] == "zoo-target" and sx["proposer"]["tree_nodes"] == len(table.tree) + 1
    want = expected_length([tuple(p) for p in table.tree], acc)
    assert sx["proposer"]["expected_tokens_per_step"] == pytest.approx(want)
    assert sx["acceleration_rate"] == pytest.approx(want, rel=0.1)


# ---- sim exec: Medusa in the speculative engine (arrivals, continuous batching) -----------------
def _medusa_decoder(target, trained, tree, gpu_blocks=96, max_batch_size=2, acc="greedy"):
    from infersim.executor.medusa.serve import MedusaDecoder, MedusaProposer
    from infersim.executor.speculative.target import TargetModel

    lm, _ = target
    heads, _ = trained
    tm = TargetModel(lm, gpu_blocks=gpu_blocks, block_size=8)
    return MedusaDecoder(tm, MedusaProposer(heads, tree, Acceptance(acc), lm.device), max_batch_size=max_batch_size)


def test_medusa_decoder_serves_arrivals_as_plain_greedy(target, trained, prompts):
    """Staggered arrivals, batch limit 2 (admissions while others run), output lengths 1, 2, 5
    and 23 (a prefill-only request, a root-only step, steps cut at the output length): the
    outputs are the target's greedy ones, every KV block comes back, and the rounds table adds up."""
    from infersim.executor.clock import Clock
    from infersim.executor.medusa.decode import greedy_decode, make_cache
    from infersim.executor.speculative.build import make_sequences

    heads, _ = trained
    tree = build_tree("cartesian", heads=heads.num_heads, sizes=[2, 2, 1])
    ps = [prompts[0], prompts[1], prompts[2], prompts[0][:20]]
    lens = [23, 1, 5, 2]
    _, runner = target
    ref, _ = greedy_decode(runner, make_cache(runner, ps, lens, 1, "cpu"), ps, lens)
    dec = _medusa_decoder(target, trained, tree)
    seqs = make_sequences(ps, lens, 1, arrival_s=[0.0, 0.0, 0.01, 0.02])
    out = dec.generate(seqs, clock=Clock(realtime=False))
    assert out == ref
    assert dec.target.cache.used_gpu == 0 and not dec.proposer.props  # every block and proposal released
    t = dec.stats.table()
    assert int(t["prefill_seqs"].sum()) == 4 and int(t["tokens_out"].sum()) == sum(lens)
    assert t["batch_size"].max() <= 2 and set(t["s"].tolist()) == {tree.depth}
    # candidates verified: nodes - 1 per sequence with a whole tree (one token left: root only)
    hist = dec.proposer.accepted_hist
    assert int(t["drafted_tokens"].sum()) == (tree.nodes - 1) * sum(hist.values())
    assert int(t["accepted_tokens"].sum()) == sum(k * c for k, c in hist.items())
    assert max(hist) >= 2  # the trees were really exercised
    assert dec.stats.recorder.rounds == sum(hist.values())


def test_medusa_proposals_are_scored_against_committed_tokens(target, trained):
    """Head j's rank-i guess from the hidden state at token index b counts as right when it equals
    token b + j + 2; positions past the sequence's end are not scored (hand-made history)."""
    from infersim.executor.medusa.serve import MedusaProposer

    heads, _ = trained
    tree = layout([(0,), (1,), (0, 0)], "t")  # 2 heads, top-2
    p = MedusaProposer(heads, tree, Acceptance("greedy"), "cpu")

    class S:
        rid = 7
        tokens = [10, 11, 12, 13, 14]

    # from index 1: head 1 guesses token 3 (13), head 2 token 4 (14); from index 2: token 4 and (past the end)
    p._history[7] = [(1, [[13, 99], [98, 14]]), (2, [[97, 96], [1, 2]])]
    p.release(S)
    assert p.scored.tolist() == [2, 1]
    assert p.hits.tolist() == [[1, 0], [0, 1]]
    assert p.per_rank().tolist() == [[0.5, 0.0], [0.0, 1.0]]
    assert 7 not in p._history


def test_medusa_serving_refuses_what_it_cannot_run(target, trained):
    from infersim.executor.medusa.serve import acceptance_for, resolve_tree
    from infersim.simulator.speculative.config import SpeculationSection

    heads, _ = trained
    with pytest.raises(InfersimError, match="rejection sampling"):
        acceptance_for(
            SpeculationSection.model_validate(
                {"method": "medusa", "sampling": {"mode": "sampling", "temperature": 0.7}}
            )
        )
    assert (
        acceptance_for(
            SpeculationSection.model_validate({"method": "medusa", "sampling": {"mode": "typical", "temperature": 0.5}})
        ).mode
        == "typical"
    )
    with pytest.raises(InfersimError, match="heads"):
        resolve_tree(
            SpeculationSection.model_validate(
                {"method": "medusa", "medusa": {"accuracies": "zoo-target", "heads": 9}}
            ).medusa,
            heads.num_heads,
        )
    # the default section: the simulator's tree (the Vicuna table's mc_sim_7b_63), cut to the trained heads
    from infersim.simulator.speculative.medusa_heads import load_accuracies
    from infersim.simulator.speculative.medusa_tree import restrict

    lay, table, used = resolve_tree(SpeculationSection.model_validate({"method": "medusa"}).medusa, heads.num_heads)
    assert used == heads.num_heads and lay.depth <= heads.num_heads
    want = restrict([tuple(c) for c in load_accuracies("vicuna-7b").tree], heads.num_heads, 10)
    assert sorted(lay.paths) == sorted(want) and lay.nodes == len(want) + 1


def test_sim_exec_runs_a_medusa_workload_and_feeds_the_simulator(target, trained, tmp_path):
    import json

    import pyarrow.parquet as pq

    from infersim.cli.main import main
    from infersim.executor.medusa import recorded_statistics, simulator_updates
    from infersim.executor.models import hf_greedy_generate

    lm, _ = target
    wl = zoo_workload(
        "zoo-medusa",
        max_batch_size=3,
        rate=60.0,
        output_tokens=(8, 30),
        seed=3,
        speculation={
            "method": "medusa",
            "sampling": {"mode": "greedy"},
            "medusa": {"accuracies": "zoo-target", "tree": {"type": "greedy", "nodes": 8}},
        },
    )
    path = write_yaml(tmp_path / "wl.yaml", wl)
    out = tmp_path / "run"
    assert main(["exec", "-w", str(path), "-m", "zoo-target", "--fast", "--no-plots", "-q", "-o", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    sx = s["speculation"]
    assert s["finished"] == 6 and sx["executed"] and sx["method"] == "medusa" and sx["medusa"]["tree_nodes"] == 8
    rounds = pq.read_table(out / "speculation_rounds.parquet").to_pydict()
    o = pq.read_table(out / "outputs.parquet").to_pydict()
    assert sum(rounds["tokens_out"]) == sum(len(x) for x in o["output_ids"])
    assert o["output_ids"] == hf_greedy_generate(lm.model, o["prompt_ids"], [len(x) for x in o["output_ids"]])
    # the validation hooks: measured accuracies, tokens per step, and a workload the simulator runs
    st = recorded_statistics(out)
    hist = st["accepted_hist"]
    assert st["tokens_per_tree_step"] == pytest.approx(sum((k + 1) * c for k, c in hist.items()) / sum(hist.values()))
    assert len(st["per_rank"]) == st["heads"] == 4 and all(sum(r) <= 1 for r in st["per_rank"])
    upd = simulator_updates(st)
    from infersim.simulator.metrics.summary import summarize
    from infersim.simulator.simulation import Simulation
    from infersim.simulator.workload.builder import build_requests
    from infersim.simulator.workload.schema import WorkloadSpec

    wl2 = dict(wl, model="opt-1.3b")
    wl2["speculation"] = {**wl["speculation"], "medusa": upd["speculation"]["medusa"]}
    spec = WorkloadSpec.model_validate(wl2)
    px = summarize(Simulation(spec, build_requests(spec, ".")).run())["speculation"]["proposer"]
    # the run's own accepted-depth distribution on its tree (6 requests: too few per request)
    assert "per_request" not in st
    assert px["tree_nodes"] == 8 and px["expected_tokens_per_step"] == pytest.approx(st["tokens_per_tree_step"])
    # without it: the independent-heads model from the run's accuracies
    wl2["speculation"]["medusa"] = simulator_updates(st, empirical=False)["speculation"]["medusa"]
    spec = WorkloadSpec.model_validate(wl2)
    px = summarize(Simulation(spec, build_requests(spec, ".")).run())["speculation"]["proposer"]
    assert px["expected_tokens_per_step"] == pytest.approx(st["predicted_tokens_per_tree_step"])
    # and the per-sequence table holds every verified sequence-step
    q = pq.read_table(out / "speculation_sequences.parquet").to_pydict()
    # (accepted as kept: a step past a request's end is cut, so tokens gained = accepted + 1)
    assert len(q["rid"]) == sum(rounds["verify_seqs"])
    assert sum(q["accepted"]) + len(q["rid"]) == sum(rounds["tokens_out"]) - sum(rounds["prefill_seqs"])


def test_fit_depth_mixture_by_hand():
    from infersim.executor.medusa.validate_hooks import fit_depth_mixture

    # 16 requests always accept depth 0, 16 always depth 3 (no noise): groups kept as they are
    rid = np.repeat(np.arange(32), 10)
    acc = np.where(rid < 16, 0, 3)
    fit = fit_depth_mixture(rid, np.full(rid.size, 3), acc, 3)
    assert fit["shrink"] == pytest.approx(1.0) and fit["weights"] == [0.25] * 4
    assert fit["group_mean_depth"] == [0.0, 0.0, 3.0, 3.0]
    assert fit["components"][0] == [1.0, 0.0, 0.0, 0.0] and fit["components"][3] == [0.0, 0.0, 0.0, 1.0]
    # steps cut short (drafted length below the depth) are left out
    assert fit_depth_mixture(rid, np.full(rid.size, 2), acc, 3) is None


def test_medusa_train_says_when_it_loaded_cached_heads(trained, capsys):
    # the default heads exist (shipped with the zoo or trained by the fixture): the command
    # loads them and says so, instead of reporting their old training time as if it just ran
    from infersim.cli.main import main

    assert main(["medusa-train", "--model", "zoo-target"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"loaded from the cache; trained in {trained[1]['train_seconds']:.0f} s" in out
