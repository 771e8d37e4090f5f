"""The generic kernel table, for measurements of your own. One row per measured kernel:

| column | meaning |
|---|---|
| device | optional: which device the row was measured on (--device picks one) |
| op | `gemm`, or a per-layer operator name: attn_pre_proj, attn_post_proj, mlp_up_proj, mlp_down_proj, input_layernorm, post_attention_layernorm, mlp_act, attn_rope, add, emb |
| tokens | tokens in the batch (the M of a GEMM) |
| median_ms | median time, milliseconds |
| k, n | `gemm` rows: inputs and outputs of the weight (fp16) |
| n_head, n_kv_head, n_embd, n_expanded_embd, tp | named operators: the model's shape and tensor-parallel degree |
| gated | optional, named operators: True for a gated (SwiGLU) MLP (default True) |
| label | optional: the model a row belongs to (default: its shape) |
"""

from __future__ import annotations

from pathlib import Path

from ...errors import InfersimError
from ..rows import (
    MEASURED_OPS,
    KernelRow,
    LayerDims,
    RowOrigin,
    gemm_operator,
    operator_for,
    parse_number,
    row_from_operator,
)
from .base_table import TableKind, iter_records, pick_device
from .per_layer import PerLayerTable, _parse_bool

DIMS = {"heads": "n_head", "kv_heads": "n_kv_head", "hidden": "n_embd", "intermediate": "n_expanded_embd"}


class GenericTable(TableKind):
    name = "generic"
    description = "device, op, tokens, median_ms, and k, n (gemm) or n_head, n_kv_head, n_embd, n_expanded_embd, tp"

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        return ("op", "tokens", "median_ms")

    @classmethod
    def recognises(cls, header: list[str]) -> bool:
        return all(c in header for c in cls.columns())

    def read(self, path: Path, device: str | None) -> list[KernelRow]:
        records = list(iter_records(path, ["op", "tokens", "median_ms"]))
        if not records:
            raise InfersimError(f"{path}: no data rows")
        has_device = "device" in records[0][1]
        if has_device:
            device = pick_device(path, {r["device"].strip() for _, r in records}, device)
        elif device is None:
            raise InfersimError(f"{path}: this table has no device column; name the device with --device")
        rows = []
        for where, rec in records:
            if has_device and rec["device"].strip() != device:
                continue
            rows.append(self._row(rec, where, device))
        return rows

    def _row(self, rec: dict[str, str], where: str, device: str) -> KernelRow:
        op = (rec.get("op") or "").strip()
        tokens = parse_number(rec["tokens"], where, "tokens", integer=True)
        ms = parse_number(rec["median_ms"], where, "median_ms")
        label = (rec.get("label") or "").strip()
        if op == "gemm":
            k, n = (parse_number(_cell(rec, c, where), where, c, integer=True) for c in ("k", "n"))
            operator, tp = gemm_operator(k, n), 1
            label = label or f"k{k}-n{n}"
        elif op in MEASURED_OPS:
            vals = {f: parse_number(_cell(rec, c, where), where, c, integer=True) for f, c in DIMS.items()}
            gated = _parse_bool(rec["gated"], where, "gated") if (rec.get("gated") or "").strip() else True
            dims = LayerDims(gated=gated, **vals)
            tp = parse_number(_cell(rec, "tp", where), where, "tp", integer=True)
            if dims.check_tp(tp):
                raise InfersimError(f"{where}, column 'tp': tp {tp} does not divide the heads and MLP width")
            operator = operator_for(op, dims, tp)
            label = label or f"h{dims.hidden}-i{dims.intermediate}"
        else:
            raise InfersimError(
                f"{where}, column 'op': unknown operator {op!r}; known: gemm, {', '.join(MEASURED_OPS)}"
            )
        return row_from_operator(
            operator,
            RowOrigin(device, label, f"{where}, column 'median_ms'"),
            tp=tp,
            tokens=tokens,
            op=op,
            time_s=ms * 1e-3,
        )

    fit = PerLayerTable.fit  # the same fit: rows of both kinds are pooled


def _cell(rec: dict[str, str], column: str, where: str) -> str:
    if column not in rec:
        raise InfersimError(f"{where}, column '{column}': missing (this operator needs it)")
    return rec[column]
