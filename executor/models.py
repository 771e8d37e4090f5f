"""Real models from local Hugging Face checkpoints (config.json + safetensors): the Llama,
Mistral and OPT families, on cpu or cuda, in fp32, fp16 or bf16. Nothing is ever fetched
from a hub (local_files_only). A zoo name (`zoo-target`, `zoo-draft-a`, ...) resolves to the
zoo's checkpoint folder, built on request."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from infersim.simulator.errors import InfersimError

from .device import select_device as checked_device
from .zoo import is_zoo_name, resolve_zoo_model

if TYPE_CHECKING:  # annotations only: torch is imported where the executor starts
    import torch

SUPPORTED_FAMILIES = ("llama", "mistral", "opt")
_DTYPES = {
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
}


def select_device(device: str | None = None):
    """'cpu', 'cuda', 'cuda:N' or None/'auto' (cuda when available); anything else, or CUDA where
    there is none, is one line naming --device (executor/device.py)."""
    return checked_device("auto" if device is None else device)


def check_dtype_name(dtype: str, option: str = "--dtype") -> str:
    """`dtype` when the executor runs it (fp32, fp16, bf16 or torch's names), else one line
    naming `option`."""
    if str(dtype).lower().replace("torch.", "") not in _DTYPES:
        raise InfersimError(f"{option}: the executor runs fp32, fp16 or bf16, got '{dtype}'")
    return dtype


def select_dtype(dtype: str | None, device) -> "torch.dtype":
    """fp32/fp16/bf16 (or torch names); None: fp32 on cpu, fp16 on cuda."""
    if dtype is None:
        return torch.float32 if torch.device(device).type == "cpu" else torch.float16
    name = _DTYPES.get(str(dtype).lower().replace("torch.", ""))
    if name is None:
        raise InfersimError(f"unsupported dtype '{dtype}': use fp32, fp16 or bf16")
    return getattr(torch, name)


def dtype_name(dtype) -> str:
    return {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}[str(dtype)]


def resolve_model_path(name_or_path: str, *, build_zoo: bool = True, log=None) -> Path:
    """A checkpoint folder: a zoo name, a folder holding config.json, or a config.json file."""
    name = str(name_or_path)
    if is_zoo_name(name):
        return resolve_zoo_model(name, build=build_zoo, log=log)
    p = Path(name).expanduser()
    if p.is_file() and p.name == "config.json":
        p = p.parent
    if not p.is_dir():
        raise InfersimError(
            f"model '{name}': not a zoo name and no such checkpoint folder "
            f"(give a folder with config.json and *.safetensors, or zoo-target, zoo-draft-a, ...)"
        )
    if not (p / "config.json").exists():
        raise InfersimError(f"{p}: no config.json: not a Hugging Face checkpoint folder")
    return p


@dataclass
class LoadedModel:
    name: str
    path: Path
    model: object  # transformers PreTrainedModel (causal LM)
    config: object
    family: str  # llama | mistral | opt
    device: object
    dtype: object
    tokenizer: object | None = None  # transformers fast tokenizer when the folder has one
    meta: dict = field(default_factory=dict)  # zoo.json of a zoo model

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def max_positions(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 2048) or 2048)

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


def load_model(
    name_or_path: str, device: str | None = "cpu", dtype: str | None = None, *, build_zoo: bool = True, log=None
) -> LoadedModel:
    """Load a causal LM from a local checkpoint folder (or a zoo name) onto a device."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = resolve_model_path(name_or_path, build_zoo=build_zoo, log=log)
    dev = select_device(device)
    tdtype = select_dtype(dtype, dev)
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises many kinds for a bad config.json
        raise InfersimError(f"{path}/config.json: {_first_line(exc)}") from exc
    family = getattr(config, "model_type", None)
    if family not in SUPPORTED_FAMILIES:
        raise InfersimError(
            f"{path}: model_type '{family}' is not supported by the executor "
            f"(supported: {', '.join(SUPPORTED_FAMILIES)})"
        )
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise InfersimError(f"{path}: no weights (*.safetensors) in the checkpoint folder")
    if tdtype == torch.float16 and dev.type == "cpu":
        pass  # allowed (slow on most CPUs), as Hugging Face allows it
    try:  # a truncated or foreign weights file raises whatever its reader raises
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=tdtype, local_files_only=True, attn_implementation="sdpa"
        )
    except Exception as exc:
        raise InfersimError(f"{path}: the weights do not load: {_first_line(exc)}") from exc
    model.to(dev).eval()
    tokenizer = None
    if (path / "tokenizer.json").exists():
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as exc:
            raise InfersimError(f"{path}/tokenizer.json: does not load: {_first_line(exc)}") from exc
    meta = json.loads((path / "zoo.json").read_text()) if (path / "zoo.json").exists() else {}
    name = str(name_or_path) if not Path(str(name_or_path)).exists() else path.name
    return LoadedModel(name, path, model, config, family, dev, tdtype, tokenizer, meta)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def hf_greedy_generate(model, prompts, outputs) -> list[list[int]]:
    """The reference the engine is held to: plain Hugging Face `generate`, one prompt at a
    time, greedy, EOS ignored; returns each prompt's new token ids."""
    res = []
    with torch.inference_mode():
        for p, o in zip(prompts, outputs):
            g = model.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=o,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            res.append(g[0, len(p) :].tolist())
    return res
