"""Mixture-of-experts specs and pricing against hand calculation (Mixtral-8x7B above all)."""

import json

import numpy as np
import pytest

from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.costmodel.kernel_times import gemm_time_s, output_waves
from infersim.simulator.engine.memory import plan_memory
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.models.catalog import load_model
from infersim.simulator.models.hf_config import spec_from_hf_config
from infersim.simulator.models.moe import MoESpec, expected_distinct_experts
from infersim.simulator.simulation import simulate
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import WorkloadSpec
from tests.utils import memory_options, poisson, requests_section

H, I, LAYERS, VOCAB, E, K = 4096, 14336, 32, 32000, 8, 2
ATTN = H * H + 2 * H * 1024 + H * H  # q, k, v (8 KV heads of 128), o
EXPERT = 3 * H * I  # gate, up, down
ROUTER = H * E
NORMS = 2 * H
OUTSIDE = 2 * VOCAB * H + H  # embedding, lm_head (untied), final norm

MOE_MODELS = ["mixtral-8x7b", "mixtral-8x22b", "deepseek-v2-lite", "deepseek-v3", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b"]


def test_mixtral_total_parameters_by_hand():
    m = load_model("mixtral-8x7b")
    assert m.params_total() == LAYERS * (ATTN + E * EXPERT + ROUTER + NORMS) + OUTSIDE
    assert m.params_total() == pytest.approx(46.7e9, rel=0.01)


def test_mixtral_active_parameters_by_hand():
    m = load_model("mixtral-8x7b")
    assert m.params_active_per_token() == LAYERS * (ATTN + K * EXPERT + ROUTER + NORMS) + OUTSIDE
    assert m.params_active_per_token() == pytest.approx(12.9e9, rel=0.01)


@pytest.mark.parametrize("batch, expected", [(1, 2.0), (8, 8 * (1 - 0.75**8)), (64, 8 * (1 - 0.75**64))])
def test_mixtral_expected_distinct_experts(batch, expected):
    # P(an expert escapes one token) = 1 - k/E = 3/4, so E[distinct] = 8 (1 - (3/4)^B)
    pick = load_model("mixtral-8x7b").moe.pick_probabilities()
    assert float(expected_distinct_experts(pick, batch)) == pytest.approx(expected, rel=1e-12)
    assert 8 * (1 - 0.75**8) == pytest.approx(7.1991, abs=1e-4)


@pytest.mark.parametrize("name", MOE_MODELS)
def test_moe_catalog_counts_match_their_model_cards(name):
    m = load_model(name)
    assert m.source.startswith("https://huggingface.co/") and m.source.endswith("config.json")
    assert m.params_total() == pytest.approx(m.published_params, rel=0.01)
    # DeepSeek counts "activated" without the embedding (2.4B of our 2.66B); the others within 5%
    assert m.params_active_per_token() == pytest.approx(m.published_active_params, rel=0.12)
    assert m.params_active_per_token() < m.params_total()


def test_memory_estimate_uses_total_parameters():
    m, hw = load_model("mixtral-8x7b"), load_hardware("h100-sxm")
    opts = memory_options(dtype="bf16", kv_dtype="bf16", tp=2, max_batched_tokens=32768)
    plan = plan_memory(m, hw, opts)
    assert plan.weight_bytes_per_gpu == m.params_total() * 2 / 2
    with pytest.raises(InfersimError, match="does not fit"):
        plan_memory(m, hw, memory_options(dtype="bf16", kv_dtype="bf16", max_batched_tokens=32768))


def test_deepseek_layer_pattern_and_latent_cache():
    m = load_model("deepseek-v2-lite")
    assert [m.moe.is_moe_layer(i) for i in range(3)] == [False, True, True]
    assert (m.dense_layers, m.moe_layers) == (1, 26)
    assert m.bytes_kv_per_token("bf16") == 27 * (512 + 64) * 2  # latent + rotary key, all layers
    # the latent is whole on every tensor-parallel rank
    assert m.bytes_kv_per_token_per_gpu(4, "bf16") == m.bytes_kv_per_token("bf16")
    assert load_model("deepseek-v3").moe_layers == 58


def _hf(model_type, **extra):
    return {"model_type": model_type, "torch_dtype": "bfloat16", **extra}


HF_MIXTRAL = _hf(
    "mixtral",
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    num_local_experts=8,
    num_experts_per_tok=2,
    vocab_size=32000,
    max_position_embeddings=32768,
    tie_word_embeddings=False,
)
HF_DEEPSEEK_V2_LITE = _hf(
    "deepseek_v2",
    hidden_size=2048,
    intermediate_size=10944,
    moe_intermediate_size=1408,
    num_hidden_layers=27,
    num_attention_heads=16,
    num_key_value_heads=16,
    n_routed_experts=64,
    n_shared_experts=2,
    num_experts_per_tok=6,
    first_k_dense_replace=1,
    moe_layer_freq=1,
    kv_lora_rank=512,
    q_lora_rank=None,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    vocab_size=102400,
    max_position_embeddings=163840,
)
HF_QWEN_MOE = _hf(
    "qwen2_moe",
    hidden_size=2048,
    intermediate_size=5632,
    moe_intermediate_size=1408,
    shared_expert_intermediate_size=5632,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=16,
    num_experts=60,
    num_experts_per_tok=4,
    decoder_sparse_step=1,
    vocab_size=151936,
    max_position_embeddings=8192,
)
HF_QWEN3_MOE = _hf(
    "qwen3_moe",
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    vocab_size=151936,
    max_position_embeddings=40960,
)


@pytest.mark.parametrize(
    "config, catalog",
    [
        (HF_MIXTRAL, "mixtral-8x7b"),
        (HF_DEEPSEEK_V2_LITE, "deepseek-v2-lite"),
        (HF_QWEN_MOE, "qwen1.5-moe-a2.7b"),
        (HF_QWEN3_MOE, "qwen3-30b-a3b"),
    ],
)
def test_hf_config_json_matches_the_catalog(tmp_path, config, catalog):
    path = tmp_path / "ckpt" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    spec = load_model(str(path))
    ref = load_model(catalog)
    assert spec.params_total() == ref.params_total()
    assert spec.params_active_per_token() == ref.params_active_per_token()
    assert spec.bytes_kv_per_token("bf16") == ref.bytes_kv_per_token("bf16")
    assert spec.moe == ref.moe and spec.mla == ref.mla and spec.default_dtype == "bf16"


def test_hf_config_missing_moe_field_names_file_and_field():
    config = {k: v for k, v in HF_DEEPSEEK_V2_LITE.items() if k != "kv_lora_rank"}
    with pytest.raises(InfersimError) as err:
        spec_from_hf_config(config, name="x", source="ds/config.json")
    assert "ds/config.json" in str(err.value) and "'kv_lora_rank'" in str(err.value)


def _datasheet_cost(name="mixtral-8x7b", **options):
    return RooflineCostModel(load_model(name), load_hardware("h100-sxm:datasheet"), dtype="bf16", **options)


def test_routed_expert_decode_time_by_hand():
    """Datasheet roofline, one decode token: two experts' weights read once, memory bound."""
    cm = _datasheet_cost()
    bw = 3350e9  # H100 SXM datasheet; linear and elementwise efficiencies 1.0, no launch cost
    routed = 2.0  # one token, top-2
    gate_up = (H * 2 * I * 2 * 2 + routed * (H + 2 * I) * 2) / bw
    act = routed * 3 * I * 2 / bw
    down = (I * H * 2 * 2 + routed * (I + H) * 2) / bw
    assert float(cm.experts.expert_time_s(1)) == pytest.approx(gate_up + act + down, rel=1e-12)


def test_grouped_expert_gemms_fill_the_sms_together():
    """DeepSeek-V2-Lite, a 2,048-token prefill on the calibrated H100 (132 SMs): each of the 64
    experts gets 2,048 x 6 / 64 = 192 tokens, and its gate+up GEMM (width 2 x 1,408 = 2,816) has
    2 x 22 = 44 output tiles of 128 x 128. Alone that is one wave a third full; in the grouped
    launch the 64 experts' 2,816 tiles take 22 waves, 2,816 / (22 x 132) = 97% full."""
    fill, waves = output_waves(192.0, 2816, 132)
    assert (float(fill), float(waves)) == (44 / 132, 1.0)
    fill, waves = output_waves(192.0, 2816, 132, groups=64.0)
    assert (float(waves), float(fill)) == (22.0, pytest.approx(2816 / (22 * 132), rel=1e-12))
    cm = RooflineCostModel(load_model("deepseek-v2-lite"), load_hardware("h100-sxm"), dtype="bf16")
    ex = cm.experts
    touched = float(ex.distinct_experts(2048.0))
    assert touched == pytest.approx(64.0, abs=1e-6)
    flops, w, a, n_out = ex._gemms[0]  # gate+up, the grouped GEMM's first projection
    alone = gemm_time_s(ex._gemm, flops, w, a, 192.0, n_out, ex._device)
    grouped = gemm_time_s(ex._gemm, flops, w, a, 192.0, n_out, ex._device, 64.0)
    # the compute part loses the lone expert's fill penalty (1/3)^-0.397 = 1.55: 11.7 -> 10.2 us per expert
    assert float(alone) == pytest.approx(11.75e-6, abs=0.01e-6) and float(grouped) == pytest.approx(
        10.20e-6, abs=0.01e-6
    )


def test_decode_cost_grows_with_batch_as_experts_are_touched():
    cm = _datasheet_cost()
    t = {b: float(cm.experts.expert_time_s(b)) for b in (1, 8, 64)}
    # memory bound throughout: time follows the distinct experts read (2, 7.2, 8), not the tokens
    assert t[8] / t[1] == pytest.approx(8 * (1 - 0.75**8) / 2, rel=0.02)
    assert t[64] / t[1] == pytest.approx(4.0, rel=0.05)
    # a dense model of the same active weights reads them all at every batch size
    step = {b: cm.iteration_time_s(BatchShape.decode(np.full(b, 100))) for b in (1, 64)}
    assert step[64] / step[1] > 2.5


def test_measured_skew_touches_fewer_experts_and_a_hot_gpu_straggles():
    skew = (0.3, 0.3, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05)
    moe = MoESpec(
        num_experts=8,
        experts_per_token=2,
        expert_intermediate_size=I,
        expert_popularity=skew,
        popularity_source="test",
    )
    pick = moe.pick_probabilities()
    assert pick.sum() == pytest.approx(2.0)
    assert float(expected_distinct_experts(pick, 8)) < 8 * (1 - 0.75**8)
    base = load_model("mixtral-8x7b")
    skewed = base.model_copy(update={"moe": moe})
    hw = load_hardware("h100-sxm:datasheet")
    uniform = RooflineCostModel(base, hw, dtype="bf16", tensor_parallel=2, expert_parallel=2)
    hot = RooflineCostModel(skewed, hw, dtype="bf16", tensor_parallel=2, expert_parallel=2)
    # GPU 0 holds experts 0-3: 80% of the routing against 50% uniform
    assert float(hot.experts.expert_time_s(4096)) > 1.5 * float(uniform.experts.expert_time_s(4096))


def test_popularity_is_validated():
    with pytest.raises(ValueError, match="sum to 1"):
        MoESpec(
            num_experts=2,
            experts_per_token=1,
            expert_intermediate_size=8,
            expert_popularity=(0.5, 0.6),
            popularity_source="x",
        )


def test_expert_parallel_moves_no_tokens_and_keeps_the_all_reduce():
    """EP over the tensor-parallel group, as vLLM runs it without data-parallel attention: after
    attention's all-reduce both GPUs hold all 1,000 tokens, so nothing is dispatched; each runs
    its 4 whole experts on the 1,000 x 2 / 2 = 1,000 token copies routed to them (the same FLOPs
    as 2,000 copies through half of every expert without EP), and the partial outputs are
    summed by the MLP's all-reduce of 1,000 x 4,096 values, as without EP. The iteration differs
    from TP alone by the experts' time only."""
    ep, tp = _datasheet_cost(tensor_parallel=2, expert_parallel=2), _datasheet_cost(tensor_parallel=2)
    tokens = 1000
    routed_ep, routed_tp = tokens * K / 2, tokens * K
    assert float(ep.experts._load[0]) * tokens == routed_ep
    flops_ep, _ = ep.experts.work(tokens)
    flops_tp, _ = tp.experts.work(tokens)
    assert flops_ep == pytest.approx(routed_ep * (2 * H * 2 * I + 2 * I * H), rel=1e-12)
    assert flops_tp == pytest.approx(routed_tp * (2 * H * 2 * (I / 2) + 2 * (I / 2) * H), rel=1e-12)
    shape = BatchShape.prefill([tokens])
    rows = {r.name: r for r in ep.breakdown(shape)}
    assert "all_to_all" not in rows and rows["allreduce"].count == LAYERS
    assert rows["allreduce"].time_s == {r.name: r for r in tp.breakdown(shape)}["allreduce"].time_s
    experts = LAYERS * (float(ep.experts.expert_time_s(tokens)) - float(tp.experts.expert_time_s(tokens)))
    assert ep.iteration_time_s(shape) - tp.iteration_time_s(shape) == pytest.approx(experts, rel=1e-9)


@pytest.mark.parametrize(
    "model, tp, ep, needle",
    [
        ("llama-2-7b", 2, 2, "no experts"),
        ("mixtral-8x7b", 4, 2, "must equal the tensor-parallel degree"),
        ("qwen1.5-moe-a2.7b", 8, 8, "does not divide the 60 experts"),
    ],
)
def test_expert_parallel_refusals(model, tp, ep, needle):
    with pytest.raises(InfersimError, match=needle) as err:
        _datasheet_cost(model, tensor_parallel=tp, expert_parallel=ep)
    assert "hardware.expert_parallel" in str(err.value)


def _mixtral_workload(**hardware):
    return WorkloadSpec.model_validate(
        {
            "model": "mixtral-8x7b",
            "hardware": {"profile": "h100-sxm", "tensor_parallel": 2, **hardware},
            "serving": {"dtype": "bf16"},
            "requests": requests_section(40, 200, 30, poisson(20.0)),
            "seed": 5,
        }
    )


def test_mixtral_serving_runs_deterministically_with_and_without_expert_parallel():
    for spec in (_mixtral_workload(), _mixtral_workload(expert_parallel=2)):
        a = simulate(spec, build_requests(spec, "."))
        b = simulate(spec, build_requests(spec, "."))
        assert np.array_equal(a.requests["finish_s"], b.requests["finish_s"])
        assert a.metrics.counters["iterations"] > 0


def test_offload_with_a_mixture_of_experts_is_refused(tmp_path, capsys):
    from infersim.cli.main import main

    wl = tmp_path / "moe-offload.yaml"
    wl.write_text(
        "model: mixtral-8x7b\nhardware: {profile: h100-sxm, tensor_parallel: 2}\noffload: {policy: infinigen}\n"
        "requests:\n  count: 5\n  arrival: {type: poisson, rate: 1}\n"
        "  prompt_tokens: {type: fixed, value: 50}\n  output_tokens: {type: fixed, value: 5}\n"
    )
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "r"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "moe-offload.yaml: field 'offload'" in err and "mixtral-8x7b" in err


def test_sim_roofline_names_the_ep_flag(capsys):
    from infersim.cli.main import main

    assert main(["roofline", "--model", "mixtral-8x7b", "--tp", "4", "--ep", "2", "--batch", "1", "--seq", "128"]) == 2
    err = capsys.readouterr().err
    assert "--ep: 2 must equal the tensor-parallel degree (4)" in err and len(err.strip().splitlines()) == 1


def test_latent_attention_reads_the_latent_per_cached_token():
    cm = _datasheet_cost("deepseek-v2-lite", tensor_parallel=2)
    shape = BatchShape.decode([1000])
    rows = {r.name: r for r in cm.breakdown(shape)}
    more = {r.name: r for r in cm.breakdown(BatchShape.decode([2000]))}
    # 1,000 more cached tokens read 1,000 more latents of 512 + 64 bf16 values, on every rank
    assert more["qk"].bytes - rows["qk"].bytes == 1000 * (512 + 64) * 2
    assert more["pv"].bytes == rows["pv"].bytes
    assert rows["kv_write"].bytes == (512 + 64) * (2 + 2)
    counts = {r.name: r.count for r in cm.breakdown(shape)}
    assert counts["qk"] == 27 and counts["gate_up_proj"] == 1 and counts["router"] == 26
