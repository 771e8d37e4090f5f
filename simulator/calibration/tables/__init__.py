"""Measured table kinds by name. A kind recognises its files by their header, reads them into
rows and fits them into profile fields; `sim calibrate` takes the first kind (in registration
order) that recognises a file. A new kind is one class and one `register` line."""

from __future__ import annotations

from pathlib import Path

from ...errors import InfersimError
from ...registry import Registry
from .base_table import TableKind, read_header
from .collectives import CollectivesTable
from .generic import GenericTable
from .per_layer import LinearOpsTable, VidurMlpTable

TABLE_KINDS: Registry = Registry("table kind")
TABLE_KINDS.register("linear_ops")(LinearOpsTable)
TABLE_KINDS.register("vidur_mlp")(VidurMlpTable)
TABLE_KINDS.register("collectives")(CollectivesTable)
TABLE_KINDS.register("generic")(GenericTable)


def recognise(path: Path) -> TableKind:
    header = read_header(path)
    for name in TABLE_KINDS.in_order():
        kind = TABLE_KINDS.get(name)
        if kind.recognises(header):
            return kind()
    nearest = _nearest_kind(header)
    if nearest is not None:
        kind, missing = nearest
        raise InfersimError(
            f"{path}, row 1, column '{missing}': missing (the header is otherwise a {kind.name} table: "
            f"{kind.description})"
        )
    known = "; ".join(f"{n}: {TABLE_KINDS.get(n).description}" for n in TABLE_KINDS.in_order())
    raise InfersimError(f"{path}, row 1: header matches no known table kind ({known})")


def _nearest_kind(header: list[str]) -> tuple[type[TableKind], str] | None:
    """The kind whose columns the header lacks fewest of (but has at least one of), and the
    first column it lacks; None when the header shares no kind's columns."""
    best = None
    for name in TABLE_KINDS.in_order():
        kind = TABLE_KINDS.get(name)
        missing = [c for c in kind.columns() if c not in header]
        if 0 < len(missing) < len(kind.columns()) and (best is None or len(missing) < len(best[1])):
            best = (kind, missing)
    return None if best is None else (best[0], best[1][0])


__all__ = ["TABLE_KINDS", "TableKind", "recognise"]
