"""One operator's FLOPs and bytes as affine functions of the batch totals, and the constructors
of the primitive operators (GEMM, norm, activation, rotary, residual add, token and position embedding) that every
layer kind (dense attention, latent attention, dense and expert MLPs) is built from."""

from __future__ import annotations

from dataclasses import dataclass

# coefficient order: const, T, P, K, L
N_COEF = 5


@dataclass(frozen=True)
class Operator:
    name: str
    op_class: str  # linear | attention | elementwise | communication
    scope: str  # "layer" (repeated per layer) or "model" (once per iteration)
    flops: tuple[float, float, float, float, float]
    bytes: tuple[float, float, float, float, float]
    kernel: str = ""  # calibrated kernel kind: gemm, norm, act, rope, add, emb ("" = class roofline)
    out_width: float = 0.0  # a GEMM's output columns per GPU (N), which set its tile count (0: not a GEMM)

    def flops_at(self, T, P, K, L):
        c = self.flops
        return c[0] + c[1] * T + c[2] * P + c[3] * K + c[4] * L

    def bytes_at(self, T, P, K, L):
        c = self.bytes
        return c[0] + c[1] * T + c[2] * P + c[3] * K + c[4] * L


def linear_operator(
    name: str, d_in: int, d_out: int, w_bytes: float, a_bytes: float, tp: int, per: str = "T", split_out: bool = True
) -> Operator:
    """x (T x d_in) @ W (d_in x d_out): reads W once, reads x, writes y. Under tensor
    parallelism each GPU holds 1/tp of W (column- or row-split) and does 1/tp of the FLOPs."""
    idx = 1 if per == "T" else 4
    flops = [0.0] * N_COEF
    flops[idx] = 2.0 * d_in * d_out / tp
    by = [0.0] * N_COEF
    by[0] = d_in * d_out * w_bytes / tp
    d_in_local = d_in if split_out else d_in / tp
    d_out_local = d_out / tp if split_out else d_out
    by[idx] = (d_in_local + d_out_local) * a_bytes
    return Operator(name, "linear", "layer" if per == "T" else "model", tuple(flops), tuple(by), "gemm", d_out_local)


def norm_operator(name: str, h: int, wb: float, ab: float, scope: str = "layer") -> Operator:
    """RMSNorm/LayerNorm: reads the weight once, reads and writes each token's h values."""
    return Operator(name, "elementwise", scope, (0, 5.0 * h, 0, 0, 0), (h * wb, 2.0 * h * ab, 0, 0, 0), "norm")


def act_operator(width_local: float, gated: bool, ab: float) -> Operator:
    """silu(gate) * up reads two T x width tensors and writes one; a plain GELU reads one.
    The fused SiLU-and-mul kernel gives each token's row to its own thread block (kind `act`);
    a plain activation runs as the framework's pointwise kernel over all elements, the kernel
    the residual add runs, so it is priced by that kind (`add`) with its own bytes."""
    if gated:
        return Operator(
            "act", "elementwise", "layer", (0, 5.0 * width_local, 0, 0, 0), (0, 3.0 * width_local * ab, 0, 0, 0), "act"
        )
    return Operator(
        "act", "elementwise", "layer", (0, 1.0 * width_local, 0, 0, 0), (0, 2.0 * width_local * ab, 0, 0, 0), "add"
    )


def rotary_operator(q_local: float, kv_local: float, ab: float, fraction: float = 1.0) -> Operator:
    """Rotary embedding of the new queries and keys, in place: each rotated value read and written
    once. With partial rotary (`fraction` of each head, phi's 0.4) the kernel touches only the
    rotated dims, as vLLM's rotary kernel does with rot_dim < head_size."""
    width = (q_local + kv_local) * fraction
    return Operator("rotary", "elementwise", "layer", (0, 3.0 * width, 0, 0, 0), (0, 2.0 * width * ab, 0, 0, 0), "rope")


def residual_add_operator(name: str, h: int, ab: float) -> Operator:
    """x + residual: reads two T x h tensors, writes one."""
    return Operator(name, "elementwise", "layer", (0, 1.0 * h, 0, 0, 0), (0, 3.0 * h * ab, 0, 0, 0), "add")


def embedding_operator(h: int, wb: float, ab: float) -> Operator:
    """A gather: one embedding row read and written per token."""
    return Operator("embedding", "elementwise", "model", (0, 0, 0, 0, 0), (0, h * (wb + ab), 0, 0, 0), "emb")


def position_embedding_operator(h: int, wb: float, ab: float) -> Operator:
    """A learned position embedding (OPT, GPT-2), once per forward: each token's row of the
    position table gathered and added into its token embedding, which is read and written.
    Priced by the token embedding's kind: the gather is the same index_select, whose per-token
    steps at small batches outweigh the add's few bytes."""
    return Operator(
        "position_embedding", "elementwise", "model", (0, 1.0 * h, 0, 0, 0), (0, h * (wb + 2.0 * ab), 0, 0, 0), "emb"
    )
