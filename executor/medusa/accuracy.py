"""The heads' top-i accuracies on held-out text (Medusa section 2.3.3's a_k(i)), in the form
the simulator reads (`simulator/catalog/medusa/*.yaml`, per_rank: one row per head, rank 0
first: the probability that head k's rank-i guess is the right token).

"Right" has two readings, both measured:
- `greedy` (what the simulator's acceptance model needs): the target continues held-out prompts
  greedily; at each position of the continuation, head k's guesses are compared with the
  target's own token k + 1 further on. Under greedy verification a candidate is accepted
  exactly when it equals that token.
- `text`: teacher-forced on held-out text, compared with the text's own tokens (how well the
  heads predict the data; Medusa's Figure 3 reading).
Ranks are distinct tokens, so per-rank accuracies of a head add up to its top-k accuracy."""

from __future__ import annotations

import numpy as np
import torch

from .heads import MedusaHeads
from .train import greedy_continuations, last_hidden, shifted_labels, windows


@torch.inference_mode()
def rank_accuracies(
    heads: MedusaHeads, feats: torch.Tensor, tokens: torch.Tensor, first: int, top_k: int = 10
) -> tuple[np.ndarray, np.ndarray]:
    """feats [P, L, h], tokens [P, L] -> (per-rank accuracy [K, top_k], positions scored per head)."""
    pos, labels = shifted_labels(tokens, heads.num_heads, first)
    x = feats[pos[:, 0], pos[:, 1]]
    hits = np.zeros((heads.num_heads, top_k))
    counts = np.zeros(heads.num_heads)
    for i in range(0, x.size(0), 1024):
        guess = heads(x[i : i + 1024]).topk(top_k, dim=-1).indices  # [K, n, top_k]
        lab = labels[:, i : i + 1024]
        ok = lab >= 0
        match = (guess == lab[..., None]) & ok[..., None]
        hits += match.sum(1).numpy()
        counts += ok.sum(1).numpy()
    return hits / np.maximum(counts, 1)[:, None], counts


def measure(
    hf_model,
    heads: MedusaHeads,
    held_stream: torch.Tensor,
    prompts: int = 32,
    prompt_len: int = 48,
    gen_len: int = 96,
    top_k: int = 10,
    batch: int = 32,
) -> dict:
    """Both readings on evenly spaced held-out windows (deterministic, no sampling)."""
    p = windows(held_stream, prompts, prompt_len, None)
    seqs = greedy_continuations(hf_model, p, gen_len, batch)
    g_acc, g_n = rank_accuracies(heads, last_hidden(hf_model, seqs), seqs, prompt_len - 1, top_k)
    text = windows(held_stream, prompts, prompt_len + gen_len, None)
    t_acc, t_n = rank_accuracies(heads, last_hidden(hf_model, text), text, 0, top_k)
    return {
        "greedy": {
            "per_rank": g_acc.tolist(),
            "positions": g_n.tolist(),
            "prompts": prompts,
            "prompt_len": prompt_len,
            "gen_len": gen_len,
        },
        "text": {
            "per_rank": t_acc.tolist(),
            "positions": t_n.tolist(),
            "windows": prompts,
            "window_len": prompt_len + gen_len,
        },
        "top_k": top_k,
    }


def top_i(per_rank) -> np.ndarray:
    """Cumulative: top-i accuracy, i = 1..top_k."""
    return np.cumsum(np.asarray(per_rank, dtype=np.float64), axis=1)
