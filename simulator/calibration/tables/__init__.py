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
    known = "; ".join(f"{n}: {TABLE_KINDS.get(n).description}" for n in TABLE_KINDS.in_order())
    raise InfersimError(f"{path}, row 1: header matches no known table kind ({known})")


__all__ = ["TABLE_KINDS", "TableKind", "recognise"]
