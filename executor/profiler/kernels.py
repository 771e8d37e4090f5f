"""Micro-benchmarks on the torch device: GEMMs, attention, norms and activations, memory
streams and host<->device copies. Every result is a plain dict (one "record") with the
operator class, the FLOPs and bytes the roofline model counts for that operator
(simulator/costmodel/operators.py conventions), and the timing statistics, so the fit can
compare achieved rates with the roofline's counts directly.

Plans (which shapes) are pure functions, separate from the timing, so they can be checked
without running anything."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..device import attention_backends, sdpa
from .device import Repeats, Timer, copy_variants, host_buffer, measure

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


@dataclass
class Bench:
    """What every benchmark needs: where, how to time, how hard, and whom to tell."""

    device: object  # torch.device
    timer: Timer
    dtype: str = "fp32"
    rep: Repeats = Repeats()
    progress: Callable[[str], None] = lambda label: None  # called once per measured point
    # memory-bound operands smaller than this are rotated through copies so each call
    # reads from DRAM (HBM), not from a cache warmed by the previous repeat
    cold_bytes: int = 64 << 20
    records: list = field(default_factory=list)
    # a stage's wall-clock budget: past `deadline`, a sweep measures no more points once it
    # has `min_points` (quick profiles on a busy machine still finish in time)
    deadline: float | None = None
    min_points: int = 0
    skipped: int = 0

    def over_budget(self, done: int) -> bool:
        if self.deadline is None or done < self.min_points or time.perf_counter() < self.deadline:
            return False
        self.skipped += 1
        return True

    @property
    def esize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def run(self, fn, label: str, **record) -> dict:
        st = measure(fn, self.timer, self.rep)
        rec = {**record, "dtype": record.get("dtype", self.dtype), **st.as_dict()}
        flops, nbytes = rec.get("flops", 0.0), rec.get("bytes", 0.0)
        rec["achieved_flops"] = flops / st.median_s if flops else 0.0
        rec["achieved_bytes"] = nbytes / st.median_s if nbytes else 0.0
        self.records.append(rec)
        self.progress(label)
        return rec


def _rotation(nbytes: int, cold_bytes: int, cap: int = 16) -> int:
    """How many copies of an operand make a footprint past the caches."""
    if nbytes <= 0:
        return 1
    return int(max(1, min(cap, -(-cold_bytes // nbytes))))


# ---- GEMM ------------------------------------------------------------------------------------
def model_gemm_shapes(models: Iterable) -> list[tuple[int, int, str]]:
    """(in, out, label) of the projections and MLP matrices of catalog models, deduplicated."""
    seen: dict[tuple[int, int], str] = {}
    for m in models:
        h, i = m.hidden_size, m.intermediate_size
        shapes = [(h, m.q_dim, "q_proj"), (h, m.kv_dim, "kv_proj"), (m.q_dim, h, "o_proj")]
        if m.mlp == "gated":
            shapes += [(h, i, "up_proj"), (i, h, "down_proj")]
        else:
            shapes += [(h, i, "fc1"), (i, h, "fc2")]
        for k, n, what in shapes:
            seen.setdefault((k, n), f"{m.name}.{what}")
    return [(k, n, label) for (k, n), label in seen.items()]


def gemm_plan(
    shapes: list[tuple[int, int, str]], tokens: list[int], max_flops: float
) -> list[tuple[int, int, int, str]]:
    """(m tokens, k, n, label): every shape at every token count within the FLOP cap."""
    return [(m, k, n, label) for k, n, label in shapes for m in tokens if 2.0 * m * k * n <= max_flops]


def gemm_sweep(b: Bench, plan: list[tuple[int, int, int, str]], dtype: str | None = None) -> list[dict]:
    """y = x W^T (torch.nn.functional.linear, what nn.Linear runs): FLOPs 2mkn, bytes the
    weight once plus the input and output activations."""
    import torch
    import torch.nn.functional as F

    dtype = dtype or b.dtype
    td, es = torch_dtype(dtype), DTYPE_BYTES[dtype]
    out = []
    weights: dict[tuple[int, int], list] = {}
    for m, k, n, label in plan:
        if b.over_budget(len(out)):
            continue
        if (k, n) not in weights:
            weights.clear()  # one shape's weights alive at a time
            copies = _rotation(k * n * es, b.cold_bytes)
            weights[(k, n)] = [
                torch.empty(n, k, dtype=td, device=b.device).uniform_(-0.05, 0.05) for _ in range(copies)
            ]
        ws = weights[(k, n)]
        x = torch.empty(m, k, dtype=td, device=b.device).uniform_(-1, 1)
        state = {"i": 0}

        def fn(x=x, ws=ws, state=state):
            state["i"] = (state["i"] + 1) % len(ws)
            return F.linear(x, ws[state["i"]])

        out.append(
            b.run(
                fn,
                f"gemm {m}x{k}x{n} {dtype}",
                kind="gemm",
                op_class="linear",
                op=label,
                m=m,
                k=k,
                n=n,
                dtype=dtype,
                flops=2.0 * m * k * n,
                bytes=float((k * n + m * k + m * n) * es),
            )
        )
    weights.clear()
    return out


# ---- memory streams -----------------------------------------------------------------------
def stream_sweep(b: Bench, sizes: list[int]) -> list[dict]:
    """Large copies (read + write) and adds (two reads + a write): the achieved memory roof.
    Sizes should leave the last-level cache (64 MiB and up on a CPU) or they measure it."""
    import torch

    out = []
    td, es = torch_dtype(b.dtype), b.esize
    for nbytes in sizes:
        if b.over_budget(len(out)):
            continue
        n = max(1, nbytes // es)
        x = torch.empty(n, dtype=td, device=b.device).uniform_(-1, 1)
        y = torch.empty_like(x).uniform_(-1, 1)
        z = torch.empty_like(x)
        out.append(
            b.run(
                lambda: z.copy_(x),
                f"stream copy {nbytes >> 20} MiB",
                kind="stream",
                op_class="memory",
                op="copy",
                size_bytes=n * es,
                flops=0.0,
                bytes=2.0 * n * es,
            )
        )
        out.append(
            b.run(
                lambda: torch.add(x, y, out=z),
                f"stream add {nbytes >> 20} MiB",
                kind="stream",
                op_class="memory",
                op="add",
                size_bytes=n * es,
                flops=float(n),
                bytes=3.0 * n * es,
            )
        )
        x = y = z = None  # free before the next size
    return out


# ---- attention ------------------------------------------------------------------------------
def attention_counts(
    batch: int, q_tokens: int, context: int, heads: int, head_dim: int, es: int
) -> tuple[float, float]:
    """FLOPs and bytes of fused attention (qk + softmax + pv) as operators.py counts them:
    every sequence has q_tokens new queries over context + q_tokens keys."""
    keys = context + q_tokens
    T, P, K = batch * q_tokens, batch * q_tokens * keys, batch * keys
    q_dim = kv_dim = heads * head_dim
    flops = 2.0 * heads * head_dim * P * 2 + 5.0 * heads * P
    nbytes = 2.0 * (q_dim * es * T + kv_dim * es * K)
    return flops, nbytes


def attention_plan(quick: bool) -> dict:
    if quick:
        return {
            "heads": [(16, 64)],
            "prefill": [(bsz, t) for bsz in (1, 4) for t in (64, 256, 1024)],
            "decode": [(bsz, c) for bsz in (1, 8, 32) for c in (128, 1024, 4096)],
        }
    return {
        "heads": [(16, 64), (32, 128)],
        "prefill": [(bsz, t) for bsz in (1, 2, 4, 8) for t in (32, 128, 256, 512, 1024, 2048)],
        "decode": [(bsz, c) for bsz in (1, 4, 16, 32, 64) for c in (64, 256, 1024, 2048, 4096)],
    }


def attention_sweep(b: Bench, plan: dict, max_flops: float, max_bytes: float) -> list[dict]:
    """scaled_dot_product_attention: prefill (causal, no cache) and decode (one query over
    a cached context), across batch and context length."""
    out = []
    # (phase, batch, new query tokens, cached context) of every point, prefill first
    points = [("prefill", bsz, t, 0) for bsz, t in plan["prefill"]]
    points += [("decode", bsz, 1, c) for bsz, c in plan["decode"]]
    with attention_backends(b.device):  # once: no backend switch between a call's CUDA events
        for heads, d in plan["heads"]:
            for point in points:
                _, bsz, q_tokens, context = point
                counts = attention_counts(bsz, q_tokens, context, heads, d, b.esize)
                if counts[0] > max_flops or counts[1] > max_bytes or b.over_budget(len(out)):
                    continue
                out.append(_time_attention(b, point, (heads, d), counts))
    return out


def _time_attention(b: Bench, point: tuple, shape: tuple[int, int], counts: tuple[float, float]) -> dict:
    """One attention point (phase, batch, q_tokens, context) timed: `q_tokens` queries per
    sequence over `context` cached keys and their own (causal in a prefill); `shape` is
    (heads, head_dim), `counts` (FLOPs, bytes) as attention_counts gives them."""
    import torch

    (phase, bsz, q_tokens, context), (heads, d), (flops, nbytes) = point, shape, counts
    td = torch_dtype(b.dtype)
    q = torch.empty(bsz, heads, q_tokens, d, dtype=td, device=b.device).uniform_(-1, 1)
    k, v = (torch.empty(bsz, heads, context + q_tokens, d, dtype=td, device=b.device).uniform_(-1, 1) for _ in range(2))
    prefill = phase == "prefill"
    return b.run(
        lambda: sdpa(q, k, v, is_causal=prefill),
        f"attn {phase} b{bsz} " + (f"t{q_tokens}" if prefill else f"c{context}"),
        kind="attention",
        op_class="attention",
        phase=phase,
        batch=bsz,
        q_tokens=q_tokens,
        context=context,
        heads=heads,
        head_dim=d,
        flops=flops,
        bytes=nbytes,
    )


# ---- norms and activations ------------------------------------------------------------------
ELEMENTWISE_OPS = ("rmsnorm", "layernorm", "silu_mul", "relu", "gelu")


def elementwise_counts(op: str, tokens: int, width: int, es: int) -> tuple[float, float]:
    """operators.py: a norm is 5 FLOPs per element and reads its weight, the input and
    writes the output; silu(g)*u reads two and writes one; relu/gelu read one, write one."""
    if op in ("rmsnorm", "layernorm"):
        return 5.0 * width * tokens, float(width * es + 2 * width * tokens * es)
    if op == "silu_mul":
        return 5.0 * width * tokens, float(3 * width * tokens * es)
    return 1.0 * width * tokens, float(2 * width * tokens * es)


def elementwise_plan(quick: bool) -> list[tuple[str, int, int]]:
    tokens = (1, 64, 512, 2048) if quick else (1, 16, 64, 256, 512, 1024, 2048, 4096)
    widths = {
        "rmsnorm": (768, 4096),
        "layernorm": (768, 4096),
        "silu_mul": (3072, 11008),
        "relu": (3072, 11008),
        "gelu": (3072, 11008),
    }
    if quick:
        widths = {"rmsnorm": (768, 4096), "layernorm": (2048,), "silu_mul": (3072, 11008), "relu": (8192,), "gelu": ()}
    return [(op, t, w) for op, ws in widths.items() for w in ws for t in tokens]


def elementwise_sweep(b: Bench, plan: list[tuple[str, int, int]]) -> list[dict]:
    import torch
    import torch.nn.functional as F

    td, es = torch_dtype(b.dtype), b.esize
    out = []
    for op, tokens, width in plan:
        if b.over_budget(len(out)):
            continue
        x = torch.empty(tokens, width, dtype=td, device=b.device).uniform_(-1, 1)
        w = torch.ones(width, dtype=td, device=b.device)
        if op == "rmsnorm":
            fn = lambda x=x, w=w, width=width: F.rms_norm(x, (width,), w, 1e-6)
        elif op == "layernorm":
            bias = torch.zeros(width, dtype=td, device=b.device)
            fn = lambda x=x, w=w, bias=bias, width=width: F.layer_norm(x, (width,), w, bias, 1e-5)
        elif op == "silu_mul":
            u = torch.empty_like(x).uniform_(-1, 1)
            fn = lambda x=x, u=u: F.silu(x) * u
        elif op == "relu":
            fn = lambda x=x: F.relu(x)
        else:
            fn = lambda x=x: F.gelu(x)
        flops, nbytes = elementwise_counts(op, tokens, width, es)
        out.append(
            b.run(
                fn,
                f"{op} {tokens}x{width}",
                kind="elementwise",
                op_class="elementwise",
                op=op,
                tokens=tokens,
                width=width,
                flops=flops,
                bytes=nbytes,
            )
        )
    return out


# ---- host <-> device copies -------------------------------------------------------------------
def copy_plan(device_type: str, quick: bool) -> list[tuple[str, str, bool, int]]:
    """(direction, variant, pinned, bytes)."""
    sizes = [1 << s for s in ((16, 18, 20, 22, 24, 26, 28) if quick else range(14, 30))]
    return [
        (direction, label, pinned, n)
        for label, pinned in copy_variants(device_type)
        for n in sizes
        for direction in ("h2d", "d2h")
    ]


def copy_reference_plan(device_type: str) -> list[tuple[str, str, bool, int]]:
    """The copies that stand for the host link's speed: the copy sweep's 64 MiB copies of its
    first buffer kind (pinned on CUDA, plain on the CPU), both directions. The swap check times
    them again and compares with the sweep's (how far the bandwidth moved in between)."""
    label, pinned = copy_variants(device_type)[0]
    return [(direction, label, pinned, 64 << 20) for direction in ("h2d", "d2h")]


def copy_fn(b: Bench, direction: str, pinned: bool, nbytes: int) -> Callable[[], None]:
    """One copy of `nbytes` in `direction` (h2d or d2h). On CUDA the host side is a pinned or
    a pageable buffer; on the CPU both sides are host buffers (a plain memcpy), rotated through
    enough copies to leave the caches, so the numbers are DRAM-to-DRAM."""
    import torch

    dev_type = b.device.type
    copies = 1 if dev_type == "cuda" else _rotation(2 * nbytes, 4 * b.cold_bytes, cap=512)
    hosts = [host_buffer(nbytes, pinned=pinned, device_type=dev_type) for _ in range(copies)]
    for h in hosts:
        h.fill_(1)
    devs = [torch.ones(nbytes, dtype=torch.uint8, device=b.device) for _ in range(copies)]
    state = {"i": 0}

    def fn():
        i = state["i"] = (state["i"] + 1) % len(hosts)
        if direction == "h2d":
            devs[i].copy_(hosts[i], non_blocking=pinned)
        else:
            hosts[i].copy_(devs[i], non_blocking=pinned)

    return fn


def copy_sweep(b: Bench, plan: list[tuple[str, str, bool, int]]) -> list[dict]:
    """Host->device and device->host copies (`copy_fn`), one record per plan entry."""
    out = []
    for direction, label, pinned, nbytes in plan:
        if b.over_budget(len(out)):
            continue
        fn = copy_fn(b, direction, pinned, nbytes)
        out.append(
            b.run(
                fn,
                f"copy {direction} {label} {nbytes >> 10} KiB",
                kind="copy",
                op_class="copy",
                direction=direction,
                variant=label,
                pinned=pinned,
                size_bytes=nbytes,
                flops=0.0,
                bytes=float(nbytes),
                dtype="uint8",
            )
        )
        del fn
    return out
