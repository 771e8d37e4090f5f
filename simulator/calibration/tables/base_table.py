"""A kind of measured table: how to recognise it by its header, read it, and fit what it
measures into a hardware profile. Kinds are registered by name in TABLE_KINDS
(simulator/calibration/tables/__init__.py); `sim calibrate` picks the kind whose `recognises`
accepts a file's header."""

from __future__ import annotations

import csv
import gzip
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Iterator

from ...errors import InfersimError
from ...hardware.profile import HardwareProfile


class TableKind(ABC):
    name: str = "base"
    description: str = ""

    @classmethod
    @abstractmethod
    def recognises(cls, header: list[str]) -> bool:
        """Whether a CSV header is this kind's."""

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        """The columns every table of this kind has (to name the one a header lacks); empty
        when the kind has several layouts."""
        return ()

    @abstractmethod
    def read(self, path: Path, device: str | None) -> list[Any]:
        """The file's rows for `device` (None: the file must hold one device), validated: a
        bad cell raises InfersimError naming file, row and column."""

    @abstractmethod
    def fit(
        self, rows: list[Any], hardware: HardwareProfile, source: str, on_kernel: Callable[[str, int], None]
    ) -> dict[str, Any]:
        """Profile fields fitted from the rows (e.g. {"calibration": Calibration});
        `on_kernel(kind, rows)` is told as each kernel kind's fit starts."""


def read_header(path: Path) -> list[str]:
    with _open(path) as fh:
        header = next(csv.reader(fh), None)
    if not header:
        raise InfersimError(f"{path}: empty table (no header row)")
    return [h.strip() for h in header]


def iter_records(path: Path, required: list[str]) -> Iterator[tuple[str, dict[str, str]]]:
    """(where, row) for each data row; `where` is "file, row N" with N the line number."""
    with _open(path) as fh:
        reader = csv.DictReader(fh)
        fields = [f.strip() for f in (reader.fieldnames or [])]
        missing = [c for c in required if c not in fields]
        if missing:
            raise InfersimError(f"{path}, row 1: missing column '{missing[0]}'")
        reader.fieldnames = fields
        for line, row in enumerate(reader, start=2):
            if None in row:  # more cells than header columns
                raise InfersimError(
                    f"{path}, row {line}: {len(fields) + len(row[None])} cells, header has {len(fields)}"
                )
            yield f"{path}, row {line}", row


def pick_device(path: Path, devices: set[str], device: str | None) -> str:
    if device is not None:
        if device not in devices:
            raise InfersimError(
                f"{path}: no rows for device '{device}' (column 'device' has: {', '.join(sorted(devices))})"
            )
        return device
    if len(devices) != 1:
        raise InfersimError(
            f"{path}: rows for several devices ({', '.join(sorted(devices))}); choose one with --device"
        )
    return next(iter(devices))


def _open(path: Path):
    """A table file, gzipped ones (`.gz`) read as text too."""
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "rt", newline="")
        return open(path, newline="")
    except OSError as exc:
        raise InfersimError(f"{path}: cannot read ({exc.__class__.__name__})") from None
