"""KV policies on the real zoo target (executor/offload): skewing keeps Q K^T, the dense
forward with the full cache is the model's own, every policy with a budget covering everything
is the full cache exactly, INT4's error bound, the pool's eviction orders on hand-made access
sequences, H2O's budget, and the recorded sparsity data loads in the simulator."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from infersim.executor.offload import (  # noqa: E402
    H2O,
    DenseLlama,
    FullCache,
    InfiniGen,
    Int4KV,
    KVPool,
    evaluate_policy,
)
from infersim.executor.offload.model import apply_rope, full_forward  # noqa: E402
from infersim.executor.offload.policies import build_kv_policy  # noqa: E402
from infersim.executor.offload.quant import quantize_dequantize  # noqa: E402
from infersim.executor.offload.skew import apply_skew, fold_skew, skew_matrices  # noqa: E402
from infersim.executor.offload.sparsity import at_contexts, sparsity_spec  # noqa: E402
from infersim.simulator.errors import InfersimError  # noqa: E402


@pytest.fixture(scope="module")
def zoo(zoo_dir):
    from infersim.executor.models import load_model
    from infersim.executor.zoo.corpus import held_out_windows

    lm = load_model("zoo-target")
    model = DenseLlama(lm)
    ids = held_out_windows(lm.tokenizer, 3, 80, seed=0)
    sample = held_out_windows(lm.tokenizer, 2, 128, seed=0, split="train")
    return lm, model, ids, skew_matrices(model, sample)


# ---- skewing -----------------------------------------------------------------------------------
def test_skew_is_orthogonal_and_keeps_post_rope_scores(zoo):
    _, model, ids, A = zoo
    s = model.shape
    eye = torch.eye(s.head_dim, dtype=torch.float64)
    assert torch.allclose(A.double() @ A.double().transpose(-1, -2), eye.expand_as(A.double()), atol=1e-5)
    with torch.inference_mode():
        _, trace = full_forward(model, ids)
    for i, t in enumerate(trace):
        q, k = t["q"], t["k"]
        qs, ks = apply_skew(q, A[i].repeat_interleave(s.group, dim=0)), apply_skew(k, A[i])
        ref = model.scores(q, k)
        assert torch.allclose(model.scores(qs, ks), ref, atol=2e-5 * float(ref.abs().max()))
        # the skew concentrates the query's energy in its leading columns (the point of it)
        e_plain = (q**2).sum(dim=(0, 2)).sort(dim=-1, descending=True).values[:, :10].sum() / (q**2).sum()
        e_skew = (qs**2).sum(dim=(0, 2))[:, :10].sum() / (qs**2).sum()
        assert e_skew > e_plain


def test_weight_fold_exact_before_rope_not_after(zoo):
    """Eq. 2's fold into W_Q, W_K keeps x W_Q (x W_K)^T exactly, but RoPE between the
    projection and the product breaks it: why the executor skews post-RoPE."""
    _, model, ids, A = zoo
    s, att = model.shape, model.layers[1].self_attn
    with torch.inference_mode():
        x = model.input_norm(1, model.embed(ids[:1]))
        wq, wk = fold_skew(att.q_proj.weight, att.k_proj.weight, A[1], s.heads, s.kv_heads)
        T = x.shape[1]

        def proj(w, heads):
            return (x @ w.T).view(1, T, heads, s.head_dim).transpose(1, 2)

        q, k = proj(att.q_proj.weight, s.heads), proj(att.k_proj.weight, s.kv_heads)
        q2, k2 = proj(wq, s.heads), proj(wk, s.kv_heads)
        ref = model.scores(q, k)
        assert torch.allclose(model.scores(q2, k2), ref, atol=2e-5 * float(ref.abs().max()))
        cos, sin = model.rope(x, torch.arange(T)[None])
        roped_ref = model.scores(apply_rope(q, cos, sin), apply_rope(k, cos, sin))
        roped_fold = model.scores(apply_rope(q2, cos, sin), apply_rope(k2, cos, sin))
        assert (roped_fold - roped_ref).abs().max() > 0.05 * roped_ref.abs().max()


# ---- full cache and budgets covering everything ------------------------------------------------
def test_full_cache_reproduces_hf_logits(zoo):
    lm, model, ids, _ = zoo
    P = 16
    r = evaluate_policy(model, FullCache(), ids, P, keep_logits=True)
    with torch.inference_mode():
        ref = lm.model(ids).logits
    assert r.logits.shape == (ids.shape[0], ids.shape[1] - 1 - P, ref.shape[-1])
    assert torch.allclose(r.logits, ref[:, P:-1], atol=1e-4, rtol=1e-4)
    nll = torch.nn.functional.cross_entropy(ref[:, P:-1].reshape(-1, ref.shape[-1]), ids[:, P + 1 :].reshape(-1))
    assert r.perplexity == pytest.approx(math.exp(float(nll)), rel=1e-5)
    assert np.all(r.mass == pytest.approx(1.0)) and r.kv_fraction() == pytest.approx(1.0)


@pytest.mark.parametrize(
    "make",
    [
        lambda A: H2O({"budget": 1.0}),
        lambda A: InfiniGen({"alpha": 1e9, "max_fetch_fraction": 1.0}, A),
        lambda A: InfiniGen({"alpha": 1e9, "max_fetch_fraction": 1.0, "pool_limit": 1.0, "victim": "counter"}, A),
        lambda A: InfiniGen({"alpha": 1e9, "max_fetch_fraction": 1.0, "start_layer": 0}, None),
    ],
    ids=["h2o", "infinigen", "infinigen-pool", "infinigen-noskew-from0"],
)
def test_budget_covering_everything_is_the_full_cache(zoo, make):
    _, model, ids, A = zoo
    ref = evaluate_policy(model, FullCache(), ids, 16, keep_logits=True)
    r = evaluate_policy(model, make(A), ids, 16, keep_logits=True)
    assert torch.equal(r.logits, ref.logits)
    assert r.kv_fraction() == 1.0


def test_int4_round_trip_error_bound_and_perplexity(zoo):
    _, model, ids, _ = zoo
    with torch.inference_mode():
        _, trace = full_forward(model, ids[:1])
    k = trace[1]["k"]
    deq = quantize_dequantize(k, 64, 4, meta_dtype=None)
    g = k.transpose(1, 2).reshape(1, k.shape[2], -1, 64)
    step = (g.amax(-1) - g.amin(-1)) / 15  # per group
    err = (deq - k).abs().transpose(1, 2).reshape_as(g).amax(-1)
    assert torch.all(err <= step / 2 + 1e-6)
    # values already on the grid come back unchanged (up to float rounding)
    assert torch.allclose(quantize_dequantize(deq, 64, 4, meta_dtype=None), deq, atol=1e-5)
    with pytest.raises(InfersimError, match="group_size 48"):
        quantize_dequantize(k, 48)
    full = evaluate_policy(model, FullCache(), ids, 16)
    q4 = evaluate_policy(model, Int4KV(), ids, 16)
    assert q4.perplexity != full.perplexity and abs(q4.perplexity / full.perplexity - 1) < 0.05


# ---- H2O and InfiniGen budgets ------------------------------------------------------------------
def test_h2o_keeps_budget_heavy_hitters_and_recent(zoo):
    _, model, ids, _ = zoo
    T = ids.shape[1]
    pol = H2O({"budget_tokens": 12})
    r = evaluate_policy(model, pol, ids, 24)
    assert pol.budget == 12 and pol.recent == 6
    held = pol.held[:, :, :, : T - 1].sum(dim=-1)
    assert torch.all(held == 12)
    # the last `recent` tokens before the final one are always held
    assert torch.all(pol.held[:, :, :, T - 1 - 6 : T - 1])
    assert np.all(r.attended <= 12 + 1e-9) and np.all(r.mass < 1.0 + 1e-9)


def test_infinigen_fetch_respects_cap_and_layer0(zoo):
    _, model, ids, A = zoo
    pol = InfiniGen({"alpha": 4, "max_fetch_fraction": 0.2}, A)
    r = evaluate_policy(model, pol, ids, 24)
    cap = np.maximum(1, np.floor(0.2 * r.context + 1e-9))
    assert np.all(r.attended[:, 0] == r.context[:, None])  # layer 0 loads everything
    assert np.all(r.attended[:, 1:] <= cap[:, None, None] + 1e-9)
    assert r.mass_kept(0) == pytest.approx(1.0) and r.mass_kept(1) < 1.0


def test_bad_params_are_one_line_errors():
    with pytest.raises(InfersimError, match="alpah"):
        build_kv_policy("infinigen", {"alpah": 4})
    with pytest.raises(InfersimError, match="unknown executor KV policy 'quest'"):
        build_kv_policy("quest")
    with pytest.raises(InfersimError, match="victim policy 'mru'"):
        KVPool("mru", 1, 4, 2)


# ---- the pool's victims ------------------------------------------------------------------------
def _run_pool(victim, ops, capacity=3, max_tokens=8):
    pool = KVPool(victim, 1, max_tokens, capacity)
    evicted = []
    for op, arg in ops:
        if op == "insert":
            e = int(pool.insert(arg)[0])
            if e >= 0:
                evicted.append(e)
        else:
            m = torch.zeros(1, max_tokens, dtype=torch.bool)
            m[0, list(arg)] = True
            pool.access(m)
    return evicted, pool


OPS = [
    ("insert", 0),
    ("insert", 1),
    ("insert", 2),
    ("access", [0]),
    ("access", [0, 2]),
    ("access", [1]),
    ("insert", 3),
    ("access", [3]),
    ("insert", 4),
    ("insert", 5),
]


# clock: t1 ins0, t2 ins1, t3 ins2, t4 fetch 0, t5 fetch 0+2, t6 fetch 1, t7 ins3 (pool full),
# t8 fetch 3, t9 ins4, t10 ins5. Last use after t6: 0:t5 1:t6 2:t5; counts 0:2 1:1 2:1.
#  fifo     oldest resident each time: 0, 1, 2
#  lru      t7: {0:t5, 1:t6, 2:t5} -> 0 (older of the tie); t9: {1:t6, 2:t5, 3:t8} -> 2;
#           t10: {1:t6, 3:t8, 4:t9} -> 1
#  counter  t7: {0:2, 1:1, 2:1} -> 1 (older of the tie); t9: {0:2, 2:1, 3:1} -> 2;
#           t10: {0:2, 3:1, 4:0} -> 4 (never fetched)
@pytest.mark.parametrize("victim,expected", [("fifo", [0, 1, 2]), ("lru", [0, 2, 1]), ("counter", [1, 2, 4])])
def test_pool_victim_order(victim, expected):
    evicted, pool = _run_pool(victim, OPS)
    assert evicted == expected
    assert int(pool.resident.sum()) == 3 and pool.evictions == 3


def test_counter_halves_on_saturation():
    pool = KVPool("counter", 1, 4, 4, counter_bits=2)  # saturates at 3
    for t in range(2):
        pool.insert(t)
    m = torch.tensor([[True, False, False, False]])
    for _ in range(3):
        pool.access(m)
    assert pool.count[0, :2].tolist() == [1, 0]  # 3 -> halved to 1


# ---- sparsity data --------------------------------------------------------------------------------
def test_sparsity_spec_from_hand_counts():
    # counts [alpha, layer, context] at contexts 10 and 40: layer 1 has twice layer 0's count
    ca = np.array([[[2.0, 4.0], [4.0, 8.0]]])
    ma = np.array([[[0.8, 0.9], [0.9, 1.0]]])
    spec = sparsity_spec("toy", "toy", [4.0], [10, 40], ca, ma, 4.0, "hand")
    assert spec.important_tokens[0].tokens == [3.0, 6.0]
    assert spec.layer_scale == pytest.approx([2 / 3, 4 / 3], rel=1e-3)
    assert spec.important_mass == pytest.approx(0.9)
    series = np.arange(1.0, 101.0)  # value = context
    assert at_contexts(series, [10, 50]).tolist() == pytest.approx([10.0, 50.0])


def test_recorded_sparsity_loads_in_the_simulator():
    from infersim.simulator.offload.policies import InfiniGenPolicy, KVShape
    from infersim.simulator.offload.sparsity import SparsityModel, default_sparsity_name, load_sparsity

    try:
        spec = load_sparsity("zoo-target")
    except InfersimError:
        pytest.fail(
            "simulator/catalog/sparsity/zoo-target.yaml is missing: run "
            "python -m infersim.analysis.reproduce.infinigen_executor"
        )
    assert default_sparsity_name("zoo-target") == ("zoo-target", False)
    assert len(spec.layer_scale) == 3 and {t.alpha for t in spec.important_tokens} >= {4.0, 5.0}
    sm = SparsityModel(spec, 4.0)
    table = next(t for t in spec.important_tokens if t.alpha == 4.0)
    for c, n in zip(table.context, table.tokens):
        assert float(sm.mean_tokens(c)) == pytest.approx(n, rel=1e-6)
    per_layer = sm.tokens(np.array([256.0]), 3)[0]
    assert per_layer == pytest.approx(np.clip(np.asarray(spec.layer_scale) * sm.mean_tokens(256.0), 1, 256))
    assert float(SparsityModel(spec, 4.5).mean_tokens(256)) > float(sm.mean_tokens(256))  # alpha interpolates
    # the simulator's InfiniGen policy counts with it: layer 0 in full, the others the data's count or the cap
    shape = KVShape(3, 192, 6, 192, 64, 2.0, 2.0, 2.0)
    pol = InfiniGenPolicy({"alpha": 4}, shape, sm)
    att = pol.attended_tokens(np.array([256]), np.array([256]))[0]
    expect = np.minimum(np.ceil(per_layer[1:] - 1e-9), 51)
    assert att[0] == 256 and att[1:].tolist() == expect.tolist()
