"""Hand-calculated checks of the roofline cost model's per-operator counts, the roofline
table, the Medusa study (Appendix G.3) and the `sim roofline` / `sim medusa` commands."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from infersim.analysis.medusa_study import (
    PAPER_BLOCK_OPERATORS,
    MedusaStudyOptions,
    MedusaSweeps,
    expected_accept_length,
    grow_tree,
    load_accuracies,
    log_rate,
    medusa_study,
    standard_sweeps,
    tree_rate,
)
from infersim.analysis.roofline import COLUMNS, Grid, build_cost_model, iteration_table, operator_table, plot_roofline
from infersim.cli.main import main
from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.costmodel.operators import (
    attention_operators,
    coefficient_matrices,
    mlp_operators,
    model_operators,
)
from infersim.simulator.errors import InfersimError, UnknownNameError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.models.catalog import load_model

H, I, HEADS, D = 4096, 11008, 32, 128  # Llama-7B
A100_BW, A100_PEAK = 1.935e12, 312e12


@pytest.fixture(scope="module")
def cost():
    return RooflineCostModel(load_model("llama-7b"), load_hardware("a100-80gb-pcie:datasheet"), fused_projections=False)


def op(cost, batch, name):
    return {o.name: o for o in cost.breakdown(batch)}[name]


# ---- hand counts ---------------------------------------------------------------------------
def test_decode_up_proj_is_memory_bound_weight_read(cost):
    up = op(cost, BatchShape.decode([512]), "up_proj")
    assert up.bytes == H * I * 2 + (H + I) * 2
    assert up.flops == 2 * H * I
    assert up.memory_time_s == pytest.approx(up.bytes / A100_BW, rel=1e-12)
    assert up.bound == "memory"
    assert up.time_s == up.memory_time_s  # no launch overhead in the datasheet profile
    assert up.count == 32


def test_prefill_up_proj_is_compute_bound(cost):
    up = op(cost, BatchShape.prefill([2048]), "up_proj")
    assert up.flops == 2 * 2048 * H * I
    assert up.bound == "compute"
    assert up.time_s == pytest.approx(up.flops / A100_PEAK, rel=1e-12)


@pytest.mark.parametrize("b,c", [(1, 1024), (3, 1000), (16, 7)])
def test_decode_attention_flops(cost, b, c):
    qk = op(cost, BatchShape.decode([c] * b), "qk")
    pv = op(cost, BatchShape.decode([c] * b), "pv")
    assert qk.flops == 2 * HEADS * D * b * (c + 1)
    assert pv.flops == qk.flops
    # fused attention: read the query and every cached key (fp16), nothing else
    assert qk.bytes == H * 2 * b + H * 2 * b * (c + 1)


def test_gqa_k_proj_reads_the_narrow_weight():
    m = RooflineCostModel(load_model("llama-2-70b"), load_hardware("a100-80gb-pcie:datasheet"), fused_projections=False)
    k = op(m, BatchShape.decode([100]), "k_proj")
    weight_bytes = 8192 * 1024 * 2
    assert k.bytes == weight_bytes + (8192 + 1024) * 2
    assert k.flops == 2 * 8192 * 1024
    # queries keep all 64 heads: the score FLOPs are 2 * 64 * 128 per query-key pair
    assert op(m, BatchShape.decode([100]), "qk").flops == 2 * 64 * 128 * 101


def test_ragged_batch_totals_are_sums_of_per_sequence_counts(cost):
    ctx = [100, 900]
    t = BatchShape.decode(ctx).totals()
    assert (t.tokens, t.score_pairs, t.keys, t.logits) == (2, 101 + 901, 101 + 901, 2)
    both = {o.name: o for o in cost.breakdown(BatchShape.decode(ctx))}
    each = [{o.name: o for o in cost.breakdown(BatchShape.decode([c]))} for c in ctx]
    for name in ("qk", "pv", "softmax", "kv_write"):  # no per-iteration constant: additive
        assert both[name].flops == sum(e[name].flops for e in each)
        assert both[name].bytes == sum(e[name].bytes for e in each)
    assert both["qk"].flops == 2 * HEADS * D * (101 + 901)
    # linear layers: FLOPs add up, the weight is read once for the whole batch
    assert both["up_proj"].flops == sum(e["up_proj"].flops for e in each)
    assert both["up_proj"].bytes == H * I * 2 + 2 * (H + I) * 2


@pytest.mark.parametrize("c,q", [(1024, 4), (100, 64), (0, 7)])
def test_verify_score_pairs(cost, c, q):
    shape = BatchShape.verify([c], q)
    t = shape.totals()
    assert t.score_pairs == q * (c + q)
    assert t.tokens == q and t.logits == q and t.keys == c + q
    assert op(cost, shape, "qk").flops == 2 * HEADS * D * q * (c + q)


def test_unfused_attention_counts_the_score_matrix(cost):
    unfused = RooflineCostModel(
        load_model("llama-7b"),
        load_hardware("a100-80gb-pcie:datasheet"),
        fused_attention=False,
        fused_projections=False,
    )
    shape = BatchShape.verify([1024], 16)
    extra = op(unfused, shape, "qk").bytes - op(cost, shape, "qk").bytes
    assert extra == HEADS * 2 * 16 * (1024 + 16)  # the n x P fp16 score matrix, written once


# ---- position encodings: rotary in every layer, or a learned table once -----------------------
def _coefficients(ops):
    flops, nbytes = coefficient_matrices(ops)
    return flops.sum(axis=0).tolist(), nbytes.sum(axis=0).tolist()


def test_llama_layer_and_model_operators_by_hand():
    """Llama-7B, fp16, fused projections: coefficients (const, T, P, K, L) summed over a layer's
    operators and over the once-per-iteration ones, each term counted by hand."""
    h, i, n, v = H, I, HEADS, 32000
    layer = attention_operators(load_model("llama-7b"), "fp16", "fp16", "fp16", 1) + mlp_operators(
        h, i, True, "fp16", "fp16", 1
    )
    assert [o.name for o in layer][:4] == ["input_norm", "qkv_proj", "rotary", "kv_write"]
    # norms 5h each, QKV 2h x 3h, rotary 3 per query and key value, O 2h^2, adds h each,
    # gate/up 2h x 2i, SiLU-and-mul 5i, down 2ih; per query-key pair QK^T and PV 2h each, softmax 5n
    flops_t = 2 * 5 * h + 2 * h * 3 * h + 3 * 2 * h + 2 * h * h + 2 * h + 2 * h * 2 * i + 5 * i + 2 * i * h
    # weights once: two norms, QKV, O, gate/up, down; per token: norms read and write (2h each),
    # QKV reads h writes 3h, rotary reads and writes 2h, K and V cast into the cache (2h x 2 bytes
    # in and out), Q read by QK^T and the output written by PV (h each), O reads h writes h, adds
    # read two and write one (3h each), gate/up reads h writes 2i, SiLU-and-mul reads 2i writes i,
    # down reads i writes h; every cached key and value read once (h each)
    bytes_const = 2 * (2 * h + 3 * h * h + h * h + 2 * h * i + i * h)
    bytes_t = 2 * (
        2 * 2 * h + 4 * h + 2 * 2 * h + 2 * 2 * h + 2 * h + 2 * h + 2 * 3 * h + (h + 2 * i) + 3 * i + (i + h)
    )
    assert _coefficients(layer) == ([0, flops_t, 2 * 2 * h + 5 * n, 0, 0], [bytes_const, bytes_t, 0, 2 * 2 * h, 0])
    model = model_operators(load_model("llama-7b"), "fp16", "fp16", 1)
    assert [o.name for o in model] == ["embedding", "final_norm", "lm_head"]
    # the embedding gathers a row (read h, write h), the final norm 5h, the LM head 2hv per logit
    assert _coefficients(model) == (
        [0, 5 * h, 0, 0, 2 * h * v],
        [2 * (h + h * v), 2 * (2 * h + 2 * h), 0, 0, 2 * (h + v)],
    )


def test_learned_positions_replace_rotary_by_one_gather_and_add():
    """OPT-13B adds a learned position table once, before the first layer: no rotary in the
    layers, one position embedding that reads a row of 5120 fp16 values per token and reads and
    writes the token embedding (5120 x 6 bytes), with one add per value."""
    opt = load_model("opt-13b")
    assert opt.learned_positions
    layer = attention_operators(opt, "fp16", "fp16", "fp16", 2)
    assert "rotary" not in [o.name for o in layer]
    model = model_operators(opt, "fp16", "fp16", 2)
    assert [o.name for o in model] == ["embedding", "position_embedding", "final_norm", "lm_head"]
    pos = model[1]
    assert (pos.scope, pos.op_class, pos.kernel) == ("model", "elementwise", "emb")
    assert pos.flops == (0, 5120, 0, 0, 0) and pos.bytes == (0, 5120 * 6, 0, 0, 0)
    cost = RooflineCostModel(opt, load_hardware("a100-80gb-sxm:datasheet"), tensor_parallel=2)
    row = op(cost, BatchShape.decode([100] * 16), "position_embedding")
    assert (row.count, row.bytes, row.flops) == (1, 16 * 5120 * 6, 16 * 5120)
    assert row.time_s == pytest.approx(16 * 5120 * 6 / 2.039e12, rel=1e-12)


def test_phi2_layer_by_hand_one_norm_two_adds_partial_rotary():
    """phi-2, fp16: the parallel block normalises once (attention and MLP read one LayerNorm) and
    adds twice (attn + mlp, then + x); rotary covers 0.4 of each query and key head."""
    h, i, n = 2560, 10240, 32
    phi = load_model("microsoft/phi-2")
    layer = attention_operators(phi, "fp16", "fp16", "fp16", 1) + mlp_operators(h, i, False, "fp16", "fp16", 1)
    names = [o.name for o in layer]
    assert [x for x in names if x.endswith("norm")] == ["input_norm"]
    assert [x for x in names if x.endswith("add")] == ["attn_residual_add", "mlp_residual_add"]
    rotary = {o.name: o for o in layer}["rotary"]
    # 0.4 of the 2560 query and 2560 key values: 2048 rotated, 3 FLOPs each, read and written in fp16
    assert rotary.flops == (0, 3 * 2048, 0, 0, 0) and rotary.bytes == (0, 2 * 2048 * 2, 0, 0, 0)
    # norm 5h, QKV 2h x 3h, rotary 3 x 2048, O 2h^2, two adds h each, fc1 2hi, GELU i, fc2 2ih;
    # per query-key pair QK^T and PV 2h each, softmax 5n
    flops_t = 5 * h + 2 * h * 3 * h + 3 * 2048 + 2 * h * h + 2 * h + 2 * h * i + i + 2 * i * h
    # weights once: one norm, QKV, O, fc1, fc2; per token: the norm reads and writes h, QKV reads h
    # writes 3h, rotary reads and writes 2048, K and V into the cache (2h in and out), Q read and
    # the output written (h each), O reads h writes h, two adds (3h each), fc1 reads h writes i,
    # GELU reads and writes i, fc2 reads i writes h; every cached key and value read once
    bytes_const = 2 * (h + 3 * h * h + h * h + 2 * h * i)
    bytes_t = 2 * (2 * h + 4 * h + 2 * 2048 + 2 * 2 * h + 2 * h + 2 * h + 2 * 3 * h + (h + i) + 2 * i + (i + h))
    assert _coefficients(layer) == ([0, flops_t, 2 * 2 * h + 5 * n, 0, 0], [bytes_const, bytes_t, 0, 2 * 2 * h, 0])


def test_parallel_block_with_own_norms_prices_as_sequential():
    """GPT-NeoX's parallel residual gives each branch its own LayerNorm: two norms and two adds
    per layer, the sequential block's operators."""
    spec = load_model("opt-1.3b").model_copy(update=dict(parallel_block=True))
    seq = load_model("opt-1.3b")
    assert spec.norms_per_layer == 2 and spec.params_total() == seq.params_total()
    ops = lambda m: [o.name for o in attention_operators(m, "fp16", "fp16", "fp16", 1)]
    assert ops(spec) == ops(seq)


def test_tensor_parallel_halves_linear_flops_and_adds_allreduce(cost):
    tp2 = RooflineCostModel(
        load_model("llama-7b"), load_hardware("a100-80gb-pcie:datasheet"), tensor_parallel=2, fused_projections=False
    )
    shape = BatchShape.decode([512] * 4)
    one, two = {o.name: o for o in cost.breakdown(shape)}, {o.name: o for o in tp2.breakdown(shape)}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "gate_proj", "down_proj"):
        assert two[name].flops == one[name].flops / 2
    assert "allreduce" not in one
    ar = two["allreduce"]
    assert ar.op_class == "communication" and ar.bound == "network" and ar.count == 32
    assert ar.bytes == 2 * H * 2 * 4  # o_proj and MLP outputs, fp16, 4 tokens
    assert tp2.iteration_time_s(shape) == pytest.approx(sum(o.total_time_s for o in two.values()), rel=1e-12)


def test_decode_step_times_equal_iteration_times_exactly(cost):
    ctx = np.array([5, 130, 2047, 999])
    steps = cost.decode_step_times_s(ctx, 6)
    for j in range(6):
        assert steps[j] == cost.iteration_time_s(BatchShape.decode(ctx + j))


# ---- the roofline table --------------------------------------------------------------------
def test_operator_table_columns_and_sizes(cost):
    df = operator_table(cost, Grid(["prefill", "decode", "verify"], [1, 2], [128, 256], [1, 4, 16]))
    assert list(df.columns) == COLUMNS
    n_ops = len(cost.breakdown(BatchShape.decode([1])))
    assert len(df) == (4 + 4 + 4 * 3) * n_ops
    up = df[(df.phase == "decode") & (df.batch == 1) & (df.seq_len == 128) & (df.operator == "up_proj")].iloc[0]
    assert up.bytes == H * I * 2 + (H + I) * 2 and up.bound == "memory" and up.candidates == 1
    assert up.achieved_flops_per_s == pytest.approx(up.flops / up.time_s)
    assert up.total_time_s == pytest.approx(32 * up.time_s)
    verify = df[
        (df.phase == "verify") & (df.operator == "qk") & (df.batch == 2) & (df.seq_len == 256) & (df.candidates == 16)
    ]
    assert verify.iloc[0].flops == 2 * HEADS * D * 2 * 16 * (256 + 16)
    it = iteration_table(cost, Grid(["decode"], [1, 2], [128, 256]))
    assert len(it) == 4
    row = it[(it.batch == 2) & (it.seq_len == 256)].iloc[0]
    assert row.iteration_time_s == cost.iteration_time_s(BatchShape.decode([256, 256]))


def test_plot_roofline_writes_png(cost, tmp_path):
    df = operator_table(cost, Grid(["prefill", "decode"], [1, 8], [128, 1024]))
    path = plot_roofline(df, "a100-80gb-pcie", tmp_path / "roof.png")
    assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_unknown_phase_is_a_user_error(cost):
    with pytest.raises(InfersimError, match="unknown phase"):
        operator_table(cost, Grid(["warmup"], [1], [128]))


# ---- Medusa study --------------------------------------------------------------------------
def test_log_rate_is_the_paper_fit_clamped_at_one():
    assert log_rate(1) == 1.0 and log_rate(8) == 1.0  # 0.477 ln 8 = 0.99: at least one token per step
    assert log_rate(64) == pytest.approx(0.477 * math.log(64))


def test_tree_rate_is_one_plus_sum_of_path_accuracies():
    table = load_accuracies("vicuna-7b")
    acc = table.rank_accuracies()
    assert acc[:, 0].tolist() == [0.56, 0.316, 0.201, 0.147, 0.118]
    assert acc[:, :5].sum(axis=1) == pytest.approx([0.78, 0.563, 0.417, 0.34, 0.30])
    assert len(table.tree) == 63 and max(len(c) for c in table.tree) == 4
    small = [(0,), (0, 0), (1,)]
    assert expected_accept_length(small, acc) == pytest.approx(1 + acc[0, 0] + acc[0, 0] * acc[1, 0] + acc[0, 1])
    assert grow_tree(table, 4) == small  # a prefix of mc_sim_7b_63
    assert len(grow_tree(table, 256)) == 255  # extended greedily past the 64 listed nodes
    rates = tree_rate([1, 2, 64, 256], table)
    assert rates[0] == 1.0 and rates[1] == pytest.approx(1.56)
    assert np.all(np.diff(rates) > 0)


def test_unknown_accuracy_table():
    with pytest.raises(UnknownNameError, match="vicuna-7b"):
        load_accuracies("no-such-table")


def test_paper_block_is_the_eight_operators():
    m = build_cost_model("llama-7b", "a100-80gb-pcie", fused_attention=False, fused_projections=False)
    names = {o.name for o in m.breakdown(BatchShape.decode([1024]))} & set(PAPER_BLOCK_OPERATORS)
    assert names == {"q_proj", "k_proj", "v_proj", "qk", "pv", "up_proj", "gate_proj", "down_proj"}


@pytest.mark.parametrize("block", ["model", "paper"])
def test_medusa_speedup_rises_then_falls_at_batch_1(block):
    df = medusa_study(
        "llama-7b", "a100-80gb-pcie:datasheet", batches=[1], seq_lens=[1024], options=MedusaStudyOptions(block=block)
    )
    s = df.set_index("candidates")["speedup"]
    assert df["overhead"].iloc[0] == 1.0 and s[1] == 1.0  # one candidate is plain decoding
    best = s.idxmax()
    assert s.index[0] < best < s.index[-1]  # the peak is strictly inside 1..256
    assert s[best] > s[s.index[0]] and s[best] > s[s.index[-1]]
    # What the datasheet roofline predicts (the paper reports the fall past ~64): with the log
    # rate the best is 128 candidates, ~2.1x; the linear layers turn compute-bound only past
    # the ridge (161 tokens at fp16 on the A100), so 256 costs ~1.7x a decode step.
    assert best == 128
    assert s[best] == pytest.approx(2.1, abs=0.05)
    assert df.set_index("candidates")["overhead"][256] > 1.6


def test_medusa_tree_rate_peaks_at_the_63_choice_tree():
    df = medusa_study(
        "llama-7b", "a100-80gb-pcie:datasheet", options=MedusaStudyOptions(rate_model="tree", block="paper")
    )
    assert df.loc[df["speedup"].idxmax(), "candidates"] == 64


def test_medusa_large_batches_lose_the_speedup():
    df = medusa_study("llama-7b", "a100-80gb-pcie", batches=[1, 2, 64], seq_lens=[1024])
    best = df.groupby("batch")["speedup"].max()
    assert best[64] < best[1]
    # the roofline already loses speedup at batch 2 (b*q crosses the ridge sooner)
    assert best[2] < best[1]
    # at batch 64 every candidate count > 1 is slower than plain decoding
    assert best[64] == 1.0 and (df[(df.batch == 64) & (df.candidates > 1)]["speedup"] < 1).all()


def test_standard_sweeps_rows():
    df = standard_sweeps(
        "llama-7b", "a100-80gb-pcie", MedusaSweeps(candidates=[1, 8, 64], batches=[1, 4], seq_lens=[512])
    )
    assert len(df) == 3 * (1 + 2 + 1)
    assert set(df["sweep"]) == {"candidates", "batch", "seq_len"}
    assert (df[df.sweep == "seq_len"]["batch"] == 4).all()  # Fig. 23 fixes batch 4


# ---- command line --------------------------------------------------------------------------
def test_sim_roofline_writes_csv_json_plot(tmp_path, capsys):
    csv, js, png = tmp_path / "r.csv", tmp_path / "r.json", tmp_path / "r.png"
    rc = main(
        [
            "roofline",
            "--model",
            "llama-7b",
            "--hardware",
            "a100-80gb-pcie",
            "--batch",
            "1,2",
            "--seq",
            "128,256",
            "--csv",
            str(csv),
            "--json",
            str(js),
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "up_proj" in out and "iteration" in out
    it = pd.read_csv(csv)
    assert len(it) == 2 * 2 * 2  # prefill and decode, 2 batches x 2 sequence lengths
    assert len(json.loads(js.read_text())) == 8
    assert png.stat().st_size > 10_000


def test_sim_roofline_per_operator_csv(tmp_path, capsys):
    csv = tmp_path / "ops.csv"
    rc = main(
        [
            "roofline",
            "--phase",
            "decode,verify",
            "--batch",
            "4",
            "--seq",
            "1024",
            "--candidates",
            "1,16",
            "--per-operator",
            "--attention",
            "unfused",
            "--csv",
            str(csv),
            "--all",
        ]
    )
    assert rc == 0
    df = pd.read_csv(csv)
    assert list(df.columns) == COLUMNS
    # decode + 2 verify settings, 17 Llama operators each and the engine_overhead row (vLLM's, which
    # the default a100-80gb-pcie profile carries)
    assert len(df) == 3 * (17 + 1)
    assert (df["operator"] == "engine_overhead").sum() == 3
    assert set(df["candidates"]) == {1, 16}
    capsys.readouterr()


def test_sim_medusa_writes_csv_and_figures(tmp_path, capsys):
    out = tmp_path / "study"
    rc = main(
        [
            "medusa",
            "--model",
            "llama-7b",
            "--hardware",
            "a100-80gb-pcie",
            "--batch",
            "1",
            "--seq",
            "1024",
            "--candidates",
            "1,4,16,64",
            "--batches",
            "1,8",
            "--seqs",
            "512,2048",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    df = pd.read_csv(out / "medusa_study.csv")
    assert len(df) == 4 * (1 + 2 + 2)
    for name in ("fig21_candidates.png", "fig22_speedup_by_batch.png", "fig23_speedup_by_seq.png"):
        assert (out / name).stat().st_size > 10_000
    assert "speedup" in capsys.readouterr().out


def test_sim_medusa_tree_rate_paper_block(tmp_path, capsys):
    rc = main(
        [
            "medusa",
            "--rate-model",
            "tree",
            "--block",
            "paper",
            "--candidates",
            "1,64",
            "--batches",
            "1",
            "--seqs",
            "1024",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    df = pd.read_csv(tmp_path / "medusa_study.csv")
    assert (df["block"] == "paper").all() and (df["attention"] == "unfused").all()
    capsys.readouterr()


@pytest.mark.parametrize("cmd", ["roofline", "medusa"])
def test_unknown_model_exits_2_listing_known_models(cmd, tmp_path, capsys):
    rc = main(
        [
            cmd,
            "--model",
            "llama-9000b",
            "--out" if cmd == "medusa" else "--batch",
            str(tmp_path) if cmd == "medusa" else "1",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "unknown model 'llama-9000b'" in err and "llama-7b" in err and "opt-13b" in err
    assert len(err.strip().splitlines()) == 1


def test_bad_list_option_exits_2(capsys):
    assert main(["roofline", "--batch", "1,x"]) == 2
    assert "--batch" in capsys.readouterr().err


def test_calibrated_times_kept_per_batch_equal_fresh_ones_bit_for_bit():
    """A calibrated cost model evaluates each (tokens, logit positions) pair's fitted operators
    once and keeps them: times from a warm model, in any order and inside decode stretches,
    equal a fresh model's for each batch alone."""
    model, hw = load_model("llama-3-8b"), load_hardware("h100-sxm")
    batches = [
        BatchShape.prefill([512, 300]),
        BatchShape.decode([100, 2000, 7]),
        BatchShape.of([1, 1, 64], [40, 900, 0], [1, 1, 1]),
        BatchShape.decode([100, 2000, 7]),
        BatchShape.prefill([812]),
    ]
    warm = RooflineCostModel(model, hw)
    for b in batches + batches[::-1]:
        assert warm.iteration_time_s(b) == RooflineCostModel(model, hw).iteration_time_s(b)
    stretch = warm.decode_step_times_s([100, 2000, 7], 50)
    for j in (0, 17, 49):
        assert stretch[j] == RooflineCostModel(model, hw).iteration_time_s(
            BatchShape.decode([100 + j, 2000 + j, 7 + j])
        )
    assert len(warm._calibrated_cache) == 4  # (812, 2) and (812, 1) share tokens, not logits
