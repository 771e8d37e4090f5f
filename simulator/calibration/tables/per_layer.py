"""Tables of per-layer operator medians of whole transformer blocks (one row per model, TP
degree and token count; one column per operator). Two spellings share the reading:
`linear_ops` (the re-tabulated form: device column, `<op>_median_ms`) and `vidur_mlp`
(microsoft/vidur's profiler output `mlp.csv`: `time_stats.<op>.median`, no device column).

Rows are priced as the profiled block ran them, not as the named model runs: vidur's profiler
rotates whole heads for every model (phi-2's partial rotary included; `operator_for`), and a
block without a post-attention norm is its parallel block (`_parallel_block`)."""

from __future__ import annotations

from pathlib import Path

from ...errors import InfersimError
from ...hardware.profile import HardwareProfile
from ..fit import fit_kernels
from ..rows import MEASURED_OPS, KernelRow, LayerDims, RowOrigin, operator_for, parse_number, row_from_operator
from .base_table import TableKind, iter_records, pick_device, read_header


class PerLayerTable(TableKind):
    """Shared reading; subclasses name the columns."""

    device_column: str | None = None
    model_column: str | None = None
    dims_columns: dict[str, str] = {}  # LayerDims field -> column
    gated_column: str | None = None
    tp_column: str = "tp"
    tokens_column: str = "num_tokens"

    @classmethod
    def time_column(cls, op: str) -> str:
        raise NotImplementedError

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        device = (cls.device_column,) if cls.device_column else ()
        return (*device, cls.tp_column, cls.tokens_column, *cls.dims_columns.values(), cls.time_column("attn_pre_proj"))

    @classmethod
    def recognises(cls, header: list[str]) -> bool:
        return all(c in header for c in cls.columns())

    def read(self, path: Path, device: str | None) -> list[KernelRow]:
        header = read_header(path)
        ops = [op for op in MEASURED_OPS if self.time_column(op) in header]
        required = [
            c for c in (self.device_column, self.tp_column, self.tokens_column, *self.dims_columns.values()) if c
        ]
        records = list(iter_records(path, required))
        if not records:
            raise InfersimError(f"{path}: no data rows")
        if self.device_column:
            device = pick_device(path, {r[self.device_column].strip() for _, r in records}, device)
        elif device is None:
            raise InfersimError(f"{path}: this table has no device column; name the device with --device")
        label_dims: dict[str, tuple[LayerDims, str]] = {}
        rows: list[KernelRow] = []
        for where, rec in records:
            if self.device_column and rec[self.device_column].strip() != device:
                continue
            dims = self._dims(rec, where)
            label = rec[self.model_column].strip() if self.model_column else self._dims_label(dims)
            seen = label_dims.setdefault(label, (dims, where))
            if seen[0] != dims:
                raise InfersimError(
                    f"{where}, column '{self.dims_columns['hidden']}': model '{label}' has other "
                    f"dimensions than at {seen[1].rsplit(', ', 1)[-1]}"
                )
            tp = parse_number(rec[self.tp_column], where, self.tp_column, integer=True)
            bad = dims.check_tp(tp)
            if bad:
                column = self.tp_column if bad == "tp" else self.dims_columns["hidden"]
                raise InfersimError(f"{where}, column '{column}': tp {tp} does not divide the heads and MLP width")
            tokens = parse_number(rec[self.tokens_column], where, self.tokens_column, integer=True)
            parallel_block = self._parallel_block(rec, header)
            for op in ops:
                cell = (rec.get(self.time_column(op)) or "").strip()
                if cell == "" or cell.lower() == "nan":  # an operator the model lacks (phi-2's second norm)
                    continue
                ms = parse_number(cell, where, self.time_column(op))
                rows.append(
                    row_from_operator(
                        operator_for(op, dims, tp),
                        RowOrigin(device, label, f"{where}, column '{self.time_column(op)}'"),
                        tp=tp,
                        tokens=tokens,
                        op=op,
                        time_s=ms * 1e-3,
                        kernels=2 if op == "add" and parallel_block else 1,
                    )
                )
        if not rows:
            raise InfersimError(f"{path}: no operator times for device '{device}'")
        return rows

    def _parallel_block(self, rec: dict[str, str], header: list[str]) -> bool:
        """A block without a post-attention norm (phi-2's) runs attention and MLP side by side and
        its timed `add` is attn + mlp + residual: two residual-add kernels, where a sequential
        block's timed `add` is one (microsoft/vidur's profiled block, vidur/profiling/mlp)."""
        column = self.time_column("post_attention_layernorm")
        if column not in header:  # a table that does not time norms: nothing to tell by
            return False
        cell = (rec.get(column) or "").strip()
        return cell == "" or cell.lower() == "nan"

    def _dims(self, rec: dict[str, str], where: str) -> LayerDims:
        vals = {f: parse_number(rec[c], where, c, integer=True) for f, c in self.dims_columns.items()}
        gated = self._gated(rec, where)
        dims = LayerDims(gated=gated, **vals)
        if dims.heads % dims.kv_heads:
            raise InfersimError(
                f"{where}, column '{self.dims_columns['kv_heads']}': {dims.kv_heads} KV heads do not "
                f"divide {dims.heads} heads"
            )
        if dims.hidden % dims.heads:
            raise InfersimError(
                f"{where}, column '{self.dims_columns['hidden']}': {dims.hidden} is not a multiple "
                f"of {dims.heads} heads"
            )
        return dims

    def _gated(self, rec: dict[str, str], where: str) -> bool:
        raise NotImplementedError

    @staticmethod
    def _dims_label(dims: LayerDims) -> str:
        return f"h{dims.hidden}-i{dims.intermediate}-a{dims.heads}-kv{dims.kv_heads}"

    def fit(self, rows: list[KernelRow], hardware: HardwareProfile, source: str, on_kernel) -> dict:
        return {"calibration": fit_kernels(rows, hardware, source, on_kernel=on_kernel)}


# Models measured without a gated MLP in the public tables (the table has no column for it).
PLAIN_MLP_MODELS = ("microsoft/phi-2", "phi-2", "gpt2", "facebook/opt", "EleutherAI/gpt-neox", "EleutherAI/pythia")


class LinearOpsTable(PerLayerTable):
    name = "linear_ops"
    description = (
        "per-layer operator medians: device, model, n_head, n_kv_head, n_embd, n_expanded_embd, tp, "
        "num_tokens, <op>_median_ms (the re-tabulated microsoft/vidur profiling data)"
    )
    device_column = "device"
    model_column = "model"
    dims_columns = {"heads": "n_head", "kv_heads": "n_kv_head", "hidden": "n_embd", "intermediate": "n_expanded_embd"}

    @classmethod
    def time_column(cls, op: str) -> str:
        return f"{op}_median_ms"

    def _gated(self, rec, where) -> bool:
        if "use_gated_mlp" in rec and rec["use_gated_mlp"] not in (None, ""):
            return _parse_bool(rec["use_gated_mlp"], where, "use_gated_mlp")
        model = rec["model"].strip()
        return not any(model.startswith(m) for m in PLAIN_MLP_MODELS)


class VidurMlpTable(PerLayerTable):
    name = "vidur_mlp"
    description = (
        "microsoft/vidur's mlp.csv: time_stats.<op>.median (ms), n_head, n_kv_head, n_embd, "
        "n_expanded_embd, use_gated_mlp, num_tokens, num_tensor_parallel_workers"
    )
    dims_columns = {"heads": "n_head", "kv_heads": "n_kv_head", "hidden": "n_embd", "intermediate": "n_expanded_embd"}
    tp_column = "num_tensor_parallel_workers"

    @classmethod
    def time_column(cls, op: str) -> str:
        return f"time_stats.{op}.median"

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        return (*super().columns(), "use_gated_mlp")

    def _gated(self, rec, where) -> bool:
        return _parse_bool(rec.get("use_gated_mlp"), where, "use_gated_mlp")


def _parse_bool(value, where: str, column: str) -> bool:
    v = str(value).strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise InfersimError(f"{where}, column '{column}': expected True or False, got {value!r}")
