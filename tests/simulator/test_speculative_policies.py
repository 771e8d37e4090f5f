"""Speculative decoding policy objects on their own (no SimPy): acceptance models, the
majority-voted speculator, SSM weights, the length selector, Medusa trees, the pool rule."""

import numpy as np
import pytest

from infersim.simulator.errors import InfersimError, UnknownNameError
from infersim.simulator.speculative.acceptance import (
    EmpiricalAcceptance,
    IIDAcceptance,
    PositionalAcceptance,
    build_model,
    load_table,
    resolve_model,
)
from infersim.simulator.speculative.config import AcceptanceRef, AcceptanceSpec, SpeculationSection
from infersim.simulator.speculative.medusa_heads import expected_accept_length, load_accuracies
from infersim.simulator.speculative.medusa_tree import (
    TreeSampler,
    cartesian_nodes,
    cartesian_tree,
    choices_tree,
    expected_length,
    expected_length_exclusive,
    greedy_tree,
)
from infersim.simulator.speculative.minions import (
    MajorityVoter,
    PoolBackPressure,
    SSMWeights,
    TokenTree,
    agreement_outputs,
    draw_agreement_lengths,
    vote_agreement,
)
from infersim.simulator.speculative.sampling import convert_rank_accuracies, convert_token_acceptance
from infersim.simulator.speculative.selector import AdaptiveLengthSelector, fitted_slope
from tests.utils import fixed_lengths_spec, poisson


# ---- acceptance -----------------------------------------------------------------------------
@pytest.mark.parametrize("alpha,s", [(0.87, 4), (0.54, 6), (0.3, 3), (0.95, 12)])
def test_iid_expected_tokens_formula_matches_monte_carlo(alpha, s):
    m = IIDAcceptance(alpha)
    formula = (1 - alpha ** (s + 1)) / (1 - alpha)
    assert m.expected_tokens(s) == pytest.approx(formula, rel=1e-12)
    # the generic survival sum agrees with the closed form
    assert 1 + m.survival(s).sum() == pytest.approx(formula, rel=1e-12)
    draws = m.sample(np.random.default_rng(7), s, 200_000)
    assert draws.min() >= 0 and draws.max() <= s
    se = draws.std() / np.sqrt(draws.size)
    assert abs(draws.mean() + 1 - formula) < 5 * se + 1e-3


def test_positional_and_empirical_models():
    pos = PositionalAcceptance([0.9, 0.5])
    assert pos.survival(4) == pytest.approx([0.9, 0.45, 0.225, 0.1125])  # last value repeats
    assert pos.pmf(2) == pytest.approx([0.1, 0.45, 0.45])
    counts = [10, 20, 30, 40]  # accepted 0..3 at s = 3
    emp = EmpiricalAcceptance(counts, 3)
    assert emp.pmf(3) == pytest.approx(np.array(counts) / 100)
    # hazards: S = [.9, .7, .4] -> .9, .7/.9, .4/.7; tail = their geometric mean
    h = [0.9, 0.7 / 0.9, 0.4 / 0.7]
    assert emp.conditional(3) == pytest.approx(h)
    assert emp.tail == pytest.approx(float(np.exp(np.mean(np.log(h)))))
    draws = emp.sample(np.random.default_rng(1), 3, 100_000)
    assert np.bincount(draws, minlength=4) / draws.size == pytest.approx(np.array(counts) / 100, abs=0.01)


def test_acceptance_never_exceeds_s_per_round():
    m = IIDAcceptance(0.99)
    s = np.array([0, 1, 2, 5, 0, 3] * 1000)
    a = m.sample(np.random.default_rng(0), s)
    assert np.all(a <= s) and np.all(a[s == 0] == 0)
    assert (a == s).mean() > 0.9


def test_catalog_tables_resolve_with_sources():
    t = load_table("opt-13b")
    assert t.find("opt-125m", "finance").alpha == 0.87
    assert load_table("llama-2-70b").find("llama-160m", "chatbot").alpha == 0.49
    assert all(e.source for e in t.entries)
    ref = AcceptanceRef(table="llama-2-70b", draft="llama-160m")
    assert resolve_model(ref, "dialogue").alpha == 0.55
    with pytest.raises(InfersimError):
        resolve_model(ref, None)  # several datasets: must say which
    with pytest.raises(UnknownNameError):
        load_table("no-such-table")


def test_sampling_conversion_directions():
    spec = AcceptanceSpec(kind="iid", alpha=0.8)
    assert build_model(spec, "greedy", 0.0).alpha == 0.8
    assert build_model(spec, "sampling", 0.0).alpha == 0.8  # temperature 0 is greedy
    # a round trip through another setting comes back
    v = convert_token_acceptance(0.7, ("greedy", 0), ("sampling", 0.7))
    assert convert_token_acceptance(v, ("sampling", 0.7), ("greedy", 0)) == pytest.approx(0.7, abs=1e-6)
    acc = load_accuracies("vicuna-7b").rank_accuracies()
    typ = convert_rank_accuracies(acc, "typical", 0.7)
    assert np.array_equal(typ.acc, acc) and np.all((typ.extra >= 0) & (typ.extra <= 1)) and typ.extra[0, 1] > 0
    rs = convert_rank_accuracies(acc, "sampling", 0.7)
    assert rs.extra is None and np.all(rs.acc <= acc + 1e-12)  # matching a sampled token is harder than the argmax
    hot = convert_rank_accuracies(acc, "typical", 1.0)
    assert hot.extra[0, 1] > typ.extra[0, 1]  # typical acceptance accepts more as temperature rises (Medusa 2.3.1)
    assert convert_rank_accuracies(acc, "typical", 0.0).extra is None  # temperature 0: greedy


# ---- majority vote ---------------------------------------------------------------------------
def test_voter_heaviest_child_walk_on_the_papers_example():
    # Minions Figure 5: SSM1 "I like apple", SSM2 "I like pear", SSM3 "I likes it"
    outs = [["I", "like", "apple"], ["I", "like", "pear"], ["I", "likes", "it"]]
    r = MajorityVoter([0.5, 0.3, 0.6]).vote(outs)  # w1 + w2 > w3 and w1 > w2
    assert r.tokens == ["I", "like", "apple"] and r.voted == 0
    r = MajorityVoter([0.2, 0.3, 0.6]).vote(outs)  # w3 > w1 + w2: 'likes' wins
    assert r.tokens == ["I", "likes", "it"] and r.voted == 2
    r = MajorityVoter([0.3, 0.5, 0.6]).vote(outs)  # 'like' (0.8) then 'pear' (0.5)
    assert r.voted == 1
    tree = TokenTree(outs, [0.5, 0.3, 0.6])
    like = tree.root.children["I"].children["like"]
    assert like.weight == pytest.approx(0.8) and like.ssms == [0, 1]
    # identical outputs share a leaf: the heavier SSM is the voted one
    assert MajorityVoter([1.0, 2.0]).vote([[1, 2], [1, 2]]).voted == 1
    # a tie between children goes to the child holding the heavier single SSM
    assert MajorityVoter([1.0, 1.0, 2.0]).vote([[1, 5], [1, 6], [2, 7]]).voted == 2


def test_vectorised_vote_equals_tree_walk():
    rng = np.random.default_rng(5)
    for _ in range(400):
        m = int(rng.integers(1, 5))
        s = int(rng.integers(0, 6))
        w = rng.choice([0.5, 1.0, 1.5, 2.0], size=m)
        L = rng.integers(0, s + 1, size=(1, m))
        expect = TokenTree(agreement_outputs(L[0], s), w).heaviest_path()[1]
        assert vote_agreement(L, w, s)[0] == expect, (L, w, s)
        prio = rng.random((1, m))
        expect = TokenTree(agreement_outputs(L[0], s), w, prio[0]).heaviest_path()[1]
        assert vote_agreement(L, w, s, prio)[0] == expect, (L, w, s, prio)
    # many requests at once, each with its own s and priorities
    L = rng.integers(0, 5, size=(200, 3))
    s = rng.integers(0, 5, size=200)
    L = np.minimum(L, s[:, None])
    prio = rng.random((200, 3))
    w = [1.0, 1.0, 2.0]
    got = vote_agreement(L, w, s, prio)
    for r in range(200):
        assert got[r] == TokenTree(agreement_outputs(L[r], int(s[r])), w, prio[r]).heaviest_path()[1]


def test_vote_follows_the_heaviest_agreeing_ssm():
    """A strong SSM with the largest weight is never worse off voted than alone: when it is
    the voted one its own length counts, and another SSM is voted only after it has diverged."""
    from infersim.simulator.speculative.acceptance import IIDAcceptance as I

    models = [I(0.33), I(0.33), I(0.55)]
    L = draw_agreement_lengths(np.random.default_rng(0), models, 4, 50_000, 0.5)
    voted = vote_agreement(L, [0.7, 0.8, 1.6], 4)
    assert np.all(L[np.arange(len(voted)), voted] >= L[:, 2])
    # equal weights: a tie among a lone right SSM and two lone wrong ones is a coin toss
    equal = vote_agreement(L, [1.0, 1.0, 1.0], 4, np.random.default_rng(1).random(L.shape))
    assert 0.2 < (equal == 2).mean() < 0.8


def test_agreement_draws_follow_each_model_and_correlation():
    models = [IIDAcceptance(0.9), IIDAcceptance(0.4)]
    L = draw_agreement_lengths(np.random.default_rng(2), models, 4, 50_000, correlation=0.0)
    assert L.max() <= 4
    assert L[:, 0].mean() == pytest.approx(models[0].expected_accepted(4), abs=0.03)
    assert L[:, 1].mean() == pytest.approx(models[1].expected_accepted(4), abs=0.03)
    same = draw_agreement_lengths(np.random.default_rng(2), [models[0], models[0]], 4, 5000, correlation=1.0)
    assert np.array_equal(same[:, 0], same[:, 1])


def _weights(n: int, reward_above: float, punish_below: float, mode: str, **kw) -> SSMWeights:
    """`n` SSMs at weight 1: rewarded x2 above an ACR of `reward_above`, punished x0.5 below
    `punish_below` (ACRs or, in the relative mode, fractions of their mean)."""
    return SSMWeights(
        np.ones(n),
        reward_threshold=reward_above,
        punish_threshold=punish_below,
        reward_factor=2.0,
        punish_factor=0.5,
        threshold_mode=mode,
        **kw,
    )


def _absolute(**kw) -> SSMWeights:
    """Three SSMs at weight 1: rewarded x2 above an ACR of 0.7, punished x0.5 below 0.3."""
    return _weights(3, 0.7, 0.3, "absolute", **kw)


def test_weight_updates_by_hand():
    w = _absolute(normalize=False)
    acrs = w.update(voted=[0, 0, 1, 2], rates=[0.8, 1.0, 0.2, 0.5])
    assert acrs == pytest.approx({0: 0.9, 1: 0.2, 2: 0.5})
    assert w.weights == pytest.approx([2.0, 0.5, 1.0])  # rewarded, punished, untouched
    w.update(voted=[1], rates=[0.7])  # exactly at the threshold: neither
    assert w.weights == pytest.approx([2.0, 0.5, 1.0])
    n = _absolute()
    n.update(voted=[0, 0, 1, 2], rates=[0.8, 1.0, 0.2, 0.5])
    assert n.weights == pytest.approx(np.array([2.0, 0.5, 1.0]) * 3 / 3.5)  # renormalised to sum 3
    rel = _weights(2, 1.1, 0.9, "relative", ema=1.0, normalize=False)
    rel.update(voted=[0, 1], rates=[0.9, 0.3])  # mean 0.6: 0.9 > 0.66 rewarded, 0.3 < 0.54 punished
    assert rel.weights == pytest.approx([2.0, 0.5])
    # weighted-majority reading: every SSM scored on every output, voted or not
    wm = _absolute(normalize=False)
    acrs = wm.update_all(np.array([[1.0, 0.25, 0.5], [0.5, 0.25, 0.5]]))
    assert acrs == pytest.approx({0: 0.75, 1: 0.25, 2: 0.5})
    assert wm.weights == pytest.approx([2.0, 0.5, 1.0])


# ---- selector -----------------------------------------------------------------------------------
def test_selector_moves_with_the_fitted_slope():
    assert fitted_slope([1, 2, 3, 4]) == pytest.approx(1.0)
    assert fitted_slope([5, 3, 1]) == pytest.approx(-2.0)
    up = AdaptiveLengthSelector(s=5, decision_threshold=4, rule="paper")
    changed = [up.observe(t, 1.0) for t in (1.0, 1.1, 1.2, 1.3)]  # t/vl rising: punish
    assert changed == [False, False, False, True] and up.s == 4
    down = AdaptiveLengthSelector(s=5, decision_threshold=4, rule="paper")
    for t in (1.3, 1.2, 1.1, 1.0):  # falling: reward
        down.observe(t, 1.0)
    assert down.s == 6
    # the fit spans the previous setting's samples: old high, new low -> reward again
    for t in (0.9, 0.9, 0.9, 0.9):
        down.observe(t, 1.0)
    assert down.s == 7
    # literal paper rule after a decrease that hurt: decreases again; directional turns back
    for rule, expect in (("paper", 3), ("directional", 5)):
        sel = AdaptiveLengthSelector(s=5, decision_threshold=3, rule=rule)
        for t in (1.0, 1.1, 1.2):
            sel.observe(t, 1.0)  # rising -> 4 (a decrease)
        assert sel.s == 4
        for t in (1.3, 1.4, 1.5):  # worse still
            sel.observe(t, 1.0)
        assert sel.s == expect, rule
    # vl divides: the same times with longer verified lengths read as falling
    sel = AdaptiveLengthSelector(s=2, decision_threshold=3)
    for t, vl in ((1.0, 1.0), (1.0, 2.0), (1.0, 3.0)):
        sel.observe(t, vl)
    assert sel.s == 3
    capped = AdaptiveLengthSelector(s=12, decision_threshold=2, s_max=12)
    for t in (2.0, 1.0):
        capped.observe(t, 1.0)
    assert capped.s == 12


def test_back_pressure_rule():
    bp = PoolBackPressure(16)
    assert bp.ssm_may_run(15) and not bp.ssm_may_run(16) and not bp.ssm_may_run(40)
    assert PoolBackPressure(16, enabled=False).ssm_may_run(100)


# ---- Medusa trees ---------------------------------------------------------------------------------
def test_tree_expected_length_by_hand_and_mc_sim_7b_63():
    acc = np.array([[0.5, 0.2, 0.1], [0.4, 0.3, 0.1]])
    tiny = [(0,), (0, 0), (1,)]
    assert expected_length_exclusive(tiny, acc) == pytest.approx(1 + 0.5 + 0.5 * 0.4 + 0.2)
    table = load_accuracies("vicuna-7b")
    a = table.rank_accuracies()
    tree = choices_tree(table.tree)
    assert len(tree) + 1 == 64 and max(len(p) for p in tree) == 4
    by_hand = 1 + sum(np.prod([a[d, i] for d, i in enumerate(p)]) for p in table.tree)
    assert expected_length_exclusive(tree, a) == pytest.approx(by_hand)
    assert expected_length_exclusive(tree, a) == pytest.approx(expected_accept_length(table.tree, a))


def test_greedy_tree_beats_cartesian_of_the_same_size():
    a = load_accuracies("vicuna-7b").rank_accuracies()
    for sizes in ([2, 2], [3, 3, 2], [4, 4, 4], [5, 3, 2, 2], [10, 10], [4, 4, 4, 3]):
        cart = cartesian_tree(sizes)
        n = cartesian_nodes(sizes)
        assert len(cart) + 1 == n
        greedy = greedy_tree(a, n)
        assert len(greedy) + 1 == n
        assert expected_length_exclusive(greedy, a) >= expected_length_exclusive(cart, a) - 1e-12, sizes
    # Medusa Fig. 4a: a 64-node greedy tree above the best dense tree of up to 256 nodes
    best_dense = max(
        expected_length_exclusive(cartesian_tree(s), a)
        for s in ([10, 10], [10, 10, 1], [6, 6, 6], [5, 5, 5], [4, 4, 4, 3], [3, 3, 3, 3], [2, 2, 2, 2, 2])
        if cartesian_nodes(s) <= 256
    )
    assert expected_length_exclusive(greedy_tree(a, 64), a) > best_dense


def test_tree_sampler_matches_expectations():
    a = load_accuracies("vicuna-7b").rank_accuracies()
    tree = greedy_tree(a, 24)
    rng = np.random.default_rng(3)
    extra = convert_rank_accuracies(a, "typical", 0.7).extra
    for ex in (None, extra):
        smp = TreeSampler(tree, a, ex)
        d = smp.sample(rng, 100_000)
        assert d.max() <= smp.depth
        se = d.std() / np.sqrt(d.size)
        assert abs(1 + d.mean() - smp.expected()) < 5 * se + 1e-3
    # typical acceptance adds at most one token over the exact-match path, and never loses one
    assert expected_length(tree, a) <= expected_length(tree, a, extra) <= expected_length(tree, a) + 1
    # by hand: root with children (0,) and (1,) only; P(typical gain) = P(no exact match at depth 1)
    # * (1 - (1 - e0)(1 - e1))
    e = np.zeros_like(a)
    e[0, 0], e[0, 1] = 0.5, 0.2
    small = [(0,), (1,)]
    by_hand = 1 + a[0, 0] + a[0, 1] + (1 - a[0, 0] - a[0, 1]) * (1 - 0.5 * 0.8)
    assert expected_length(small, a, e) == pytest.approx(by_hand)


def test_config_validation():
    with pytest.raises(ValueError):
        SpeculationSection.model_validate(
            {"method": "medusa", "drafts": [{"model": "opt-125m", "acceptance": {"kind": "iid", "alpha": 0.5}}]}
        )
    with pytest.raises(ValueError):
        SpeculationSection.model_validate({"method": "draft"})
    with pytest.raises(ValueError):
        SpeculationSection.model_validate(
            {"method": "draft", "drafts": [{"model": "opt-125m", "acceptance": {"kind": "iid"}}]}
        )
    sp = SpeculationSection.model_validate(
        {
            "method": "minions",
            "drafts": [
                {"model": "opt-125m", "acceptance": {"table": "opt-13b", "draft": "ssm-finance"}},
                {"model": "opt-125m", "acceptance": {"kind": "positional", "probs": [0.9, 0.8]}},
            ],
            "pipeline": {"enabled": False},
        }
    )
    assert sp.voting_on and sp.selector_on and not sp.pipeline_on


# ---- Medusa Fig. 4a read faithfully -----------------------------------------
def test_dense_tree_counts_every_node_not_only_candidates():
    """Section 2.1.2: a Cartesian tree adds s_1 + s_1 s_2 + ... tokens; 4x4x4x4 has 256 paths
    (leaves) but 341 nodes with the root, 6x6x6 259."""
    assert cartesian_nodes([2, 3]) == 1 + 2 + 6 and len(cartesian_tree([2, 3])) == 8
    assert cartesian_nodes([4, 4, 4, 4]) == 341 and sum(len(p) == 4 for p in cartesian_tree([4, 4, 4, 4])) == 256
    assert cartesian_nodes([6, 6, 6]) == 259
    a = np.array([[0.5, 0.2, 0.1], [0.4, 0.3, 0.1]])
    # 2x2 by hand: 1 + (a00 + a01) + (a00 + a01) * (a10 + a11)
    assert expected_length_exclusive(cartesian_tree([2, 2]), a) == pytest.approx(1 + 0.7 + 0.7 * 0.7)


def test_dependent_heads_reduce_to_independence_and_favour_sparse_trees():
    from infersim.analysis.reproduce.medusa_trees import (
        dense_settings,
        dependent_greedy,
        dependent_path_probability,
        dependent_rate,
    )

    a = load_accuracies("vicuna-7b").rank_accuracies()
    # by hand: path (1, 0, 2) has one off-top ancestor (the 1; the last index is the node's own guess)
    assert dependent_path_probability((1, 0, 2), a, 0.5) == pytest.approx(a[0, 1] * a[1, 0] * a[2, 2] * 0.5)
    for n in (8, 64):  # d = 1 is Medusa's independence: same tree value as the simulator's greedy tree
        assert dependent_rate(dependent_greedy(a, n, 1.0), a, 1.0) == pytest.approx(
            expected_length(greedy_tree(a, n), a)
        )
    for d in (1.0, 0.6):  # the greedy construction is never below a Cartesian tree of the same size under its own model
        for sizes in ([3, 3, 2], [4, 4, 4], [5, 5, 4, 1]):
            n = cartesian_nodes(sizes)
            assert (
                dependent_rate(dependent_greedy(a, n, d), a, d) >= dependent_rate(cartesian_tree(sizes), a, d) - 1e-12
            )
    # dependence costs a dense tree (most nodes below off-top guesses) more than the greedy one
    dense = [s for s in dense_settings(a.shape[1], a.shape[0], 256) if cartesian_nodes(s) >= 193]
    lead = []
    for d in (1.0, 0.6):
        g64 = dependent_rate(dependent_greedy(a, 64, d), a, d)
        lead.append(g64 - max(dependent_rate(cartesian_tree(s), a, d) for s in dense))
    assert abs(lead[0]) < 0.02  # independent heads: a tie within 1% (docs/findings/medusa.md)
    assert lead[1] > 0 and lead[1] > lead[0]


def test_pipegain_table_ideal_bound_and_interpolation_by_hand():
    import pandas as pd

    from infersim.analysis.reproduce.minions import overhead_for_gain, pipegain_table

    rows = []
    for ov, tc, f, ts in ((0.0, 100.0, 0.25, 120.0), (1000.0, 80.0, 0.5, 140.0)):
        for label, tput, ssm in (
            ("coupled", tc, f),
            ("pipelined shared", ts, 0.4),
            ("pipelined separate", ts + 5, 0.3),
        ):
            rows.append(
                {
                    "study": "pipegain",
                    "pair": "opt-13b",
                    "overhead_us": ov,
                    "selector": False,
                    "label": label,
                    "throughput_tok_s": tput,
                    "ssm_busy_frac": ssm,
                    "llm_busy_frac": 1.0,
                    "s_mean": 4.0,
                    "acceleration_rate": 3.0,
                    "pool_mean": 1.0,
                }
            )
    pg = pipegain_table(pd.DataFrame(rows))
    r0, r1 = pg.iloc[0], pg.iloc[1]
    assert r0["ideal_gain_pct"] == pytest.approx(100 / 3) and r1["ideal_gain_pct"] == pytest.approx(100.0)
    assert r0["shared_gain_pct"] == pytest.approx(20.0) and r1["shared_gain_pct"] == pytest.approx(75.0)
    # 34.27% lies between 20% (0 us) and 75% (1000 us): linear interpolation
    assert overhead_for_gain(pg, "opt-13b", "4", "shared_gain_pct", 34.27) == pytest.approx(1000 * 14.27 / 55)
    assert np.isnan(overhead_for_gain(pg, "opt-13b", "4", "shared_gain_pct", 90.0))


# ---- per-request acceptance (mixture) and empirical Medusa depths ------------------------------
def test_mixture_mean_is_the_weighted_mean_and_levels_pick_components():
    from infersim.simulator.speculative.acceptance import MixtureAcceptance

    spec = AcceptanceSpec.model_validate(
        {
            "kind": "mixture",
            "weights": [0.7, 0.3],
            "components": [{"kind": "iid", "alpha": 0.9}, {"kind": "iid", "alpha": 0.5}],
        }
    )
    m = build_model(spec)
    assert isinstance(m, MixtureAcceptance) and m.per_request
    e = lambda a, s: (1 - a ** (s + 1)) / (1 - a)
    for s in (1, 4, 7):
        want = 0.7 * e(0.9, s) + 0.3 * e(0.5, s)
        assert m.expected_tokens(s) == pytest.approx(want, rel=1e-12)
        assert 1 + m.survival(s).sum() == pytest.approx(want, rel=1e-12)  # the marginal's survival agrees
    # hardest first: levels below 0.3 are the alpha 0.5 component, the rest alpha 0.9
    assert m.component_index([0.0, 0.29, 0.31, 0.99]).tolist() == [0, 0, 1, 1]
    u = np.random.default_rng(1).random(100_000)
    hard = m.from_uniform_at(u, 4, np.full(u.size, 0.1))
    easy = m.from_uniform_at(u, 4, np.full(u.size, 0.9))
    assert (hard == IIDAcceptance(0.5).from_uniform(u, 4)).all() and (
        easy == IIDAcceptance(0.9).from_uniform(u, 4)
    ).all()
    # without levels: the marginal, whose mean is the weighted mean
    assert m.from_uniform_at(u, 4).mean() + 1 == pytest.approx(m.expected_tokens(4), abs=0.02)


def test_mixture_spreads_per_request_tokens_per_round_as_specified():
    """400 requests x 30 rounds: the variance of per-request means is the between-component
    variance (hand-computed) plus the within-request noise / 30; i.i.d. rounds have only the latter."""
    from infersim.simulator.speculative.acceptance import MixtureAcceptance

    comps = [IIDAcceptance(0.4), IIDAcceptance(0.9)]
    m = MixtureAcceptance(comps, [0.5, 0.5])
    n_req, n_rounds, s = 400, 30, 4
    levels = np.repeat((np.arange(n_req) + 0.5) / n_req, n_rounds)
    u = np.random.default_rng(3).random(levels.size)
    per_req = (m.from_uniform_at(u, s, levels) + 1).reshape(n_req, n_rounds).mean(axis=1)
    iid = (m.from_uniform_at(u, s) + 1).reshape(n_req, n_rounds).mean(axis=1)
    e = np.array([c.expected_tokens(s) for c in comps])
    var_k = lambda c: float(np.arange(s + 1) ** 2 @ c.pmf(s) - (np.arange(s + 1) @ c.pmf(s)) ** 2)
    between = float(np.var(e))  # equal weights: ((e1 - e0) / 2)^2
    within = np.mean([var_k(c) for c in comps]) / n_rounds
    assert per_req.mean() == pytest.approx(e.mean(), abs=0.05)
    assert per_req.var() == pytest.approx(between + within, rel=0.15)
    assert iid.var() < 0.25 * per_req.var()


def test_mixture_spec_is_validated():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="components"):
        AcceptanceSpec.model_validate({"kind": "mixture"})
    with pytest.raises(ValidationError, match="weight"):
        AcceptanceSpec.model_validate(
            {"kind": "mixture", "weights": [1.0], "components": [{"kind": "iid", "alpha": 0.5}] * 2}
        )
    with pytest.raises(ValidationError, match="mixtures"):
        AcceptanceSpec.model_validate(
            {"kind": "mixture", "components": [{"kind": "mixture", "components": [{"kind": "iid", "alpha": 0.5}]}]}
        )


def test_request_levels_depend_on_seed_and_id_only():
    from infersim.simulator.speculative.proposers import level_offset, request_levels

    off = level_offset(7)
    a = request_levels(off, [5, 1, 9])
    assert request_levels(off, [9, 5]).tolist() == [a[2], a[0]]  # order does not matter
    lv = request_levels(off, np.arange(40))
    # a Weyl sequence: every quarter of [0, 1) holds 10 +- 1 of 40 consecutive requests
    assert np.all(np.abs(np.histogram(lv, bins=4, range=(0, 1))[0] - 10) <= 1)
    assert level_offset(8) != off


def test_empirical_medusa_sampler_reproduces_its_own_distribution():
    from infersim.simulator.speculative.medusa_tree import EmpiricalTreeSampler

    counts = [10, 20, 30, 40]
    smp = EmpiricalTreeSampler(np.array(counts, dtype=float))
    assert smp.depth == 3 and smp.expected() == pytest.approx(1 + (20 + 60 + 120) / 100)
    d = smp.sample(np.random.default_rng(0), 200_000)
    assert np.bincount(d, minlength=4) / d.size == pytest.approx(np.array(counts) / 100, abs=0.005)
    # per request: a level picks one component (hardest first); no level: their mixture
    per = EmpiricalTreeSampler(np.array(counts, float), [[0, 0, 0, 1], [1, 0, 0, 0]], [0.25, 0.75])
    assert per.expected() == pytest.approx(1 + 0.25 * 3)
    rng = np.random.default_rng(1)
    assert (per.sample(rng, 50, np.full(50, 0.5)) == 0).all() and (per.sample(rng, 50, np.full(50, 0.9)) == 3).all()


def test_medusa_empirical_acceptance_replaces_independent_heads_on_its_tree():
    from infersim.simulator.metrics.summary import summarize
    from infersim.simulator.simulation import Simulation
    from infersim.simulator.workload.builder import build_requests

    tree = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
    counts = [5, 10, 25, 60]

    def spec(acc):
        return fixed_lengths_spec(
            "opt-1.3b",
            count=16,
            prompt_tokens=32,
            output_tokens=401,
            serving={"max_batch_size": 16},
            seed=2,
            speculation={
                "method": "medusa",
                "medusa": {"tree": {"type": "choices", "choices": tree}, **({"acceptance": acc} if acc else {})},
            },
        )

    sx = summarize(Simulation(spec({"counts": counts, "tree": tree}), build_requests(spec(None), ".")).run())[
        "speculation"
    ]
    want = 1 + (10 + 50 + 180) / 100
    assert sx["proposer"]["expected_tokens_per_step"] == pytest.approx(want)
    assert sx["acceleration_rate"] == pytest.approx(want, rel=0.03)  # long outputs: the histogram's mean
    with pytest.raises(InfersimError, match="another tree"):
        Simulation(spec({"counts": [1, 1, 1], "tree": [[0], [0, 0]]}), build_requests(spec(None), ".")).run()


@pytest.mark.parametrize("method", ["draft", "minions"])
def test_per_request_acceptance_in_the_engine(method):
    """A mixture in a simulation: deterministic, step mode equals event mode, and requests differ
    in tokens per round far more than under i.i.d. rounds with the same mean."""
    from infersim.simulator.metrics.summary import summarize
    from infersim.simulator.simulation import Simulation
    from infersim.simulator.workload.builder import build_requests

    mix = {
        "kind": "mixture",
        "weights": [0.5, 0.5],
        "components": [{"kind": "iid", "alpha": 0.3}, {"kind": "iid", "alpha": 0.9}],
    }
    e = lambda a: (1 - a**5) / (1 - a)
    mean = 0.5 * e(0.3) + 0.5 * e(0.9)
    alpha = 0.3 + (0.9 - 0.3) * 0.5  # any i.i.d. alpha will do as the narrow reference

    def run(acc, step_mode=False):
        spec = fixed_lengths_spec(
            "opt-1.3b",
            count=48,
            prompt_tokens=32,
            output_tokens=121,
            profile="a100-80gb-pcie:datasheet",
            arrival=poisson(400.0),
            serving={"max_batch_size": 16},
            seed=5,
            speculation={
                "method": method,
                "speculation_length": 4,
                "drafts": [{"model": "opt-125m", "acceptance": acc}] * (1 if method == "draft" else 2),
            },
        )
        res = Simulation(spec, build_requests(spec, "."), step_mode=step_mode).run()
        return res, summarize(res)["speculation"]

    a, sa = run(mix)
    b, sb = run(mix)
    c, _ = run(mix, step_mode=True)
    for col in ("first_token_s", "finish_s"):
        assert np.array_equal(a.requests[col], b.requests[col]) and np.array_equal(
            a.requests[col], c.requests[col]
        ), col
    assert sa["proposer"]["drafts"][0]["acceptance"]["kind"] == "mixture"
    # per request: 120 tokens after the first over (finish - first token) / TPOT rounds; use TPOT's spread
    tpot = lambda r: np.asarray(r.requests["finish_s"] - r.requests["first_token_s"])
    i, _ = run({"kind": "iid", "alpha": alpha})
    cv = lambda x: float(np.std(x) / np.mean(x))
    assert cv(tpot(a)) > 2 * cv(tpot(i))
    # hard requests take more rounds: per round, the mean is the harmonic mean of the components'
    # (each request yields 120 tokens after the first in 120 / e_j rounds), below the weighted mean
    harmonic = 1 / (0.5 / e(0.3) + 0.5 / e(0.9))
    assert sa["acceleration_rate"] == pytest.approx(harmonic, rel=0.06) and sa["acceleration_rate"] < 0.9 * mean
