"""The model catalog: published parameter counts, hand-computed sizes, HF config.json import,
and one-line errors for bad names and bad files."""

import json

import pytest

from infersim.simulator.errors import InfersimError, UnknownNameError
from infersim.simulator.models.catalog import list_models, load_model
from infersim.simulator.models.hf_config import spec_from_hf_config
from infersim.simulator.paths import models_dir
from infersim.simulator.registry import name_key
from infersim.simulator.yamlio import load_mapping

EXPECTED_MODELS = {
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-7b",
    "llama-13b",
    "llama-33b",
    "llama-65b",
    "vicuna-7b",
    "vicuna-13b",
    "vicuna-33b",
    "opt-125m",
    "opt-1.3b",
    "opt-6.7b",
    "opt-13b",
    "opt-30b",
    "opt-66b",
    "llama-68m",
    "llama-160m",
    "mistral-7b",
    "zephyr-7b",
}
# the six models whose kernels microsoft/vidur's GPU tables measured (the shipped A100, A40 and
# H100 calibrations and their measured GEMM shapes), and the models people serve beside them
MEASURED_ON_GPUS = {
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama-3-70b": "meta-llama/Meta-Llama-3-70B",
    "qwen-72b": "Qwen/Qwen-72B",
    "codellama-34b": "codellama/CodeLlama-34b-Instruct-hf",
    "internlm-20b": "internlm/internlm-20b",
    "phi-2": "microsoft/phi-2",
}
SERVED_TODAY = {"llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "qwen2.5-72b", "phi-1.5"}
EXPECTED_MODELS |= set(MEASURED_ON_GPUS) | SERVED_TODAY


def test_catalog_lists_every_required_model():
    assert EXPECTED_MODELS <= set(list_models())


@pytest.mark.parametrize("name", sorted(EXPECTED_MODELS))
def test_params_within_one_percent_of_published(name):
    spec = load_model(name)
    assert spec.name == name
    assert spec.source and spec.published_params and spec.published_params_source
    assert spec.params_total() == pytest.approx(spec.published_params, rel=0.01)


def test_aliases_are_unique_across_the_catalog():
    seen = {}
    for path in sorted(models_dir().glob("*.yaml")):
        data = load_mapping(path)
        for key in {name_key(path.stem), name_key(data["name"]), *map(name_key, data.get("aliases", []))}:
            assert key not in seen, f"{key} in both {seen.get(key)} and {path.name}"
            seen[key] = path.name


@pytest.mark.parametrize(
    "alias, name",
    [
        ("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
        ("facebook/opt-13b", "opt-13b"),
        ("lmsys/vicuna-7b-v1.3", "vicuna-7b"),
        ("llama-32.5b", "llama-33b"),
        ("LLaMA-30B", "llama-33b"),
        ("JackFram/llama-160m", "llama-160m"),
        ("mistralai/Mistral-7B-v0.1", "mistral-7b"),
    ],
)
def test_aliases_resolve(alias, name):
    assert load_model(alias).name == name


@pytest.mark.parametrize("name", sorted(MEASURED_ON_GPUS))
def test_the_gpu_tables_model_ids_resolve(name):
    assert load_model(MEASURED_ON_GPUS[name]).name == name


def test_every_name_and_alias_resolves_to_its_file():
    for path in sorted(models_dir().glob("*.yaml")):
        data = load_mapping(path)
        for key in [path.stem, data["name"], *data.get("aliases", [])]:
            assert load_model(key).name == data["name"], f"{key} in {path.name}"


def test_exact_published_counts():
    assert load_model("llama-2-7b").params_total() == 6_738_415_616
    assert load_model("llama-2-70b").params_total() == 68_976_648_192
    assert load_model("opt-125m").params_total() == 125_239_296
    assert load_model("opt-1.3b").params_total() == 1_315_758_080
    assert load_model("llama-68m").params_total() == 68_030_208
    # the same counts transformers 5.23 gives for these config.json shapes (models built on the meta device)
    assert load_model("llama-3-8b").params_total() == 8_030_261_248
    assert load_model("qwen2.5-7b").params_total() == 7_615_616_512
    assert load_model("phi-1.5").params_total() == 1_418_270_720


def test_phi2_count_by_hand():
    """One LayerNorm per layer (weight and bias), biases on q/k/v/dense and fc1/fc2, untied
    lm_head with a bias, a final LayerNorm."""
    h, i, v, layers = 2560, 10240, 51200, 32
    per_layer = (4 * h * h + 4 * h) + (2 * h * i + i + h) + 2 * h
    total = layers * per_layer + v * h + (v * h + v) + 2 * h
    phi = load_model("phi-2")
    assert phi.params_total() == total == 2_779_683_840
    assert phi.norms_per_layer == 1 and phi.rotary_fraction == 0.4


def test_qwen72b_mlp_width_is_half_the_config_intermediate_size():
    """Qwen v1's config.json says intermediate_size 49152; w1 and w2 are each 24576 wide. Biases
    on q, k and v only."""
    h, i, v, layers = 8192, 24576, 152064, 80
    per_layer = (4 * h * h + 3 * h) + 3 * h * i + 2 * h
    q = load_model("qwen-72b")
    assert q.intermediate_size == 49152 // 2 and q.kv_heads == 64
    assert q.params_total() == layers * per_layer + 2 * v * h + h == 72_287_920_128


def test_kv_bytes_per_token_by_hand():
    assert load_model("llama-2-7b").bytes_kv_per_token("fp16") == 2 * 32 * 4096 * 2 == 524288
    # GQA: only the 8 KV heads of 128 dims are cached.
    assert load_model("llama-2-70b").bytes_kv_per_token("fp16") == 2 * 80 * 8 * 128 * 2 == 327680
    assert load_model("mistral-7b").bytes_kv_per_token("fp16") == 2 * 32 * 8 * 128 * 2
    assert load_model("opt-13b").bytes_kv_per_token("fp16") == 2 * 40 * 5120 * 2
    assert load_model("llama-2-7b").bytes_kv_per_block(16, "int8") == 16 * 2 * 32 * 4096


def test_weight_bytes_by_dtype():
    """Quantisation (fp8, int8, int4) applies to the decoder layers' weights; the embedding, the
    final norm and the LM head stay 16-bit, as vLLM's quantisation methods leave them.
    Llama-2-13B: 2 x 32,000 x 5,120 + 5,120 = 327,685,120 such parameters."""
    spec = load_model("llama-2-13b")
    p = spec.params_total()
    edges = 2 * 32_000 * 5_120 + 5_120
    assert spec.params_edges() == edges
    assert spec.weight_bytes("fp16") == 2 * p
    assert spec.weight_bytes("fp32") == 4 * p
    assert spec.weight_bytes("int8") == (p - edges) + 2 * edges
    assert spec.weight_bytes("fp8") == (p - edges) + 2 * edges
    # int4: half a byte, plus an fp16 scale and a 4-bit zero point per group of 128 weights
    assert spec.weight_bytes("int4") == (p - edges) * (0.5 + 2.5 / 128) + 2 * edges


def test_int4_checkpoint_size_matches_a_published_awq_checkpoint():
    """hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4 (AutoAWQ, group size 128, zero points)
    ships as two safetensors shards of 4.68 and 1.05 GB: 5.73 GB. Llama-3-8B's 6,979,584,000
    decoder-layer weights at 0.51953 bytes (3.626 GB) and its 1,050,677,248 embedding and LM-head
    weights at 2 bytes (2.101 GB) make 5.727 GB; at a bare 0.5 bytes they would make 5.59 GB."""
    spec = load_model("llama-3-8b")
    assert spec.params_total() - spec.params_edges() == 6_979_584_000
    assert spec.weight_bytes("int4") == pytest.approx(5.73e9, rel=0.002)
    assert (spec.params_total() - spec.params_edges()) * 0.5 + 2 * spec.params_edges() < 5.73e9 * 0.98


def test_family_conventions():
    opt = load_model("opt-6.7b")
    assert (opt.mlp, opt.norm, opt.attention_bias, opt.mlp_bias) == ("plain", "layernorm", True, True)
    assert opt.tied_embeddings and opt.learned_positions and opt.position_offset == 2
    assert opt.max_position_embeddings == 2048
    for name in ("llama-2-7b", "mistral-7b", "vicuna-13b"):
        s = load_model(name)
        assert (s.mlp, s.norm, s.attention_bias, s.tied_embeddings) == ("gated", "rmsnorm", False, False)
    assert load_model("zephyr-7b").kv_heads == 8


def test_load_model_is_cached():
    assert load_model("llama-2-7b") is load_model("meta-llama/Llama-2-7b-hf")


# ---- Hugging Face config.json -------------------------------------------------------------
HF_CONFIGS = {
    "llama": (
        {
            "model_type": "llama",
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 32,
            "vocab_size": 32000,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": False,
            "torch_dtype": "float16",
        },
        6_738_415_616,
    ),
    "mistral": (
        {
            "model_type": "mistral",
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "vocab_size": 32000,
            "max_position_embeddings": 32768,
            "sliding_window": 4096,
            "torch_dtype": "bfloat16",
        },
        7_241_732_096,
    ),
    "opt": (
        {
            "model_type": "opt",
            "hidden_size": 768,
            "ffn_dim": 3072,
            "num_attention_heads": 12,
            "num_hidden_layers": 12,
            "vocab_size": 50272,
            "max_position_embeddings": 2048,
            "word_embed_proj_dim": 768,
            "do_layer_norm_before": True,
            "torch_dtype": "float16",
        },
        125_239_296,
    ),
    "gpt2": (
        {
            "model_type": "gpt2",
            "n_embd": 768,
            "n_layer": 12,
            "n_head": 12,
            "n_inner": None,
            "n_positions": 1024,
            "n_ctx": 1024,
            "vocab_size": 50257,
        },
        124_439_808,
    ),
    "gpt_neox": (
        {
            "model_type": "gpt_neox",
            "hidden_size": 768,
            "intermediate_size": 3072,
            "num_attention_heads": 12,
            "num_hidden_layers": 12,
            "vocab_size": 50304,
            "max_position_embeddings": 2048,
            "rotary_pct": 0.25,
            "tie_word_embeddings": False,
            "torch_dtype": "float16",
        },
        162_322_944,
    ),  # pythia-160m
    "phi": (
        {
            "model_type": "phi",
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 32,
            "vocab_size": 51200,
            "max_position_embeddings": 2048,
            "partial_rotary_factor": 0.4,
            "qk_layernorm": False,
            "tie_word_embeddings": False,
            "hidden_act": "gelu_new",
            "torch_dtype": "float16",
        },
        2_779_683_840,
    ),  # phi-2
    "qwen2": (
        {
            "model_type": "qwen2",
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_attention_heads": 28,
            "num_hidden_layers": 28,
            "num_key_value_heads": 4,
            "vocab_size": 152064,
            "max_position_embeddings": 131072,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
        },
        7_615_616_512,
    ),  # Qwen2.5-7B
    "qwen": (
        {
            "model_type": "qwen",
            "hidden_size": 8192,
            "intermediate_size": 49152,
            "num_attention_heads": 64,
            "num_hidden_layers": 80,
            "kv_channels": 128,
            "vocab_size": 152064,
            "max_position_embeddings": 32768,
            "seq_length": 32768,
            "no_bias": True,
            "rotary_pct": 1.0,
            "tie_word_embeddings": False,
        },
        72_287_920_128,
    ),  # Qwen-72B
}


def _write_checkpoint(tmp_path, folder, config):
    d = tmp_path / folder
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.mark.parametrize("family", sorted(HF_CONFIGS))
def test_hf_config_json_loads_with_expected_count(tmp_path, family):
    config, params = HF_CONFIGS[family]
    ckpt = _write_checkpoint(tmp_path, f"my-{family}", config)
    by_dir = load_model(str(ckpt))
    by_file = load_model(str(ckpt / "config.json"))
    assert by_dir == by_file
    assert by_dir.family == family and by_dir.name == f"my-{family}"
    assert by_dir.params_total() == params


def test_hf_config_matches_catalog_entry(tmp_path):
    config, _ = HF_CONFIGS["mistral"]
    from_hf = load_model(str(_write_checkpoint(tmp_path, "m", config)))
    catalog = load_model("mistral-7b")
    assert from_hf.params_total() == catalog.params_total()
    assert from_hf.bytes_kv_per_token() == catalog.bytes_kv_per_token()
    assert from_hf.default_dtype == "bf16"


@pytest.mark.parametrize("family, catalog", [("phi", "phi-2"), ("qwen2", "qwen2.5-7b"), ("qwen", "qwen-72b")])
def test_hf_config_matches_the_catalog_entry(tmp_path, family, catalog):
    from_hf = load_model(str(_write_checkpoint(tmp_path, "m", HF_CONFIGS[family][0])))
    ref = load_model(catalog)
    shape = ("params_total", "bytes_kv_per_token", "params_attention_per_layer", "params_mlp_per_layer")
    assert [getattr(from_hf, f)() for f in shape] == [getattr(ref, f)() for f in shape]
    fields = ("rotary_fraction", "parallel_block", "shared_block_norm", "lm_head_bias", "max_position_embeddings")
    assert [getattr(from_hf, f) for f in fields] == [getattr(ref, f) for f in fields]


def test_hf_gpt_neox_partial_rotary_and_parallel_residual():
    neox = spec_from_hf_config(HF_CONFIGS["gpt_neox"][0], name="p", source="p/config.json")
    assert neox.rotary_fraction == 0.25 and neox.parallel_block and not neox.shared_block_norm
    assert neox.norms_per_layer == 2  # each branch its own LayerNorm
    config = dict(HF_CONFIGS["gpt_neox"][0], use_parallel_residual=False)
    del config["rotary_pct"]  # GPTNeoXConfig's default: 0.25
    seq = spec_from_hf_config(config, name="s", source="s/config.json")
    assert not seq.parallel_block and seq.rotary_fraction == 0.25
    assert seq.params_total() == neox.params_total()


@pytest.mark.parametrize(
    "family, field, value",
    [("phi", "partial_rotary_factor", 1.5), ("phi", "qk_layernorm", True), ("qwen", "no_bias", False)],
)
def test_hf_unmodelled_or_bad_field_names_file_and_field(family, field, value):
    config = dict(HF_CONFIGS[family][0], **{field: value})
    with pytest.raises(InfersimError) as err:
        spec_from_hf_config(config, name="x", source="x/config.json")
    assert str(err.value).startswith(f"x/config.json: field '{field}'") and "\n" not in str(err.value)


def test_hf_gpt2_details():
    spec = spec_from_hf_config(HF_CONFIGS["gpt2"][0], name="gpt2", source="gpt2/config.json")
    assert spec.intermediate_size == 4 * 768  # n_inner: null
    assert spec.tied_embeddings and spec.learned_positions and spec.max_position_embeddings == 1024
    assert spec.default_dtype == "fp16"


def test_hf_head_dim_and_tying():
    config = dict(HF_CONFIGS["llama"][0], head_dim=64, num_key_value_heads=4, tie_word_embeddings=True)
    spec = spec_from_hf_config(config, name="x", source="x/config.json")
    assert spec.dim_head == 64 and spec.kv_heads == 4 and spec.tied_embeddings
    assert spec.bytes_kv_per_token("fp16") == 2 * 32 * 4 * 64 * 2


def test_hf_unsupported_model_type_names_file_field_and_choices():
    with pytest.raises(InfersimError) as err:
        spec_from_hf_config({"model_type": "mamba"}, name="m", source="/ckpt/config.json")
    msg = str(err.value)
    assert "/ckpt/config.json" in msg and "model_type" in msg and "mamba" in msg
    for supported in ("llama", "mistral", "opt", "gpt2", "gpt_neox", "mixtral", "qwen2_moe", "deepseek_v2"):
        assert supported in msg
    assert "\n" not in msg


def test_hf_missing_field_names_file_and_field(tmp_path):
    config = {k: v for k, v in HF_CONFIGS["gpt2"][0].items() if k != "n_embd"}
    ckpt = _write_checkpoint(tmp_path, "broken", config)
    with pytest.raises(InfersimError) as err:
        load_model(str(ckpt))
    assert str(ckpt / "config.json") in str(err.value) and "'n_embd'" in str(err.value)


def test_hf_wrong_type_names_the_config_field():
    config = dict(HF_CONFIGS["opt"][0], ffn_dim="3072")
    with pytest.raises(InfersimError, match=r"c\.json: field 'ffn_dim'"):
        spec_from_hf_config(config, name="o", source="c.json")


def test_hf_opt_embedding_projection_rejected():
    config = dict(HF_CONFIGS["opt"][0], word_embed_proj_dim=512)  # the OPT-350m layout
    with pytest.raises(InfersimError, match="word_embed_proj_dim"):
        spec_from_hf_config(config, name="opt-350m", source="opt-350m/config.json")


# ---- errors ---------------------------------------------------------------------------------
def test_unknown_name_lists_known_models():
    with pytest.raises(UnknownNameError) as err:
        load_model("llama-9000b")
    assert err.value.known == sorted(list_models())
    assert "llama-2-7b" in str(err.value) and "opt-13b" in str(err.value)


def test_missing_path_says_file_not_found(tmp_path):
    with pytest.raises(InfersimError, match="file not found"):
        load_model(str(tmp_path / "nope.yaml"))


def test_malformed_yaml_names_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnum_layers: [1, 2\n")
    with pytest.raises(InfersimError) as err:
        load_model(str(bad))
    assert str(bad) in str(err.value) and "malformed YAML" in str(err.value)


def test_wrong_typed_field_names_the_file_and_field(tmp_path):
    data = load_mapping(models_dir() / "llama-2-7b.yaml")
    data["num_layers"] = "thirty-two"
    bad = tmp_path / "typo.yaml"
    bad.write_text(json.dumps(data))  # JSON is valid YAML
    with pytest.raises(InfersimError) as err:
        load_model(str(bad))
    msg = str(err.value)
    assert str(bad) in msg and "num_layers" in msg and "\n" not in msg


def test_model_yaml_path_loads(tmp_path):
    data = load_mapping(models_dir() / "opt-125m.yaml")
    data.update(name="my-opt", aliases=[], num_layers=6)
    path = tmp_path / "my-opt.yaml"
    path.write_text(json.dumps(data))
    spec = load_model(str(path))
    assert spec.name == "my-opt" and spec.num_layers == 6
    # An edited file is re-read, not served from the cache.
    data["num_layers"] = 3
    path.write_text(json.dumps(data) + "\n")
    assert load_model(str(path)).num_layers == 3


def test_layout_fields_at_their_defaults_keep_a_model_s_config_hash():
    """Per-model calibrations are keyed by the shape's hash: the layout fields (partial rotary,
    parallel block, o_proj and lm_head biases) enter it only when set, so models that existed
    before them keep their hashes, and a phi block hashes apart from a sequential one."""
    from infersim.simulator.costmodel.regression import model_config_hash

    assert model_config_hash(load_model("llama-2-7b"))[:16] == "0aa8dcb83a122e9d"
    assert model_config_hash(load_model("opt-13b"))[:16] == "99feccde8a05c460"
    assert model_config_hash(load_model("deepseek-v3"))[:16] == "227807eea6e549cf"
    phi = load_model("phi-2")
    sequential = phi.model_copy(update=dict(parallel_block=False, shared_block_norm=False))
    assert model_config_hash(phi) != model_config_hash(sequential)
