"""A Hugging Face `config.json` to a `ModelSpec`, for the decoder families we model: dense
(llama, mistral, qwen, qwen2, phi, opt, gpt2, gpt_neox) and mixtures of experts (mixtral,
qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3).

Each family names the same shape differently and differs in biases, norms, tying and
position embeddings; the defaults below are those of the family's transformers config class,
used when a config.json leaves the field out."""

from __future__ import annotations

from typing import Any, Callable

from ..errors import InfersimError
from ..yamlio import validate
from .spec import ModelSpec

_MISSING = object()


class _Fields:
    """Reads config.json fields, reporting problems with the file and the config's field name
    (not ours: a user fixing `n_embd` should be told `n_embd`)."""

    def __init__(self, config: dict, source: str):
        self.config, self.source = config, source

    def _fail(self, key: str, why: str):
        raise InfersimError(f"{self.source}: field '{key}': {why}")

    def integer(self, key: str, default: Any = _MISSING) -> int | None:
        value = self.config.get(key, _MISSING)
        if value is _MISSING or (value is None and default is not _MISSING):
            if default is _MISSING:
                self._fail(key, f"required for model_type '{self.config.get('model_type')}' but missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self._fail(key, f"expected a positive integer, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.config.get(key, default)
        if not isinstance(value, bool):
            self._fail(key, f"expected true or false, got {value!r}")
        return value

    def fraction(self, key: str, default: float) -> float:
        """A share in (0, 1], such as partial_rotary_factor."""
        value = self.config.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            self._fail(key, f"expected a number in (0, 1], got {value!r}")
        return float(value)


def _llama(f: _Fields) -> dict:
    # MistralConfig shares LlamaConfig's field names; only its defaults differ.
    mistral = f.config.get("model_type") == "mistral"
    return dict(
        hidden_size=f.integer("hidden_size"),
        num_layers=f.integer("num_hidden_layers"),
        num_heads=f.integer("num_attention_heads"),
        num_kv_heads=f.integer("num_key_value_heads", None),
        head_dim=f.integer("head_dim", None),
        intermediate_size=f.integer("intermediate_size"),
        vocab_size=f.integer("vocab_size"),
        max_position_embeddings=f.integer("max_position_embeddings", 4096 * 32 if mistral else 2048),
        mlp="gated",
        norm="rmsnorm",
        attention_bias=f.flag("attention_bias", False),
        mlp_bias=f.flag("mlp_bias", False),
        tied_embeddings=f.flag("tie_word_embeddings", False),
    )


def _qwen2(f: _Fields) -> dict:
    # Qwen2Attention hard-codes biases on q, k and v and none on o; Qwen2Config has no such fields
    fields = _llama(f)
    fields.update(
        max_position_embeddings=f.integer("max_position_embeddings", 32768),
        attention_bias=True,
        o_proj_bias=False,
    )
    return fields


def _qwen(f: _Fields) -> dict:
    # Qwen v1 (QWenLMHeadModel, trust_remote_code): c_attn carries a bias whatever no_bias says,
    # and its MLP's w1 and w2 are each intermediate_size // 2 wide, so the config's
    # intermediate_size is twice the gated MLP's width
    if f.config.get("no_bias", True) is not True:
        f._fail("no_bias", "only no_bias: true (biases on q, k and v alone) is modelled")
    hidden, heads = f.integer("hidden_size"), f.integer("num_attention_heads")
    kv_channels = f.integer("kv_channels", hidden // heads)
    if kv_channels * heads != hidden:
        f._fail("kv_channels", f"{kv_channels} x {heads} heads differs from hidden_size {hidden}")
    intermediate = f.integer("intermediate_size")
    if intermediate % 2:
        f._fail("intermediate_size", f"{intermediate} is not even (w1 and w2 are each half of it)")
    return dict(
        hidden_size=hidden,
        num_layers=f.integer("num_hidden_layers"),
        num_heads=heads,
        intermediate_size=intermediate // 2,
        vocab_size=f.integer("vocab_size"),
        max_position_embeddings=f.integer("max_position_embeddings", f.integer("seq_length", 8192)),
        mlp="gated",
        norm="rmsnorm",
        attention_bias=True,
        o_proj_bias=False,
        tied_embeddings=f.flag("tie_word_embeddings", False),
        rotary_fraction=f.fraction("rotary_pct", 1.0),
    )


def _phi(f: _Fields) -> dict:
    # PhiConfig (phi-1, phi-1.5, phi-2) names its shape as LlamaConfig does; its layer is a
    # parallel block behind one LayerNorm, biases everywhere and on the untied lm_head, rotary
    # over partial_rotary_factor of each head
    if f.flag("qk_layernorm", False):
        f._fail("qk_layernorm", "per-head LayerNorm of queries and keys is not modelled for phi")
    fields = _llama(f)
    fields.update(
        mlp="plain",
        norm="layernorm",
        attention_bias=True,
        mlp_bias=True,
        tied_embeddings=False,
        lm_head_bias=True,
        rotary_fraction=f.fraction("partial_rotary_factor", 0.5),
        parallel_block=True,
        shared_block_norm=True,
    )
    return fields


def _opt(f: _Fields) -> dict:
    hidden = f.integer("hidden_size")
    # OPT-350m projects 512-wide embeddings up to 1024 (project_in/out); ModelSpec has no such
    # projection, so a count from it would be wrong rather than approximate.
    proj = f.integer("word_embed_proj_dim", hidden)
    if proj != hidden:
        f._fail(
            "word_embed_proj_dim", f"{proj} differs from hidden_size {hidden}; embedding projections are not modelled"
        )
    bias = f.flag("enable_bias", True)
    return dict(
        hidden_size=hidden,
        num_layers=f.integer("num_hidden_layers"),
        num_heads=f.integer("num_attention_heads"),
        intermediate_size=f.integer("ffn_dim"),
        vocab_size=f.integer("vocab_size"),
        max_position_embeddings=f.integer("max_position_embeddings", 2048),
        mlp="plain",
        norm="layernorm",
        attention_bias=bias,
        mlp_bias=bias,
        tied_embeddings=f.flag("tie_word_embeddings", True),
        learned_positions=True,
        position_offset=2,  # OPTLearnedPositionalEmbedding keeps 2 extra rows
    )


def _gpt2(f: _Fields) -> dict:
    hidden = f.integer("n_embd")
    return dict(
        hidden_size=hidden,
        num_layers=f.integer("n_layer"),
        num_heads=f.integer("n_head"),
        intermediate_size=f.integer("n_inner", 4 * hidden),  # null in config.json means 4 * n_embd
        vocab_size=f.integer("vocab_size"),
        max_position_embeddings=f.integer("n_positions", 1024),
        mlp="plain",
        norm="layernorm",
        attention_bias=True,
        mlp_bias=True,
        tied_embeddings=f.flag("tie_word_embeddings", True),
        learned_positions=True,
    )


def _gpt_neox(f: _Fields) -> dict:
    return dict(
        hidden_size=f.integer("hidden_size"),
        num_layers=f.integer("num_hidden_layers"),
        num_heads=f.integer("num_attention_heads"),
        intermediate_size=f.integer("intermediate_size"),
        vocab_size=f.integer("vocab_size"),
        max_position_embeddings=f.integer("max_position_embeddings", 2048),
        mlp="plain",
        norm="layernorm",
        attention_bias=f.flag("attention_bias", True),
        mlp_bias=True,
        tied_embeddings=f.flag("tie_word_embeddings", False),
        rotary_fraction=f.fraction("rotary_pct", 0.25),
        # x + attn(ln1(x)) + mlp(ln2(x)): parallel, but each branch with its own LayerNorm
        parallel_block=f.flag("use_parallel_residual", True),
    )


def _mixtral(f: _Fields) -> dict:
    fields = _llama(f)
    fields["max_position_embeddings"] = f.integer("max_position_embeddings", 4096 * 32)
    fields["moe"] = dict(
        num_experts=f.integer("num_local_experts", 8),
        experts_per_token=f.integer("num_experts_per_tok", 2),
        expert_intermediate_size=fields["intermediate_size"],
    )
    return fields


def _qwen_moe(f: _Fields) -> dict:
    # Qwen2MoeConfig and Qwen3MoeConfig: layer i is sparse when (i + 1) % decoder_sparse_step == 0
    qwen3 = f.config.get("model_type") == "qwen3_moe"
    if f.config.get("mlp_only_layers"):
        f._fail("mlp_only_layers", "dense layers listed one by one are not modelled; only decoder_sparse_step")
    step = f.integer("decoder_sparse_step", 1)
    shared = 0 if qwen3 else f.integer("shared_expert_intermediate_size")
    fields = _llama(f)
    if not qwen3:  # Qwen2MoeAttention biases q, k and v (not o), as Qwen2 does
        fields.update(attention_bias=True, o_proj_bias=False)
    fields.update(
        max_position_embeddings=f.integer("max_position_embeddings", 32768),
        qk_norm=qwen3,
        moe=dict(
            num_experts=f.integer("num_experts"),
            experts_per_token=f.integer("num_experts_per_tok"),
            expert_intermediate_size=f.integer("moe_intermediate_size"),
            num_shared_experts=1 if shared else 0,
            shared_intermediate_size=shared,
            shared_expert_gate=bool(shared),
            layer_freq=step,
            layer_phase=step - 1,
        ),
    )
    return fields


def _deepseek(f: _Fields) -> dict:
    # DeepseekV2Config/V3Config: layer i is sparse when i >= first_k_dense_replace and
    # i % moe_layer_freq == 0; the shared experts are one MLP of n_shared_experts x the expert width
    heads = f.integer("num_attention_heads")
    nope, rope = f.integer("qk_nope_head_dim"), f.integer("qk_rope_head_dim")
    expert = f.integer("moe_intermediate_size")
    n_shared = f.config.get("n_shared_experts") or 0
    if not isinstance(n_shared, int) or isinstance(n_shared, bool) or n_shared < 0:
        f._fail("n_shared_experts", f"expected a whole number >= 0, got {n_shared!r}")
    return dict(
        hidden_size=f.integer("hidden_size"),
        num_layers=f.integer("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=nope + rope,
        intermediate_size=f.integer("intermediate_size"),
        vocab_size=f.integer("vocab_size"),
        max_position_embeddings=f.integer("max_position_embeddings", 2048),
        mlp="gated",
        norm="rmsnorm",
        attention_bias=f.flag("attention_bias", False),
        tied_embeddings=f.flag("tie_word_embeddings", False),
        mla=dict(
            kv_lora_rank=f.integer("kv_lora_rank"),
            q_lora_rank=f.integer("q_lora_rank", None),
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope,
            v_head_dim=f.integer("v_head_dim"),
        ),
        moe=dict(
            num_experts=f.integer("n_routed_experts"),
            experts_per_token=f.integer("num_experts_per_tok"),
            expert_intermediate_size=expert,
            num_shared_experts=n_shared,
            shared_intermediate_size=n_shared * expert,
            first_dense_layers=f.config.get("first_k_dense_replace") or 0,
            layer_freq=f.integer("moe_layer_freq", 1),
        ),
    )


_FAMILIES: dict[str, Callable[[_Fields], dict]] = {
    "llama": _llama,
    "mistral": _llama,
    "qwen": _qwen,
    "qwen2": _qwen2,
    "phi": _phi,
    "opt": _opt,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen_moe,
    "qwen3_moe": _qwen_moe,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
}
SUPPORTED_MODEL_TYPES = tuple(_FAMILIES)

# vLLM's dtype "auto": fp32 checkpoints are served in fp16, 16-bit ones as stored.
_SERVING_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp16"}


def spec_from_hf_config(config: dict, name: str, source: str) -> ModelSpec:
    """`source` names the file in error messages and becomes the spec's `source`."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in _FAMILIES:
        raise InfersimError(
            f"{source}: field 'model_type': unsupported value {model_type!r}; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    fields = _FAMILIES[model_type](_Fields(config, source))
    stored = config.get("torch_dtype", config.get("dtype"))
    fields.update(
        name=name,
        family=model_type,
        source=source,
        default_dtype=_SERVING_DTYPE.get(str(stored).replace("torch.", ""), "fp16"),
    )
    return validate(ModelSpec, fields, source)
