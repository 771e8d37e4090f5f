"""Assemble a speculative decoder from model names (zoo names or checkpoint folders) or
already loaded models."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from infersim.simulator.errors import InfersimError
from infersim.simulator.speculative.minions import SSMWeights

from ..models import load_model
from .decoder import SpeculativeDecoder
from .draft import DraftModel
from .minions import MinionsProposer
from .proposers import NoDraft, SingleDraft
from .sequence import SpecSequence
from .target import TargetModel


def _load(m, device, dtype):
    if hasattr(m, "model") and hasattr(m, "family"):
        return m

    return load_model(str(m), device=device, dtype=dtype)


@dataclass(frozen=True)
class DecoderOptions:
    """How build_decoder assembles a speculative decoder, apart from its models."""

    method: str = field(
        default="draft",
        metadata={
            "help": "'none' (plain decoding through the same loop), 'draft' (one draft), 'minions' (majority vote)"
        },
    )
    s: int = field(default=4, metadata={"help": "speculation length: tokens drafted per round (0: none)"})
    temperature: float = field(default=0.0, metadata={"help": "0: greedy; > 0: rejection sampling (draft only)"})
    seed: int = field(default=0, metadata={"help": "seed of sampling and of Minions' vote ties"})
    block_size: int = field(default=16, metadata={"help": "tokens per KV block"})
    gpu_blocks: int = field(default=2048, metadata={"help": "KV blocks of each model's pool"})
    max_batch_size: int = field(default=256, metadata={"help": "sequences verified together at most"})
    selector: object = field(default=None, metadata={"help": "None (fixed s) or an AdaptiveLengthSelector"})
    weights: object = field(default=None, metadata={"help": "None (all 1) or an SSMWeights for Minions"})
    acr_scope: str = field(
        default="all", metadata={"help": "Minions: each SSM scored on all outputs or on those it was voted for"}
    )
    names: tuple | None = field(default=None, metadata={"help": "the drafts' names; None: their model names"})
    device: str | None = field(default="cpu", metadata={"help": "torch device models given by name load on"})
    dtype: str | None = field(default=None, metadata={"help": "their dtype; None: the device's default"})


def build_decoder(target, drafts=(), opts: DecoderOptions = DecoderOptions()) -> SpeculativeDecoder:
    """A speculative decoder of `target` with `drafts` (loaded models or names) as `opts` says."""
    o = opts
    tlm = _load(target, o.device, o.dtype)
    dlms = [_load(d, o.device, o.dtype) for d in drafts]
    for d in dlms:
        if d.vocab_size != tlm.vocab_size:
            raise InfersimError(
                f"draft {d.name}: vocabulary of {d.vocab_size} tokens, target {tlm.name} has "
                f"{tlm.vocab_size}: a draft must share the target's tokenizer"
            )
    names = list(o.names) if o.names is not None else [d.name for d in dlms]
    tm = TargetModel(tlm, gpu_blocks=o.gpu_blocks, block_size=o.block_size)
    if o.method == "none" or o.s == 0:
        proposer = NoDraft()
    elif o.method == "draft":
        if len(dlms) != 1:
            raise InfersimError(f"method 'draft' takes exactly one draft model, got {len(dlms)}")
        proposer = SingleDraft(
            DraftModel(dlms[0], index=0, gpu_blocks=o.gpu_blocks, block_size=o.block_size, name=names[0])
        )
    elif o.method == "minions":
        if not dlms:
            raise InfersimError("method 'minions' needs at least one draft model")
        ds = [
            DraftModel(d, index=j, gpu_blocks=o.gpu_blocks, block_size=o.block_size, name=n)
            for j, (d, n) in enumerate(zip(dlms, names))
        ]
        weights = o.weights
        if weights is None:
            weights = SSMWeights(np.ones(len(ds)))
        proposer = MinionsProposer(ds, weights, acr_scope=o.acr_scope, seed=o.seed)
    else:
        raise InfersimError(f"unknown speculation method '{o.method}': use none, draft or minions")
    return SpeculativeDecoder(
        tm,
        proposer,
        s=o.s,
        temperature=o.temperature,
        seed=o.seed,
        selector=o.selector,
        max_batch_size=o.max_batch_size,
    )


WARM_UP_GROUPS = (1, 2, 4, 8)
WARM_UP_PROMPT = list(range(1, 17))


def _warm_up_groups(caches, s: int, group_sizes=WARM_UP_GROUPS):
    """The group sizes whose dummy sequences fit every pool (a small pool warms fewer)."""
    per_seq = caches[0].blocks_for_tokens(len(WARM_UP_PROMPT) + s + 1)
    free = min(c.free_gpu for c in caches)
    return [n for n in group_sizes if n * per_seq <= free]


def warm_up_drafts(drafts, s: int = 4) -> None:
    """Each draft's drafting on dummy sequences for a few group sizes, then its counters back to
    zero (first calls of new shapes cost 2-5x: a fresh process's first drafting rounds took
    2.4-5.1 ms against 1.1 ms later for one sequence)."""
    drafts = list(drafts)
    if not drafts:
        return
    for n in _warm_up_groups([d.cache for d in drafts], s):
        seqs = [SpecSequence(-1 - j, WARM_UP_PROMPT, s + 2, len(drafts)) for j in range(n)]
        for d in drafts:
            d.propose(seqs, [s] * n)
            for q in seqs:
                d.release(q)
    for d in drafts:
        d.steps = d.released_blocks = 0


def warm_up(decoder, s: int = 4) -> None:
    """First calls of new shapes cost 2-5x (a fresh engine's first verification passes took
    4.7-5.9 ms against 2.6 ms later): run the target's prefill and verification on dummy
    sequences for a few batch sizes, and the in-process drafts' drafting (warm_up_drafts), then
    put every counter back. The proposer's own state (voting weights, selector) is not touched."""
    target = decoder.target
    for n in _warm_up_groups([target.cache], s):
        seqs = [SpecSequence(-1 - j, WARM_UP_PROMPT, s + 2, 1) for j in range(n)]
        target.step(seqs, [])
        target.step([], [(q, [1] * s, None) for q in seqs])
        for q in seqs:
            target.release(q)
    target.steps = target.released_blocks = 0
    warm_up_drafts(getattr(decoder.proposer, "drafts", []), s)


def make_sequences(prompts, output_lens, n_drafts: int, arrival_s=None):
    if np.isscalar(output_lens):
        output_lens = [int(output_lens)] * len(prompts)
    return [
        SpecSequence(i, p, o, n_drafts, 0.0 if arrival_s is None else float(arrival_s[i]))
        for i, (p, o) in enumerate(zip(prompts, output_lens))
    ]


def speculative_generate(target, drafts, prompts, output_lens, opts: DecoderOptions = DecoderOptions()):
    """Outputs (token ids per prompt) and the decoder (its stats) for a batch of prompts."""
    dec = build_decoder(target, drafts, opts)
    n = len(getattr(dec.proposer, "drafts", []))
    seqs = make_sequences(prompts, output_lens, max(n, 1))
    return dec.generate(seqs), dec
