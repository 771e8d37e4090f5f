"""The speculative validation's pieces that the misses of spec-draft, minions-adaptive and
minions-pipeline were traced to, by hand and without timing anything (fast, robust to a loaded
machine):

- per-request acceptance given by request id (`mixture.assignment`): the validation simulates
  the executor's requests by id, so it is told which were easy, as it is told their lengths;
- one definition of the acceptance rate on both sides (mean over speculating sequence-rounds);
- how many drafts the executor runs (voting off: the first alone) for the fit and the simulator;
- the adaptive-s selector fed the executor's own observations takes the executed trajectory;
  a replayed trajectory is keyed by observations, not rounds;
- whole-pass contention of the pipeline's two threads (simulator/speculative/device.py)."""

import json

import numpy as np
import pytest

from tests.utils import fixed_lengths_spec, requests_section


# ---- per-request acceptance by request id ---------------------------------------------------
def _mixture_spec(assignment=None):
    from infersim.simulator.speculative.config import AcceptanceSpec

    return AcceptanceSpec.model_validate(
        {
            "kind": "mixture",
            "weights": [0.5, 0.25, 0.25],
            # listed easy, hard, medium: the model orders them hardest first
            "components": [{"kind": "iid", "alpha": 0.9}, {"kind": "iid", "alpha": 0.1}, {"kind": "iid", "alpha": 0.5}],
            **({"assignment": assignment} if assignment is not None else {}),
        }
    )


def test_mixture_assignment_puts_each_request_in_its_component():
    from infersim.simulator.speculative.acceptance import build_model

    m = build_model(_mixture_spec({7: 0, 8: 1, 9: 2}))
    # hardest first: alpha 0.1 (w 0.25), 0.5 (w 0.25), 0.9 (w 0.5): levels at the interval middles
    assert [c.alpha for c in m.components] == [0.1, 0.5, 0.9]
    levels = m.assigned_levels([7, 8, 9, 10], np.array([0.01, 0.99, 0.01, 0.42]))
    assert levels.tolist() == pytest.approx([0.75, 0.125, 0.375, 0.42])  # 10 is not assigned: its own level
    assert m.component_index(levels).tolist() == [2, 0, 1, 1]
    # request 7 (assigned the easy component) draws from alpha 0.9 whatever its drawn level said
    u = np.random.default_rng(0).random(4000)
    easy = m.from_uniform_at(u, 4, m.assigned_levels([7] * u.size, np.zeros(u.size)))
    assert easy.mean() + 1 == pytest.approx(m.components[2].expected_tokens(4), rel=0.03)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"kind": "mixture", "components": [{"kind": "iid", "alpha": 0.5}], "assignment": {1: 1}}, "out of range"),
        ({"kind": "iid", "alpha": 0.5, "assignment": {1: 0}}, "'mixture' only"),
    ],
)
def test_bad_assignment_is_refused(bad, message):
    from infersim.simulator.speculative.config import AcceptanceSpec

    with pytest.raises(ValueError, match=message):
        AcceptanceSpec.model_validate(bad)


def test_acceptance_rate_is_the_simulators_mean_over_sequence_rounds():
    from infersim.executor.speculative.acceptance import AcceptanceRecorder
    from infersim.simulator.speculative.report import SpecStats, VerifiedRound

    rec = AcceptanceRecorder()
    for s, k in ((4, 2), (1, 1), (4, 0)):
        rec.add(s, k)
    # mean of 2/4, 1/1, 0/4; the pooled ratio is 3 / 9
    assert rec.mean_round_acceptance() == pytest.approx(0.5)
    assert rec.mean_acceptance() == pytest.approx(3 / 9)
    st = SpecStats([])
    k, a = np.array([4, 1, 4]), np.array([2, 1, 0])
    seqs = [type("S", (), {"rid": i})() for i in range(3)]
    st.round(VerifiedRound(0.0, seqs, k, a, a + 1, np.zeros(0, np.int64), a / k, 1e-3, 1e-3, 4))
    assert st.rate_sum / st.spec_seq_rounds == pytest.approx(rec.mean_round_acceptance())


# ---- drafts the executor runs -----------------------------------------------------------------
@pytest.mark.parametrize(
    "section, n",
    [
        ({"method": "minions", "voting": {"enabled": False}}, 1),
        ({"method": "minions"}, 3),
        ({"method": "draft", "voting": {"enabled": True}}, 3),
    ],
)
def test_drafts_run_follows_the_voting_switch(section, n):
    from infersim.analysis.validate.spec_rounds import drafts_run

    drafts = [{"model": f"zoo-draft-{x}", "acceptance": {"kind": "iid", "alpha": 0.5}} for x in "abc"]
    assert drafts_run({**section, "drafts": drafts}) == n
    assert drafts_run({"method": "medusa"}) == 0


def test_voting_off_is_simulated_with_the_first_draft_alone(tmp_path):
    """spec_simulate leaves voting as the run had it: the simulated section reads as the run's."""
    from types import SimpleNamespace

    from infersim.analysis.validate.spec_simulate import spec_sim_spec

    sp = {
        "method": "minions",
        "speculation_length": 4,
        "voting": {"enabled": False},
        "selector": {"enabled": False},
        "pipeline": {"enabled": False},
        "drafts": [{"model": f"zoo-draft-{x}", "acceptance": {"kind": "iid", "alpha": 0.5}} for x in "abc"],
    }
    cfg = {
        "workload": {
            "name": "w",
            "model": "zoo-target",
            "hardware": {"profile": "cpu-reference"},
            "serving": {"max_batch_size": 16, "block_size": 16},
            "requests": requests_section(2, 10, 10),
            "speculation": sp,
            "seed": 1,
        },
        "memory": {"gpu_blocks": 64},
        "executor": {"dtype": "fp32"},
    }
    run = SimpleNamespace(config=cfg, path=tmp_path, requests={"prompt_tokens": np.array([10, 12])})
    spec = spec_sim_spec(run)
    assert not spec.speculation.voting_on


# ---- adaptive s ---------------------------------------------------------------------------------
def _selector_run(tmp_path, rounds=70, seed=0):
    """A coupled run directory as the executor writes it, whose s the selector chose the way
    decoder.SpeculativeDecoder.round does (observe(t2 - t0, verified_length(...)) after every
    round that drafted); a prefill-only round first, which observes nothing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from infersim.executor.speculative.decoder import verified_length
    from infersim.simulator.speculative.selector import AdaptiveLengthSelector

    rng = np.random.default_rng(seed)
    sel = AdaptiveLengthSelector(4, 20, 1, 1, 1, 8, "directional")
    rows, seqs = [], []
    for i in range(rounds):
        s = sel.s
        n = 0 if i == 0 else 6
        s_list = [max(0, min(s, int(x))) for x in rng.integers(0, 9, n)]
        res = [(int(rng.integers(0, si + 1)), 0) for si in s_list]
        draft_s, verify_s = float(rng.uniform(1e-3, 3e-3)), float(rng.uniform(2e-3, 5e-3) * (1 + i / 40))
        drafted = sum(s_list)
        if drafted:
            sel.observe(draft_s + verify_s, verified_length(res, s_list, s))
        rows.append((i, s, drafted, draft_s, verify_s))
        seqs += [(i, j, si, k) for j, (si, (k, _)) in enumerate(zip(s_list, res))]
    cols = ("round", "rid", "s", "accepted")
    pq.write_table(
        pa.table({c: [r[i] for r in seqs] for i, c in enumerate(cols)}), tmp_path / "speculation_sequences.parquet"
    )
    t = {
        "round": np.array([r[0] for r in rows]),
        "s": np.array([r[1] for r in rows]),
        "drafted_tokens": np.array([r[2] for r in rows]),
        "draft_s": np.array([r[3] for r in rows]),
        "verify_s": np.array([r[4] for r in rows]),
    }
    return t


def test_the_simulators_selector_fed_the_executed_observations_takes_the_executed_trajectory(tmp_path):
    from types import SimpleNamespace

    from infersim.analysis.validate.spec_compare import selector_replay

    t = _selector_run(tmp_path)
    assert len(set(t["s"].tolist())) > 1  # the synthetic run did move s
    sp = {
        "method": "minions",
        "speculation_length": 4,
        "voting": {"enabled": False},
        "pipeline": {"enabled": False},
        "selector": {"enabled": True, "decision_threshold": 20, "s_min": 1, "s_max": 8},
        "drafts": [{"model": "zoo-draft-a", "acceptance": {"kind": "iid", "alpha": 0.5}}] * 3,
    }
    run = SimpleNamespace(config={"workload": {"speculation": sp}}, path=tmp_path)
    got = selector_replay(run, t)
    assert got["same"] and got["agreement"] == 1.0 and got["trajectory"] == got["executed"]
    # another decision threshold is another policy: it does not reproduce the run
    sp["selector"]["decision_threshold"] = 10
    assert not selector_replay(run, t)["same"]


def test_recorded_s_trajectory_is_keyed_by_observations(tmp_path):
    """Round 0 prefills only (no observation): the change before round 4 comes after 3
    observations, which is what the replayed selector counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from infersim.analysis.validate.spec_simulate import ReplayedSelector
    from infersim.executor.speculative.validate_hooks import recorded_statistics

    (tmp_path / "summary.json").write_text(json.dumps({"speculation": {"method": "minions", "s": {}}}))
    s = [4, 4, 4, 4, 3, 3, 5]
    pq.write_table(
        pa.table({"s": s, "drafted_tokens": [0, 8, 8, 8, 6, 6, 10], "draft_steps": [0, 4, 4, 4, 3, 3, 5]}),
        tmp_path / "speculation_rounds.parquet",
    )
    st = recorded_statistics(tmp_path)
    assert st["s_trajectory_rounds"] == [[0, 4], [4, 3], [6, 5]]
    assert st["s_trajectory"] == [[0, 4], [3, 3], [5, 5]]
    sel, seen = ReplayedSelector(st["s_trajectory"]), []
    for drafted in [8, 8, 8, 6, 6, 10]:  # rounds 1..6 observe; the s of round i+1 after round i
        sel.observe(1e-3, 2.0)
        seen.append(sel.s)
    assert seen[:5] == s[2:]  # s of rounds 2..6


# ---- pipeline contention --------------------------------------------------------------------------
def test_whole_pass_contention_by_hand():
    """llm: 1.0 s of solo work from t=0; ssm: 0.2 s from t=0.5. Whole pass at shares 0.5 / 0.8:
    the llm pass meets the ssm at 0.5 and is charged 1.0 x (1/0.5 - 1) once -> ends at 2.0; the
    ssm starts while the llm runs -> 0.2 / 0.8 = 0.25 s. Processor sharing instead: the ssm
    takes 0.25 s at rate 0.8, during which the llm does 0.125 s of work -> llm ends at 1.125."""
    import simpy

    from infersim.simulator.speculative.device import SharedDevice

    def run(whole):
        env = simpy.Environment()
        dev = SharedDevice(env, {"llm": 0.5, "ssm": 0.8}, whole_pass=whole)
        ends = {}

        def job(name, at, work):
            yield env.timeout(at)
            yield from dev.run(name, work)
            ends[name] = env.now

        env.process(job("llm", 0.0, 1.0))
        env.process(job("ssm", 0.5, 0.2))
        env.run()
        return ends

    assert run(True) == pytest.approx({"llm": 2.0, "ssm": 0.75})
    assert run(False) == pytest.approx({"llm": 1.125, "ssm": 0.75})


def test_contended_prices_a_pass_as_the_device_does():
    from infersim.analysis.validate.spec_costmodel import SOLO, contended

    solo, ov = np.array([2e-3, 2e-3, 2e-3]), np.array([0.0, 0.3, 1.0])
    assert contended(solo, ov, 0.5, "whole_pass") == pytest.approx([2e-3, 4e-3, 4e-3])
    assert contended(solo, ov, 0.5, "sharing") == pytest.approx([2e-3, 2.6e-3, 4e-3])
    assert contended(solo[:1], np.array([SOLO * 0.5]), 0.5, "whole_pass") == pytest.approx(solo[:1])


def test_stratified_draws_keep_each_request_at_its_component():
    """The proposer of a simulation whose mixture assigns requests to components: 40 rounds of
    s = 4 per request. Stratified draws (each request along its own low-discrepancy sequence)
    land every request's mean tokens per round close to its component's expectation; independent
    draws scatter them by about 1.3 / sqrt(40) = 0.2."""
    from infersim.simulator.simulation import Simulation
    from infersim.simulator.workload.builder import build_requests

    def proposer(draws):
        mix = {
            "kind": "mixture",
            "weights": [0.5, 0.5],
            "draws": draws,
            "components": [{"kind": "iid", "alpha": 0.3}, {"kind": "iid", "alpha": 0.9}],
            "assignment": {r: r % 2 for r in range(20)},
        }
        spec = fixed_lengths_spec(
            "opt-1.3b",
            count=20,
            prompt_tokens=16,
            output_tokens=200,
            name="strat",
            seed=5,
            speculation={
                "method": "draft",
                "speculation_length": 4,
                "drafts": [{"model": "opt-125m", "acceptance": mix}],
            },
        )
        return Simulation(spec, build_requests(spec, ".")).replicas[0].proposer

    rids = list(range(20))
    errors = {}
    for draws in ("stratified", "random"):
        p, rng = proposer(draws), np.random.default_rng(0)
        acc = np.stack([p.accept(rng, np.full(20, 4), rids)[0] for _ in range(40)])  # (rounds, requests)
        m = p.drafts[0].acceptance
        want = np.array(
            [
                m.components[int(m.component_index(m.assigned_levels([r], np.zeros(1)))[0])].expected_tokens(4)
                for r in rids
            ]
        )
        errors[draws] = np.abs(acc.mean(axis=0) + 1 - want)
    assert errors["stratified"].max() < 0.1
    assert errors["random"].max() > 2 * errors["stratified"].max()


def _pipelined_tables(rng, n=240, share_decode=0.6, share_prefill=0.9):
    """A pipelined run whose verifying passes follow known solo coefficients exactly, half of
    them overlapped throughout by a drafting round (decode-only passes then take solo / 0.6,
    prefilling ones solo / 0.9), and solo drafting rounds in the gaps."""
    from infersim.simulator.costmodel.speculative_fit import TARGET_FEATURES, round_features

    pre = rng.random(n) < 0.25
    nv = np.where(pre, rng.integers(0, 3, n), rng.integers(1, 9, n))
    s = rng.integers(1, 5, n)
    t = {
        "verify_seqs": nv,
        "verify_tokens": nv * (s + 1),
        "verify_context": nv * rng.integers(20, 200, n),
        "n_drafts": np.ones(n, dtype=np.int64),
        "drafted_tokens": nv * s,
        "pipelined": np.ones(n, dtype=bool),
        "prefill_seqs": np.where(pre, rng.integers(1, 3, n), 0),
        "draft_steps": np.zeros(n, dtype=np.int64),
        "catchup_tokens": np.zeros(n),
    }  # pipelined: the verifying pass drafts nothing
    t["prefill_tokens"] = t["prefill_seqs"] * rng.integers(20, 120, n)
    t["prefill_pairs"] = t["prefill_tokens"] ** 2 // 2
    coef = np.array([4e-4, 1e-4, 2e-5, 1e-7, 3e-4, 8e-6, 1e-9, 0.0])  # no long queries: no split term
    solo = round_features(t)[:, : len(TARGET_FEATURES)] @ coef
    over = rng.random(n) < 0.5
    y = np.where(over, solo / np.where(pre, share_prefill, share_decode), solo)
    t["fit_y_s"] = y
    t["t_start_s"] = np.arange(n) * 0.05
    t["t_end_s"] = t["t_start_s"] + y
    # drafting: one round exactly over each overlapped pass, one alone in each gap
    sizes = rng.integers(1, 6, 2 * n)
    starts = np.concatenate([t["t_start_s"][over], t["t_start_s"] + 0.03])
    busy = 1e-3 * sizes[: starts.size] * 0.5 + 5e-4
    ends = np.concatenate([t["t_end_s"][over], starts[over.sum() :] + busy[over.sum() :]])
    order = np.argsort(starts)
    d = {
        "t_start_s": starts[order],
        "t_end_s": ends[order],
        "sequences": sizes[: starts.size][order],
        "s": np.full(starts.size, 2),
        "n_drafts": np.ones(starts.size, dtype=np.int64),
        "busy_s": (ends - starts)[order],
    }
    return t, d, coef


def test_pipelined_fit_gives_prefilling_passes_their_own_share():
    """fit_rounds on a run built from known numbers: the solo target terms back, the decode-only
    share 0.6 and the prefilling share 0.9; the passes priced as the simulator prices them
    (predict_rounds_as_run) are then the measured ones, and the simulator's device charges a
    prefilling pass at its own share."""
    import simpy

    from infersim.analysis.validate.spec_costmodel import fit_rounds, predict_rounds_as_run
    from infersim.simulator.costmodel.speculative_fit import TARGET_FEATURES
    from infersim.simulator.speculative.device import SharedDevice

    t, d, coef = _pipelined_tables(np.random.default_rng(3))
    fit = fit_rounds([t], {}, drafting=[d])
    assert fit.coef[: len(TARGET_FEATURES)] == pytest.approx(coef, rel=1e-3, abs=1e-12)
    sh = fit.meta["pipeline_shares"]
    assert sh["llm"] == pytest.approx(0.6, rel=1e-6) and sh["llm_prefill"] == pytest.approx(0.9, rel=1e-6)
    assert predict_rounds_as_run(fit, t, d) == pytest.approx(t["fit_y_s"], rel=1e-6)
    assert predict_rounds_as_run(fit, t, None) == pytest.approx(fit.predict_rounds(t))

    env = simpy.Environment()
    dev = SharedDevice(env, {"llm": 0.6, "ssm": 0.8}, whole_pass=True)
    ends = {}

    def job(name, at, work, share=None):
        yield env.timeout(at)
        yield from dev.run(name, work, share)
        ends[name] = env.now

    env.process(job("llm", 0.0, 0.9, 0.9))  # a prefilling pass met by the drafts: 0.9 / 0.9
    env.process(job("ssm", 0.1, 0.08))
    env.run()
    assert ends["llm"] == pytest.approx(1.0) and ends["ssm"] == pytest.approx(0.2)


def test_pipelined_fit_without_contention_prices_every_pass_alike():
    """Drafts in their own process: overlapped verifying passes ran 10% faster than the solo fit
    (they follow no wait). The fit then uses every pass and gives the simulator no slowdown."""
    from infersim.analysis.validate.spec_costmodel import fit_rounds, predict_rounds_as_run

    t, d, coef = _pipelined_tables(np.random.default_rng(4), share_decode=1.1, share_prefill=1.1)
    fit = fit_rounds([t], {}, drafting=[d])
    assert fit.meta.get("pipeline_contention_absent") is True
    assert fit.meta["pipeline_shares"] == {"llm": 1.0, "llm_prefill": 1.0, "ssm": 1.0}
    y = t["fit_y_s"]
    err_all = np.mean(np.abs(predict_rounds_as_run(fit, t, d) / y - 1))
    # the solo-only fit would price every overlapped pass 10% high: about 5% MAPE over this run
    assert err_all < 0.05 and predict_rounds_as_run(fit, t, d).sum() == pytest.approx(y.sum(), rel=0.02)


# ---- Medusa: per-request accepted depths replayed by request id ---------------------------------
def test_medusa_assignment_puts_each_request_at_its_own_group():
    """Two groups listed hardest-last (B: always depth 3, A: always 0): a request assigned to a
    group draws only that group's depth, whatever its Weyl level; an unassigned one draws by level."""
    from infersim.simulator.speculative.medusa_tree import EmpiricalTreeSampler

    s = EmpiricalTreeSampler(
        np.array([1.0, 0, 0, 1.0]), [[0, 0, 0, 5.0], [5.0, 0, 0, 0]], [0.5, 0.5], assignment={7: 1, 8: 0}
    )
    rng = np.random.default_rng(0)
    rids = [7, 8, 7, 8]
    levels = s.assigned_levels(rids, np.array([0.9, 0.1, 0.6, 0.4]))
    assert s.sample(rng, 4, levels).tolist() == [0, 3, 0, 3]
    # components sort easiest-last: levels below 0.5 are A's (depth 0), above B's (depth 3)
    assert s.sample(rng, 2, s.assigned_levels([1, 2], np.array([0.2, 0.7]))).tolist() == [0, 3]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"assignment": {0: 2}}, "component index 2 out of range"),
        ({"components": None, "weights": None, "draws": "stratified"}, "need per-request 'components'"),
    ],
)
def test_medusa_acceptance_assignment_is_validated(bad, message):
    from infersim.simulator.speculative.config import MedusaAcceptance

    good = {"counts": [1, 1, 1], "tree": [[0], [0, 0]], "components": [[1, 0, 0], [0, 0, 1]], "weights": [1, 1]}
    assert MedusaAcceptance.model_validate({**good, "assignment": {3: 1}, "draws": "stratified"}).assignment == {3: 1}
    with pytest.raises(ValueError, match=message):
        MedusaAcceptance.model_validate({**good, **bad})


def test_medusa_depth_mixture_names_each_requests_group():
    """fit_depth_mixture groups requests by mean accepted depth (ascending) and says which group
    each request id was in; empirical_acceptance then asks for stratified draws."""
    from infersim.executor.medusa.validate_hooks import empirical_acceptance, fit_depth_mixture

    rng = np.random.default_rng(2)
    rid, acc = [], []
    for r in range(32):
        p = 0.2 if r % 2 else 0.8  # odd requests hard
        rid += [r] * 40
        acc += rng.binomial(3, p, 40).tolist()
    fit = fit_depth_mixture(rid, [3] * len(rid), acc, 3)
    groups = fit["assignment"]
    assert sorted(groups) == list(range(32))
    assert all(groups[r] <= 1 for r in range(1, 32, 2)) and all(groups[r] >= 2 for r in range(0, 32, 2))
    stats = {
        "accepted_hist": {0: 5, 1: 5, 2: 5, 3: 5},
        "tree": [[0], [0, 0], [0, 0, 0]],
        "per_request": {**fit, "assignment": {str(k): v for k, v in groups.items()}},
    }  # as read back from JSON
    out = empirical_acceptance(stats)
    assert out["draws"] == "stratified" and out["assignment"][0] == groups[0]


def test_medusa_depth_mixture_per_request_is_each_requests_own_histogram():
    from infersim.executor.medusa.validate_hooks import fit_depth_mixture

    rid = [r for r in range(10) for _ in range(4)]
    acc = [r % 4 for r in range(10) for _ in range(4)]  # request r always accepted r % 4
    fit = fit_depth_mixture(rid, [3] * len(rid), acc, 3, groups=None)
    assert fit["shrink"] == 1.0 and len(fit["components"]) == 10
    for r in range(10):
        comp = fit["components"][fit["assignment"][r]]
        assert comp[r % 4] == 1.0 and sum(comp) == pytest.approx(1.0)
    assert fit_depth_mixture(rid[:28], [3] * 28, acc[:28], 3, groups=None) is None  # 7 requests: too few


def _coupled_rounds(rng, n=400, long_prompts=True):
    """Coupled rounds of three drafts (s from 1 to 5) with prompts admitted now and then, some longer than
    SHORT_QUERY_MAX (their passes run attention per sequence), others short."""
    from infersim.simulator.costmodel.speculative_fit import SHORT_QUERY_MAX

    nv = rng.integers(1, 16, n)
    s = rng.integers(1, 6, n)
    npre = np.where(rng.random(n) < 0.3, rng.integers(1, 4, n), 0)
    prompt = rng.integers(4, 160, n)  # one prompt length per round (each prefill that round)
    long = (npre > 0) & (prompt > SHORT_QUERY_MAX) & long_prompts
    pre_tokens = npre * prompt
    return {
        "verify_seqs": nv,
        "verify_tokens": nv * (s + 1),
        "verify_context": nv * rng.integers(20, 200, n),
        "n_drafts": np.full(n, 3),
        "drafted_tokens": nv * s,
        "prefill_seqs": npre,
        "prefill_tokens": pre_tokens,
        "prefill_pairs": npre * prompt**2,
        "draft_steps": 3 * s,
        "catchup_tokens": np.concatenate([[0], pre_tokens[:-1]]),
        "long_query": long,
        "catchup_long": np.concatenate([[False], long[:-1]]),
        "pipelined": np.zeros(n, dtype=bool),
    }


def test_round_features_count_the_sequences_of_split_passes():
    """A round that prefills a long prompt beside 3 verified sequences runs the target's
    attention per sequence for all 4; the next round's drafting catch-up does so for each of
    the 3 drafts over its 4 sequences (12); a short prompt splits nothing; a pipelined
    verification carries no draft work."""
    from infersim.simulator.costmodel.speculative_fit import FEATURES, round_features

    t = {
        "verify_seqs": np.array([3, 4, 4]),
        "verify_tokens": np.array([15, 20, 20]),
        "verify_context": np.array([300, 400, 400]),
        "n_drafts": np.array([3, 3, 3]),
        "drafted_tokens": np.array([12, 16, 16]),
        "prefill_seqs": np.array([1, 0, 1]),
        "prefill_tokens": np.array([40, 0, 10]),
        "prefill_pairs": np.array([1600, 0, 100]),
        "draft_steps": np.array([12, 12, 12]),
        "catchup_tokens": np.array([0, 40, 0]),
        "long_query": np.array([True, False, False]),
        "catchup_long": np.array([False, True, False]),
    }
    X = round_features(t)
    assert X[:, FEATURES.index("split_sequences")].tolist() == [4, 0, 0]
    assert X[:, FEATURES.index("draft_split_sequences")].tolist() == [0, 12, 0]
    t["pipelined"] = np.ones(3, dtype=bool)
    assert round_features(t)[:, FEATURES.index("draft_split_sequences")].tolist() == [0, 0, 0]


def test_fit_recovers_the_split_terms_the_old_features_miss():
    """Rounds priced by known coefficients, split terms included: fit_rounds gets them back and
    prices every round exactly. Without the long-query flags (the features as they were) the
    best fit misses the rounds that admit a long prompt (they run above their price, the others
    below) by 8.6% in-sample."""
    from infersim.analysis.validate.spec_costmodel import fit_rounds
    from infersim.simulator.costmodel.speculative_fit import FEATURES, round_features

    rng = np.random.default_rng(7)
    t = _coupled_rounds(rng)
    coef = np.zeros(len(FEATURES))
    for name, c in {
        "round": 2.5e-3,
        "verify_sequences": 5e-5,
        "verify_keys": 2e-6,
        "prefill_tokens": 2e-6,
        "split_sequences": 8e-4,
        "draft_steps": 1.5e-3,
        "draft_prompt_tokens": 1e-6,
        "draft_split_sequences": 1.5e-4,
    }.items():
        coef[FEATURES.index(name)] = c
    t["fit_y_s"] = round_features(t) @ coef
    fit = fit_rounds([t])
    assert fit.coef == pytest.approx(coef, rel=1e-6, abs=1e-12)
    assert fit.predict_rounds(t) == pytest.approx(t["fit_y_s"], rel=1e-9)

    blind = {**t, "long_query": np.zeros_like(t["long_query"]), "catchup_long": np.zeros_like(t["catchup_long"])}
    old = fit_rounds([blind])
    ratio = t["fit_y_s"] / old.predict_rounds(blind)
    split = t["long_query"] | t["catchup_long"]
    assert np.median(ratio[split]) > 1.05 and np.median(ratio[~split]) < 1.0
    assert old.meta["round_fit"]["mape_in_sample"] > 0.05 > 1e-6 > fit.meta["round_fit"]["mape_in_sample"]


def test_a_fit_saved_before_the_split_terms_loads_with_them_zero(tmp_path):
    from infersim.simulator.costmodel.speculative_fit import FEATURES, SpecFit

    coef = np.arange(1, len(FEATURES) + 1) * 1e-4
    path = tmp_path / "speculative-fit.json"
    d = SpecFit(coef, {"round_fit": {}}).to_json()
    for name in ("split_sequences", "draft_split_sequences"):
        del d["coefficients"][name]
    path.write_text(json.dumps(d))
    loaded = SpecFit.load(path)
    want = [0.0 if f in ("split_sequences", "draft_split_sequences") else c for f, c in zip(FEATURES, coef)]
    assert loaded.coef.tolist() == pytest.approx(want)


def test_drafting_features_count_the_prompts_each_draft_prefills():
    from infersim.analysis.validate.spec_costmodel import drafting_features

    d = {
        "n_drafts": np.array([3, 1]),
        "s": np.array([4, 2]),
        "sequences": np.array([2, 5]),
        "prompt_tokens": np.array([100, 0]),
    }
    assert drafting_features(d).tolist() == [[12, 24, 0, 300, 0], [2, 10, 0, 0, 0]]
    d.pop("prompt_tokens")  # a table written before the column existed
    assert drafting_features(d)[:, 3].tolist() == [0, 0]


def test_pipelined_miss_names_the_cost_model_when_the_passes_were_priced_off():
    from infersim.analysis.validate.spec_compare import pipeline_source

    busy = {
        "verify_busy_s": 0.62,
        "simulated_llm_busy_s": 0.56,
        "draft_busy_s": 0.44,
        "simulated_ssm_busy_s": 0.50,
        "both_busy_s": 0.37,
    }
    # drafting priced 13.6% slow: the cost model, whatever the total bias
    assert pipeline_source(busy, "x", cost_bias=-0.02).startswith("cost model (pipeline: verifying passes 0.62 s")
    close = {**busy, "simulated_llm_busy_s": 0.60, "simulated_ssm_busy_s": 0.46}  # both within 10%
    assert pipeline_source(close, "x", cost_bias=-0.02).startswith("scheduling mismatch")
    assert pipeline_source(close, "x", cost_bias=-0.07).startswith("cost model")  # the passes priced 7% off
    assert pipeline_source(close, "x").startswith("scheduling mismatch") and pipeline_source(close, "x").endswith(
        "also x)"
    )
    # the TTFT tail near the batch cap: a few percent of pricing magnified by the queue
    assert pipeline_source(close, "x", cost_bias=-0.03, metric="TTFT p99").startswith(
        "cost model, magnified by the queue (the passes priced -3.0% in total"
    )
    assert pipeline_source(close, "x", cost_bias=-0.01, metric="TTFT p99").startswith("scheduling mismatch")


def test_speculative_calibration_runs_the_cases_own_mix_on_a_held_out_seed():
    from infersim.analysis.validate.calibrate import require_held_out_seed
    from infersim.analysis.validate.cases import get_case
    from infersim.analysis.validate.spec_validate import SPEC_MIX_SEED, calibration_specs
    from infersim.simulator.errors import InfersimError
    from infersim.simulator.workload.builder import build_requests

    spec = get_case("spec-draft").spec("zoo-target")
    specs = calibration_specs(spec)
    assert [s.name for s in specs] == ["calib-spec-load", "calib-spec-burst", "calib-spec-mix"]
    mix = specs[-1]
    assert mix.seed == SPEC_MIX_SEED and mix.requests == spec.requests and mix.speculation == spec.speculation
    for s in specs:  # every calibration seed is one a validated workload may not use
        with pytest.raises(InfersimError):
            require_held_out_seed(s.seed)
    got, validated = build_requests(mix), build_requests(spec)
    assert got.prompt_tokens.size == validated.prompt_tokens.size
    assert not np.array_equal(got.prompt_tokens, validated.prompt_tokens)  # other requests, the same kind
    assert not np.array_equal(got.arrival_s, validated.arrival_s)
    # a trace would replay the validated requests themselves: no mix run
    from infersim.simulator.workload.schema import TraceSource

    traced = spec.model_copy(
        update={
            "requests": spec.requests.model_copy(
                update={"trace": TraceSource(file="t.csv", prompt_column="p", output_column="o")}
            )
        }
    )
    assert [s.name for s in calibration_specs(traced)] == ["calib-spec-load", "calib-spec-burst"]


def test_handoffs_are_the_gaps_from_a_verification_to_the_drafting_it_held_up():
    """Only a drafting round that waited for work, and whose previous round ended before the
    verification it waited for, measures the hand-over: 0.2 ms and 0.3 ms here. A round that
    did not wait, and one whose previous round ended after the last verification (it waited
    for something else), are left out."""
    from infersim.analysis.validate.spec_rounds import handoffs_s

    rounds = {"t_end_s": np.array([1.0, 2.0, 3.0])}
    drafting = {
        "t_start_s": np.array([1.0002, 1.6, 2.0003, 2.5]),
        "t_end_s": np.array([1.5, 1.9, 2.4, 2.7]),
        "waited_s": np.array([0.1, 0.0, 0.05, 0.01]),
    }
    assert handoffs_s(rounds, drafting) == pytest.approx([2e-4, 3e-4], abs=1e-12)
    assert handoffs_s(rounds, {k: v for k, v in drafting.items() if k != "waited_s"}).size == 0


def test_pipelined_fit_carries_the_median_handoff_to_the_simulator():
    """The drafting rounds in the gaps waited for work and start 30 ms after their pass began:
    their hand-overs are 30 ms minus the pass (where the round before them ended earlier); the
    fit keeps their median for the simulator (spec_simulate passes it as pipeline.handoff_s)."""
    from infersim.analysis.validate.spec_costmodel import fit_rounds

    t, d, _ = _pipelined_tables(np.random.default_rng(5))
    in_gap = np.isin(d["t_start_s"], t["t_start_s"] + 0.03)
    d["waited_s"] = np.where(in_gap, 1e-3, 0.0)
    want = []
    for j in np.flatnonzero(in_gap):
        i = int(np.flatnonzero(np.isclose(t["t_start_s"] + 0.03, d["t_start_s"][j]))[0])
        if j == 0 or d["t_end_s"][j - 1] < t["t_end_s"][i]:
            want.append(0.03 - t["fit_y_s"][i])
    fit = fit_rounds([t], {}, drafting=[d])
    assert len(want) >= 5 and fit.meta["pipeline_handoff_points"] == len(want)
    assert fit.meta["pipeline_handoff_s"] == pytest.approx(float(np.median(want)), rel=1e-9)


def test_a_pipelined_fit_scales_its_draft_terms_by_the_drafting_process_speed():
    """scaled(1.1, draft_factor=0.8): the verifying pass and the hand-over (the verifying
    engine's host time) 1.1x, the drafting rounds 0.8x (the drafting process's core); without
    draft_factor every term moves together."""
    from infersim.analysis.validate.spec_costmodel import fit_rounds, predict_drafting

    t, d, _ = _pipelined_tables(np.random.default_rng(6))
    d["waited_s"] = np.full(len(d["t_start_s"]), 1e-3)
    fit = fit_rounds([t], {}, drafting=[d])
    fit.meta["pipeline_handoff_s"] = 2e-4
    both = fit.scaled(1.1, "test", draft_factor=0.8)
    assert both.predict_rounds(t) == pytest.approx(1.1 * fit.predict_rounds(t))
    assert predict_drafting(both, d) == pytest.approx(0.8 * predict_drafting(fit, d))
    assert both.meta["pipeline_handoff_s"] == pytest.approx(2.2e-4)
    assert both.meta["scaled_by"] == 1.1 and both.meta["draft_scaled_by"] == 0.8
    same = fit.scaled(1.1)
    assert predict_drafting(same, d) == pytest.approx(1.1 * predict_drafting(fit, d))
    assert "draft_scaled_by" not in same.meta
