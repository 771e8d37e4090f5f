"""Medusa-1 heads (Medusa section 2.1.1): K extra decoding heads on the frozen target's last
hidden state (after the final norm). Head k (1-based) reads the hidden state at position t and
predicts the token at t + k + 1 (the target's own LM head predicts t + 1):

    logits_k = W2_k (h + SiLU(W1_k h + b1_k))

W1 starts at zero, so every head starts as the target's LM head on h (W2_k is initialised
from a copy of it, as in the reference implementation): training only has to learn the shift.
Variant (`shared_lm_head`): the heads keep only their residual blocks and all use the target's
own LM head, frozen (one [V, h] copy instead of K). On Vicuna-7B five heads with their own LM
heads are ~10% of the model's weights; on the 1.6M-parameter zoo target four of them are 60%,
and every step reads them all: sharing the LM head brings the heads back to ~9%.

The K heads are stored stacked ([K, h, h], [K, h], [K, V, h]) so that all heads run as one
batched matmul per step, not K small ones.

Saved as `heads.safetensors` + `medusa.json` (format version, the target's weight hash, the
training recipe and what was measured) in a folder of the zoo cache; `load_heads` checks the
format version and, given the target, that its weights are the ones the heads were trained on."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import staged_folder

from ..zoo.build import weights_sha256

FORMAT_VERSION = 1
WEIGHTS_FILE = "heads.safetensors"
META_FILE = "medusa.json"


class MedusaHeads(nn.Module):
    def __init__(self, num_heads: int, hidden_size: int, vocab_size: int, shared_lm_head: bool = False):
        super().__init__()
        if num_heads < 1:
            raise InfersimError(f"Medusa needs at least one head, got {num_heads}")
        self.num_heads, self.hidden_size, self.vocab_size = int(num_heads), int(hidden_size), int(vocab_size)
        self.shared_lm_head = bool(shared_lm_head)
        self.w1 = nn.Parameter(torch.zeros(num_heads, hidden_size, hidden_size))  # [K, out, in]
        self.b1 = nn.Parameter(torch.zeros(num_heads, hidden_size))
        # [K, V, h] (or [1, V, h]: the target's LM head, frozen, when shared)
        self.w2 = nn.Parameter(
            torch.zeros(1 if shared_lm_head else num_heads, vocab_size, hidden_size), requires_grad=not shared_lm_head
        )

    @classmethod
    def from_lm_head(cls, num_heads: int, lm_head_weight: torch.Tensor, shared: bool = False) -> "MedusaHeads":
        """Fresh heads: residual block at zero (identity), each LM head a copy of the target's
        (or one frozen copy for all of them)."""
        vocab, hidden = lm_head_weight.shape
        heads = cls(num_heads, hidden, vocab, shared)
        with torch.no_grad():
            heads.w2.copy_(lm_head_weight.detach().float().to(heads.w2.device)[None].expand_as(heads.w2))
        return heads

    def features(self, h: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """[N, h] -> [K, N, h]: each head's residual block (the first `heads` heads only)."""
        k = self.num_heads if heads is None else heads
        x = h.to(self.w1.dtype)[None].expand(k, -1, -1)
        z = torch.baddbmm(self.b1[:k, None, :], x, self.w1[:k].transpose(1, 2))  # one batched matmul for all heads
        return x + F.silu(z)

    def forward(self, h: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """[N, h] -> logits [K, N, V]."""
        k = self.num_heads if heads is None else heads
        f = self.features(h, k)
        if self.shared_lm_head:  # one projection for all heads' rows: the LM head is read once
            return F.linear(f.reshape(-1, self.hidden_size), self.w2[0]).view(k, -1, self.vocab_size)
        return torch.bmm(f, self.w2[:k].transpose(1, 2))

    @property
    def parameters_per_head(self) -> int:
        """Weights one head adds to the model (a shared LM head is the target's own)."""
        h = self.hidden_size
        return h * h + h + (0 if self.shared_lm_head else h * self.vocab_size)

    def _w2_t(self) -> torch.Tensor:
        """w2 as a contiguous [K, h, V] copy for decoding (a few rows at a time: reading the
        weights in their natural order measured ~20% faster than the transposed view). The copy
        is rebuilt whenever w2 has changed (its version counter moved)."""
        key = (self.w2._version, self.w2.data_ptr(), self.w2.device)
        if getattr(self, "_w2t_key", None) != key:
            self._w2t = self.w2.detach().transpose(1, 2).contiguous()
            self._w2t_key = key
        return self._w2t

    @torch.inference_mode()
    def propose(self, h: torch.Tensor, top_k: int, heads: int | None = None) -> torch.Tensor:
        """[N, h] -> [N, K, top_k] token ids, each head's best guesses, best first. A tree
        shallower than K needs only its first `heads` heads: the others are not run."""
        k = self.num_heads if heads is None else heads
        if self.shared_lm_head:
            logits = self(h, k)
        else:
            logits = torch.bmm(self.features(h, k), self._w2_t()[:k])
        return logits.topk(top_k, dim=-1).indices.transpose(0, 1).contiguous()

    def weights_sha256(self) -> str:
        """The heads' weights hashed as the zoo hashes a model's (zoo.build.weights_sha256)."""
        return weights_sha256(self)


def lm_head_weight(hf_model) -> torch.Tensor:
    return hf_model.get_output_embeddings().weight


def save_heads(heads: MedusaHeads, folder: Path, meta: dict) -> Path:
    """Write weights and metadata into `folder` atomically (a hidden sibling folder renamed
    into place), so a reader never sees half a set of heads."""
    from safetensors.torch import save_file

    folder = Path(folder)
    with staged_folder(folder) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in heads.state_dict().items()}, str(tmp / WEIGHTS_FILE))
        full = {
            "format_version": FORMAT_VERSION,
            "num_heads": heads.num_heads,
            "hidden_size": heads.hidden_size,
            "vocab_size": heads.vocab_size,
            "shared_lm_head": heads.shared_lm_head,
            "parameters_per_head": heads.parameters_per_head,
            "heads_sha256": heads.weights_sha256(),
            **meta,
        }
        (tmp / META_FILE).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
    return folder


def read_meta(folder: Path) -> dict:
    f = Path(folder) / META_FILE
    if not f.exists():
        raise InfersimError(f"{folder}: no {META_FILE}: not a Medusa heads folder")
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as exc:
        raise InfersimError(f"{f}: not valid JSON ({exc.msg}, line {exc.lineno})") from exc


def load_heads(folder: Path, target_sha256: str | None = None, device="cpu") -> tuple[MedusaHeads, dict]:
    """Heads and their metadata from a folder written by `save_heads`. With target_sha256,
    heads trained on other target weights are refused (they would propose garbage)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    meta = read_meta(folder)
    if meta.get("format_version") != FORMAT_VERSION:
        raise InfersimError(
            f"{folder / META_FILE}: format_version {meta.get('format_version')!r}, "
            f"this infersim reads {FORMAT_VERSION}: retrain with `sim medusa-train`"
        )
    if target_sha256 is not None and meta.get("target_sha256") != target_sha256:
        raise InfersimError(
            f"{folder / META_FILE}: heads were trained on target weights "
            f"{str(meta.get('target_sha256'))[:12]}, not {target_sha256[:12]}: retrain them"
        )
    heads = MedusaHeads(meta["num_heads"], meta["hidden_size"], meta["vocab_size"], bool(meta.get("shared_lm_head")))
    state = load_file(str(folder / WEIGHTS_FILE))
    try:
        heads.load_state_dict(state)
    except RuntimeError as exc:
        raise InfersimError(f"{folder / WEIGHTS_FILE}: weights do not match {META_FILE} ({exc})") from exc
    return heads.to(device).eval(), meta
