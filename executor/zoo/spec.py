"""What the zoo builds: a tokenizer and a few small causal LMs, each a recipe. A recipe is
plain data; the zoo's cache key hashes all of them, so changing any number rebuilds."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelRecipe:
    name: str
    arch: str = "llama"  # llama | opt
    layers: int = 1
    hidden: int = 128
    heads: int = 4
    kv_heads: int | None = None  # None: = heads (Llama only; GQA when fewer)
    intermediate: int = 352
    max_positions: int = 4096
    # training: `steps` AdamW steps of `batch` windows of `seq_len` tokens
    steps: int = 200
    batch: int = 16
    seq_len: int = 256
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 30
    weight_decay: float = 0.1
    seed: int = 0
    data: str = "all"  # all | even | odd: which training files (the drafts may see different text)
    distill_from: str | None = None  # a model of the same zoo: KL to its next-token distribution
    role: str = "target"  # target | draft | extra
    description: str = ""


@dataclass(frozen=True)
class ZooSpec:
    vocab_size: int = 1024
    autocast_bf16: bool = True
    threads: int = 2
    max_files: int | None = None  # None: the whole corpus; a number: its first files (tiny test zoos)
    eval_windows: int = 64
    eval_seq_len: int = 256
    accept_prompts: int = 16
    accept_prompt_len: int = 64
    accept_gen_len: int = 64
    accept_s: int = 4
    models: tuple[ModelRecipe, ...] = field(default_factory=tuple)

    def recipe(self, name: str) -> ModelRecipe:
        for r in self.models:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def canonical_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def for_host(self) -> "ZooSpec":
        """This spec as this machine trains it: bf16 autocast only where the CPU computes bf16
        natively (AVX512-BF16 or AMX). Elsewhere torch emulates it: on a 2-core AVX2 EPYC a training
        step of zoo-target takes 7.4 s with it against 0.56 s in fp32, an hour and more for the
        zoo. The zoo's key and records carry the flag as trained."""
        if self.autocast_bf16 and not native_bf16():
            return dataclasses.replace(self, autocast_bf16=False)
        return self


def native_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (torch's own reading of the CPU)."""
    import torch

    caps = getattr(torch.cpu, "get_capabilities", None)
    if caps is None:  # an older torch: assume the instructions, as the zoo did before
        return True
    c = caps()
    return bool(c.get("avx512_bf16") or c.get("amx_bf16"))


# The default zoo: a 3-layer x 192 Llama target (~100 s) and drafts of different
# sizes and data distilled from it (~30 s each), plus a small OPT so that family is served by
# the engine on real weights too. Step counts, not wall time, fix the training: deterministic.
# Trained in fp32 on every CPU, so its build key, and with it the weights shipped with the
# package (shipped.py), are the same on a host with bf16 instructions and one without.
# Recipe fields left out keep ModelRecipe's defaults (batch 16 windows of 256 tokens).
_DRAFT_1X128 = ModelRecipe(
    "zoo-draft-a",
    layers=1,
    hidden=128,
    heads=4,
    intermediate=352,
    steps=240,
    lr=4e-3,
    seed=1,
    distill_from="zoo-target",
    role="draft",
    description="Llama 1 x 128, distilled from zoo-target on all training files",
)
DEFAULT_ZOO = ZooSpec(
    autocast_bf16=False,
    models=(
        ModelRecipe(
            "zoo-target",
            layers=3,
            hidden=192,
            heads=6,
            kv_heads=2,
            intermediate=512,
            steps=500,
            lr=3e-3,
            seed=0,
            role="target",
            description="Llama 3 x 192 (GQA 6 query / 2 KV heads), trained on the stdlib corpus",
        ),
        _DRAFT_1X128,
        ModelRecipe(
            "zoo-draft-b",
            layers=2,
            hidden=96,
            heads=3,
            intermediate=256,
            steps=200,
            lr=4e-3,
            seed=2,
            distill_from="zoo-target",
            role="draft",
            description="Llama 2 x 96, distilled from zoo-target on all training files",
        ),
        # zoo-draft-a's shape and training on other text: how much the data alone moves acceptance
        dataclasses.replace(
            _DRAFT_1X128,
            name="zoo-draft-c",
            seed=3,
            data="odd",
            description="Llama 1 x 128, distilled from zoo-target on every other training file only",
        ),
        ModelRecipe(
            "zoo-opt",
            arch="opt",
            layers=2,
            hidden=128,
            heads=4,
            intermediate=512,
            max_positions=2048,
            steps=120,
            lr=3e-3,
            seed=4,
            distill_from="zoo-target",
            role="extra",
            description="OPT 2 x 128 (learned positions, LayerNorm, ReLU), distilled from zoo-target",
        ),
    ),
)

# A zoo small enough to build twice in a test (determinism): a slice of the corpus, a small
# vocabulary and a few steps of a tiny model and a distilled draft.
TINY_ZOO = ZooSpec(
    vocab_size=320,
    max_files=24,
    eval_windows=4,
    eval_seq_len=64,
    accept_prompts=2,
    accept_prompt_len=16,
    accept_gen_len=8,
    models=(
        ModelRecipe("zoo-target", layers=1, hidden=32, heads=2, intermediate=64, steps=6, batch=4, seq_len=64, seed=0),
        ModelRecipe(
            "zoo-draft-a",
            layers=1,
            hidden=16,
            heads=2,
            intermediate=32,
            steps=4,
            batch=4,
            seq_len=64,
            seed=1,
            distill_from="zoo-target",
            role="draft",
        ),
    ),
)
