"""A cost model fitted to the executor on this machine (`sim validate`'s default).

The fitting, from held-out executor runs, is analysis/validate/calibrate.py; this is what
prices a batch from the fitted coefficients, and reads and writes them
(calibration_file.py's `infersim-executor-fit` format)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InfersimError
from .base import CostModel, Direction
from .batch import BatchShape
from .calibration_file import FIT_FORMAT, FIT_VERSION, FIT_VERSIONS_READ, read_fit_json, write_fit_json
from .executor_features import FEATURE_NAMES, batch_features, feature_matrix


class FittedCostModel(CostModel):
    """iteration_time_s = coefficients . features(batch); transfers = latency + bytes / bandwidth."""

    name = "executor_fit"

    def __init__(self, coefficients, block_size: int, transfer: dict, meta: dict | None = None):
        self.coef = np.asarray(coefficients, dtype=np.float64)
        if self.coef.shape != (len(FEATURE_NAMES),):
            raise InfersimError(f"executor fit: expected {len(FEATURE_NAMES)} coefficients, got {self.coef.shape}")
        self.block_size = int(block_size)
        # per direction: {"latency_s", "s_per_byte", "s_per_copy", "copies_per_byte"}: a swap costs
        # latency + bytes x s_per_byte + copy calls x s_per_copy. The executor's CPU path makes one
        # call per run of blocks consecutive on both sides, so its calls depend on how fragmented
        # the free lists are, which a count-only block manager does not know: a simulation prices
        # a swap with the calibration's mean calls per byte, the swap-cost check with the calls
        # each swap made (`copy_time_s`).
        self.transfer = {
            d: {
                "latency_s": float(transfer[d]["latency_s"]),
                "s_per_byte": float(transfer[d]["s_per_byte"]),
                "s_per_copy": float(transfer[d].get("s_per_copy", 0.0)),
                "copies_per_byte": float(transfer[d].get("copies_per_byte", 0.0)),
            }
            for d in ("h2d", "d2h")
        }
        self.meta = dict(meta or {})

    def scaled(self, factor: float, why: str = "", transfer_factor: float | None = None) -> "FittedCostModel":
        """Every time multiplied by factor (the machine's speed changed by 1/factor); the copies
        by transfer_factor when given (memory copies drift apart from compute)."""
        f = float(factor)
        g = f if transfer_factor is None else float(transfer_factor)
        tr = {
            d: {
                **v,
                "latency_s": v["latency_s"] * g,
                "s_per_byte": v["s_per_byte"] * g,
                "s_per_copy": v["s_per_copy"] * g,
            }
            for d, v in self.transfer.items()
        }
        meta = dict(self.meta)
        meta["scaled_by"] = f
        if transfer_factor is not None:
            meta["transfer_scaled_by"] = g
        if why:
            meta["scaled_because"] = why
        return FittedCostModel(self.coef * f, self.block_size, tr, meta)

    def iteration_time_s(self, batch: BatchShape) -> float:
        return float(max(batch_features(batch, self.block_size) @ self.coef, 1e-9))

    def predict_many(self, shapes: list[BatchShape]) -> np.ndarray:
        return np.maximum(feature_matrix(shapes, self.block_size) @ self.coef, 1e-9)

    def transfer_time_s(self, nbytes: float, direction: Direction) -> float:
        t = self.transfer[direction]
        return self.copy_time_s(nbytes, direction, float(nbytes) * t["copies_per_byte"])

    def copy_time_s(self, nbytes: float, direction: Direction, copies: float) -> float:
        """A swap of nbytes made as `copies` copy calls (the executor records them)."""
        if nbytes <= 0:
            return 0.0
        t = self.transfer[direction]
        return t["latency_s"] + float(nbytes) * t["s_per_byte"] + float(copies) * t["s_per_copy"]

    # ---- storage -------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "format": FIT_FORMAT,
            "version": FIT_VERSION,
            "features": list(FEATURE_NAMES),
            "coefficients": [float(x) for x in self.coef],
            "block_size": self.block_size,
            "transfer": self.transfer,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, d: dict, source: str = "fit") -> "FittedCostModel":
        if not isinstance(d, dict) or d.get("format") != FIT_FORMAT:
            raise InfersimError(f"{source}: not an executor fit (format '{FIT_FORMAT}' expected)")
        if d.get("version") not in FIT_VERSIONS_READ or list(d.get("features", [])) != list(FEATURE_NAMES):
            raise InfersimError(
                f"{source}: executor fit version {d.get('version')} / features differ from this infersim's"
            )
        try:
            return cls(d["coefficients"], d["block_size"], d["transfer"], d.get("meta"))
        except (KeyError, TypeError, ValueError) as exc:
            raise InfersimError(f"{source}: malformed executor fit ({exc})") from None

    def save(self, path: Path) -> None:
        write_fit_json(path, self.to_json())

    @classmethod
    def load(cls, path: Path) -> "FittedCostModel":
        return cls.from_json(read_fit_json(path), str(path))
