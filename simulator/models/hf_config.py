"""A Hugging Face `config.json` to a `ModelSpec`, for the dense decoder families we model.

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
    )


_FAMILIES: dict[str, Callable[[_Fields], dict]] = {
    "llama": _llama,
    "mistral": _llama,
    "opt": _opt,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
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
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)} (dense decoders only)"
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
