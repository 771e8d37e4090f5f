"""Checks `sim calibrate` makes on measured rows before it writes anything: the same kernel
measured twice with times that cannot both be right, and rows no time model of the card comes
near (another unit, another device). Each refusal names the file, the row and the column."""

from __future__ import annotations

import numpy as np

from ..errors import InfersimError
from ..hardware.collectives_fit import REPEAT_RATIO
from ..hardware.profile import HardwareProfile
from .fit import predict_rows
from .rows import KernelRow

# The fitted models put every row of those tables within 0.54x-2.2x of its measured time; a row
# 5x off is not one the card ran in the table's unit.
FIT_RATIO = 5.0


def _kernel_key(r: KernelRow) -> tuple:
    """What makes two rows the same measurement: device, model, operator, shape, TP, tokens."""
    return (
        r.device,
        r.label,
        r.op,
        r.tp,
        r.tokens,
        r.kernels,
        r.flops_per_token,
        r.bytes_const,
        r.bytes_per_token,
    )


def check_repeats(rows: list[KernelRow]) -> None:
    """Refuse a kernel measured twice with times more than REPEAT_RATIO apart (repeats that
    agree are kept: the fit sees each)."""
    first: dict[tuple, KernelRow] = {}
    for r in rows:
        seen = first.setdefault(_kernel_key(r), r)
        ratio = max(r.time_s, seen.time_s) / min(r.time_s, seen.time_s)
        if ratio > REPEAT_RATIO:
            raise InfersimError(
                f"{r.where}: {r.time_s * 1e3:.4g} ms for the same {r.op} ({r.tokens} tokens) as "
                f"{seen.where} ({seen.time_s * 1e3:.4g} ms), {ratio:.3g}x apart; keep the right one"
            )


def check_fit(rows: list[KernelRow], profile: HardwareProfile, base: str) -> None:
    """Refuse when a row is more than FIT_RATIO off the time model fitted to the rows (on the
    peaks of the profile named `base`): the worst row is named (mixed units, or rows from
    another device)."""
    if profile.calibration is None or not rows:
        return
    predicted = predict_rows(profile.calibration, rows, profile)
    measured = np.array([r.time_s for r in rows])
    off = np.abs(np.log(measured / predicted))
    off[~np.isfinite(off)] = 0.0  # a kind the calibration has no model for
    worst = int(np.argmax(off))
    if off[worst] > np.log(FIT_RATIO):
        r, ratio = rows[worst], measured[worst] / predicted[worst]
        side = f"{ratio:.3g}x slower" if ratio > 1 else f"{1 / ratio:.3g}x faster"
        raise InfersimError(
            f"{r.where}: {r.time_s * 1e3:.4g} ms is {side} than the {r.kernel} time model fitted to the "
            f"table ({predicted[worst] * 1e3:.4g} ms on {base}'s peaks); rows in another unit "
            f"(us, s) or from another device?"
        )
