"""Training, distillation and evaluation of the zoo's models (torch + transformers).

Reproducible by construction: torch.manual_seed before the weights are made, a seeded
torch.Generator for the data windows, a fixed number of threads and a fixed step count.
bf16 autocast halves the step time on a CPU with bf16 instructions (elsewhere the zoo trains in
fp32: ZooSpec.for_host); evaluation runs in fp32."""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from .spec import ModelRecipe, ZooSpec

SPECIAL = "<|endoftext|>"  # token id 0: file separator, BOS/EOS/PAD


def make_config(recipe: ModelRecipe, vocab_size: int):
    if recipe.arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=recipe.hidden,
            intermediate_size=recipe.intermediate,
            num_hidden_layers=recipe.layers,
            num_attention_heads=recipe.heads,
            num_key_value_heads=recipe.kv_heads or recipe.heads,
            max_position_embeddings=recipe.max_positions,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            tie_word_embeddings=False,
            bos_token_id=0,
            eos_token_id=0,
            attn_implementation="sdpa",
        )
    if recipe.arch == "opt":
        from transformers import OPTConfig

        return OPTConfig(
            vocab_size=vocab_size,
            hidden_size=recipe.hidden,
            ffn_dim=recipe.intermediate,
            num_hidden_layers=recipe.layers,
            num_attention_heads=recipe.heads,
            max_position_embeddings=recipe.max_positions,
            word_embed_proj_dim=recipe.hidden,
            do_layer_norm_before=True,
            dropout=0.0,
            attention_dropout=0.0,
            activation_function="relu",
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
            attn_implementation="sdpa",
        )
    raise ValueError(f"unknown architecture {recipe.arch!r}")


def make_model(recipe: ModelRecipe, vocab_size: int):
    from transformers import LlamaForCausalLM, OPTForCausalLM

    torch.manual_seed(recipe.seed)
    cfg = make_config(recipe, vocab_size)
    cls = LlamaForCausalLM if recipe.arch == "llama" else OPTForCausalLM
    return cls(cfg)


def lr_at(step: int, recipe) -> float:
    """Linear warmup over `recipe.warmup` steps, then cosine decay to `lr * min_lr_ratio` at
    `recipe.steps` (a zoo model's or Medusa heads' recipe)."""
    if step < recipe.warmup:
        return recipe.lr * (step + 1) / recipe.warmup
    frac = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
    lo = recipe.lr * recipe.min_lr_ratio
    return lo + 0.5 * (recipe.lr - lo) * (1 + math.cos(math.pi * min(1.0, frac)))


def _logits(model, x: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, use_cache=False).logits


def train(recipe: ModelRecipe, spec: ZooSpec, stream: torch.Tensor, teacher=None, log=print):
    """Train a model on windows of a token stream (1-D int64). With a teacher, the loss is
    KL(teacher || model) over the next-token distribution (distillation), else cross-entropy."""
    model = make_model(recipe, spec.vocab_size)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=recipe.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    gen = torch.Generator().manual_seed(recipe.seed)
    T, B = recipe.seq_len, recipe.batch
    n = stream.numel()
    if n <= T + 1:
        raise ValueError(f"training stream too short ({n} tokens) for windows of {T}")
    offs = torch.arange(T + 1)
    t0 = time.perf_counter()
    loss_v = float("nan")
    for step in range(recipe.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, recipe)
        starts = torch.randint(0, n - T - 1, (B,), generator=gen)
        batch = stream[starts[:, None] + offs[None, :]]
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec.autocast_bf16):
            logits = _logits(model, x)
            if teacher is not None:
                with torch.no_grad():
                    t_logits = _logits(teacher, x)
        logp = F.log_softmax(logits.float(), dim=-1)
        if teacher is not None:
            t_logp = F.log_softmax(t_logits.float(), dim=-1)
            loss = F.kl_div(
                logp.reshape(-1, logp.size(-1)),
                t_logp.reshape(-1, t_logp.size(-1)),
                log_target=True,
                reduction="batchmean",
            )
        else:
            loss = F.nll_loss(logp.reshape(-1, logp.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_v = loss.item()
        if log and (step % 50 == 0 or step == recipe.steps - 1):
            log(f"  {recipe.name} step {step + 1}/{recipe.steps} loss {loss_v:.3f} ({time.perf_counter() - t0:.0f} s)")
    model.eval()
    return model, {
        "train_seconds": time.perf_counter() - t0,
        "final_train_loss": loss_v,
        "train_tokens": recipe.steps * B * T,
    }


def eval_windows(stream: torch.Tensor, count: int, seq_len: int) -> torch.Tensor:
    """`count` evenly spaced windows of seq_len + 1 tokens from the held-out stream."""
    n = stream.numel()
    span = seq_len + 1
    if n < span:
        raise ValueError(f"held-out stream too short ({n} tokens)")
    starts = torch.linspace(0, n - span, count).long()
    return stream[starts[:, None] + torch.arange(span)[None, :]]


@torch.no_grad()
def heldout_loss(model, windows: torch.Tensor, batch: int = 16) -> float:
    total, count = 0.0, 0
    for i in range(0, windows.size(0), batch):
        w = windows[i : i + batch]
        logits = _logits(model, w[:, :-1]).float()
        total += float(F.cross_entropy(logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1), reduction="sum"))
        count += w[:, 1:].numel()
    return total / count


@torch.no_grad()
def token_agreement(draft, target, windows: torch.Tensor, batch: int = 16) -> float:
    """Teacher-forced top-1 agreement of draft and target on held-out text."""
    agree, count = 0, 0
    for i in range(0, windows.size(0), batch):
        x = windows[i : i + batch, :-1]
        a = _logits(draft, x).argmax(-1)
        b = _logits(target, x).argmax(-1)
        agree += int((a == b).sum())
        count += a.numel()
    return agree / count


@torch.no_grad()
def _greedy(model, ctx: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy continuation of one context (1-D) by `steps` tokens, without a KV cache (the
    zoo's contexts are short)."""
    x = ctx[None, :]
    for _ in range(steps):
        nxt = _logits(model, x)[:, -1].argmax(-1, keepdim=True)
        x = torch.cat([x, nxt], dim=1)
    return x[0, ctx.numel() :]


@torch.no_grad()
def greedy_acceptance(draft, target, prompts: torch.Tensor, gen_len: int, s: int) -> dict:
    """Greedy speculative decoding with s draft tokens per round: the target's greedy
    continuation is fixed, so a round starting at position p accepts the longest prefix of the
    draft's s greedy tokens that matches it, then the target's own token follows (p += k + 1).
    acceptance = accepted / proposed draft tokens."""
    target_out = []
    for i in range(prompts.size(0)):
        target_out.append(_greedy(target, prompts[i], gen_len))
    accepted = proposed = rounds = 0
    for i in range(prompts.size(0)):
        ref = target_out[i]
        p = 0
        while p + s <= gen_len:
            ctx = torch.cat([prompts[i], ref[:p]])
            guess = _greedy(draft, ctx, s)
            k = 0
            while k < s and int(guess[k]) == int(ref[p + k]):
                k += 1
            accepted += k
            proposed += s
            rounds += 1
            p += k + 1
    return {
        "acceptance": accepted / max(1, proposed),
        "mean_accepted_per_round": accepted / max(1, rounds),
        "rounds": rounds,
        "s": s,
    }
