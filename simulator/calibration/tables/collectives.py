"""NCCL collective tables (all-reduce, send/recv) as a `sim calibrate` table kind: the layout of
the shipped `benchmarks/data/gpu-kernels/collectives.csv.gz` or vidur's network profiles
(`all_reduce.csv`, `send_recv.csv`). Reading and fitting live with the collectives section
itself (simulator/hardware/collectives_fit.py); this class only adapts them to the registry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ...errors import InfersimError
from ...hardware.collectives_fit import detect, fit_collectives, read_collectives_table
from ...hardware.profile import HardwareProfile
from .base_table import TableKind, read_header


class CollectivesTable(TableKind):
    name = "collectives"
    description = "NCCL all-reduce / send-recv times (setup, collective, num_workers, size, median_ms; or vidur's)"

    @classmethod
    def recognises(cls, header: list[str]) -> bool:
        return detect(header) is not None

    def read(self, path: Path, device: str | None) -> list[Any]:
        """One frame of the rows of one setup. `device` names the setup (`--device a100_dgx`) or
        a device label that begins exactly one setup's name (`--device h100` for `h100_dgx` when
        the table holds no other H100 setup)."""
        # vidur's network tables have no setup column (their folder names it): --device does
        named = device if device is not None and detect(read_header(path)) == "vidur-network" else None
        table = read_collectives_table(path, named)
        setups = sorted(table["setup"].unique())
        matching = (
            setups
            if device is None
            else [s for s in setups if s == device] or [s for s in setups if s.startswith(f"{device}_")]
        )
        if len(matching) != 1:
            found = f"for '{device}' " if device is not None and matching else ""
            raise InfersimError(
                f"{path}: {'no' if not matching else 'several'} setups {found}in column 'setup' "
                f"({', '.join(matching or setups)}); choose one with --device SETUP"
            )
        return [table[table["setup"] == matching[0]]]

    def fit(self, rows: list[Any], hardware: HardwareProfile, source: str, on_kernel) -> dict[str, Any]:
        table = pd.concat(rows, ignore_index=True)
        on_kernel("collectives", len(table))
        setups = sorted(table["setup"].unique())
        if len(setups) != 1:
            raise InfersimError(f"collective tables of several setups ({', '.join(setups)}): calibrate one at a time")
        # a plain dict: the open-ended last size range keeps its `max_bytes: null`
        return {"collectives": fit_collectives(table, setups[0], source=source).model_dump(mode="json")}
