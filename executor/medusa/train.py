"""Medusa-1 training on the frozen target with self-distillation (Medusa sections 2.2.1, 2.3.2).

Data: windows of the zoo's *training* files (never the held-out ones) are prompts; the target
continues each greedily, and the target's own tokens are the labels: head k (1-based) at
position t learns the token at t + k + 1 of the target's continuation. The backbone is frozen,
so its last hidden states (after the final norm) are computed once and training touches only
the heads: a few hundred AdamW steps on cached features, a minute or less on 2 loaded cores.

Loss: sum over heads of lambda_k * CE_k with lambda_k = 0.8^k (Medusa-1; k = 1 for the first
head), each CE averaged over the positions that have a label k + 1 tokens ahead.

Deterministic: torch.manual_seed before the heads are made, a seeded generator for the
prompt windows and the minibatches, a fixed thread count and step count."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..zoo.corpus import load_corpus
from ..zoo.train import lr_at
from .heads import MedusaHeads, lm_head_weight


@dataclass(frozen=True)
class MedusaRecipe:
    num_heads: int = 4
    prompts: int = 192  # training prompts (windows of the training token stream)
    prompt_len: int = 48
    gen_len: int = 96  # the target's greedy continuation of each prompt: the labels
    gen_batch: int = 64
    steps: int = 500
    batch: int = 256  # positions per step
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 20
    weight_decay: float = 0.0
    decay: float = 0.8  # lambda_k = decay ** k
    seed: int = 0
    files_every: int = 4  # prompts come from every 4th training file (enough text, faster to tokenize)
    threads: int = 2
    # accuracy measurement (held-out files): prompts, their length and the continuation scored
    eval_prompts: int = 32
    eval_prompt_len: int = 48
    eval_gen_len: int = 96
    top_k: int = 10
    shared_lm_head: bool = False  # heads use the target's LM head (frozen) instead of their own copies

    def canonical_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))


DEFAULT_RECIPE = MedusaRecipe()
# small enough to train twice inside a test
TINY_RECIPE = MedusaRecipe(
    num_heads=2,
    prompts=8,
    prompt_len=16,
    gen_len=16,
    gen_batch=8,
    steps=6,
    batch=32,
    warmup=2,
    files_every=60,
    eval_prompts=4,
    eval_prompt_len=16,
    eval_gen_len=12,
)


def loss_weights(num_heads: int, decay: float = 0.8) -> torch.Tensor:
    """lambda_k = decay^k for heads k = 1..K."""
    return torch.tensor([decay**k for k in range(1, num_heads + 1)], dtype=torch.float32)


def medusa_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """logits [K, N, V], labels [K, N] (-100 where a head has no label) ->
    (sum_k weights[k] * CE_k, [CE_k])."""
    total = logits.new_zeros(())
    per = []
    for k in range(logits.size(0)):
        ce = F.cross_entropy(logits[k].float(), labels[k], ignore_index=-100)
        per.append(float(ce.detach()))
        total = total + weights[k] * ce
    return total, per


def shifted_labels(tokens: torch.Tensor, num_heads: int, first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [P, L] -> (positions [M, 2] as (row, t) for t in first..L-2, labels [K, M]):
    head k (1-based) at t is labelled with tokens[row, t + k + 1], -100 past the end."""
    P, L = tokens.shape
    t = torch.arange(first, L - 1)
    rows = torch.arange(P)[:, None].expand(P, t.numel()).reshape(-1)
    ts = t[None, :].expand(P, t.numel()).reshape(-1)
    labels = torch.full((num_heads, rows.numel()), -100, dtype=torch.long)
    for k in range(1, num_heads + 1):
        ok = ts + k + 1 < L
        labels[k - 1, ok] = tokens[rows[ok], ts[ok] + k + 1]
    return torch.stack([rows, ts], dim=1), labels


def token_stream(tokenizer, texts) -> torch.Tensor:
    """Texts tokenized and joined with the end-of-text id 0, as the zoo's training stream."""
    ids: list[int] = []
    for enc in tokenizer(list(texts), add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(0)
    return torch.tensor(ids, dtype=torch.long)


def corpus_streams(tokenizer, files_every: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(training stream from every files_every-th training file, held-out stream)."""
    c = load_corpus(check=False)
    train_files, held_files = c.split()
    return token_stream(tokenizer, c.texts(train_files[::files_every])), token_stream(tokenizer, c.texts(held_files))


def windows(stream: torch.Tensor, count: int, length: int, gen: torch.Generator | None) -> torch.Tensor:
    """`count` windows of `length` tokens: at seeded random offsets (gen) or evenly spaced."""
    n = stream.numel()
    if n <= length:
        raise ValueError(f"token stream too short ({n}) for windows of {length}")
    if gen is None:
        starts = torch.linspace(0, n - length - 1, count).long()
    else:
        starts = torch.randint(0, n - length, (count,), generator=gen)
    return stream[starts[:, None] + torch.arange(length)[None, :]]


@torch.inference_mode()
def greedy_continuations(hf_model, prompts: torch.Tensor, gen_len: int, batch: int, progress=None) -> torch.Tensor:
    """[P, prompt_len] -> [P, prompt_len + gen_len]: the target's greedy continuations
    (Hugging Face generate with its KV cache, EOS ignored; all prompts have the same length)."""
    out = []
    for i in range(0, prompts.size(0), batch):
        x = prompts[i : i + batch]
        g = hf_model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=gen_len,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        out.append(g)
        if progress:
            progress(x.size(0))
    return torch.cat(out)


@torch.inference_mode()
def last_hidden(hf_model, tokens: torch.Tensor, batch: int = 32) -> torch.Tensor:
    """[P, L] -> [P, L, h]: the backbone's last hidden states after the final norm (what the
    heads read), fp32."""
    base = hf_model.get_decoder() if hasattr(hf_model, "get_decoder") else hf_model.model
    return torch.cat(
        [base(input_ids=tokens[i : i + batch]).last_hidden_state.float() for i in range(0, tokens.size(0), batch)]
    )


def train_heads(
    hf_model, train_stream: torch.Tensor, recipe: MedusaRecipe = DEFAULT_RECIPE, log=None, progress=None
) -> tuple[MedusaHeads, dict]:
    """Self-distillation data from the frozen target, then Medusa-1 training of the heads.
    progress(stage, advance, total) is called as work is done (for a progress bar)."""
    r = recipe
    threads = torch.get_num_threads()
    torch.set_num_threads(r.threads)
    try:
        t0 = time.perf_counter()
        gen = torch.Generator().manual_seed(r.seed)
        prompts = windows(train_stream, r.prompts, r.prompt_len, gen)
        step_cb = (lambda n: progress("generate", n, r.prompts)) if progress else None
        seqs = greedy_continuations(hf_model, prompts, r.gen_len, r.gen_batch, step_cb)
        feats = last_hidden(hf_model, seqs)
        pos, labels = shifted_labels(seqs, r.num_heads, r.prompt_len - 1)
        x_all = feats[pos[:, 0], pos[:, 1]]  # [M, h]
        t_data = time.perf_counter() - t0

        torch.manual_seed(r.seed)
        heads = MedusaHeads.from_lm_head(r.num_heads, lm_head_weight(hf_model), r.shared_lm_head)
        heads.train()
        trainable = [p for p in heads.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(trainable, lr=r.lr, betas=(0.9, 0.95), weight_decay=r.weight_decay)
        w = loss_weights(r.num_heads, r.decay)
        M = x_all.size(0)
        t1 = time.perf_counter()
        loss_v, per = float("nan"), []
        for step in range(r.steps):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, r)
            idx = torch.randint(0, M, (min(r.batch, M),), generator=gen)
            loss, per = medusa_loss(heads(x_all[idx]), labels[:, idx], w)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            opt.step()
            loss_v = float(loss.detach())
            if progress:
                progress("train", 1, r.steps)
            if log and (step % 100 == 0 or step == r.steps - 1):
                log(
                    f"  medusa step {step + 1}/{r.steps} loss {loss_v:.3f} per head "
                    + " ".join(f"{c:.2f}" for c in per)
                )
        heads.eval()
        return heads, {
            "data_seconds": t_data,
            "train_seconds": time.perf_counter() - t1,
            "final_loss": loss_v,
            "final_head_ce": per,
            "train_positions": int(M),
            "loss_weights": w.tolist(),
        }
    finally:
        torch.set_num_threads(threads)
