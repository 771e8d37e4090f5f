"""The calibration files cost models load, their formats and checks, in one place.

- A measured hardware profile's sidecar (`<name>.calib.json`, format `infersim-calibration`):
  the step-time regressors `RegressionCostModel` uses, named in the profile's `sources` with
  its SHA-256, which is checked before anything is read.
- An executor fit (`infersim-executor-fit`): `FittedCostModel`'s coefficients, written by
  `sim validate`'s calibration.
- A speculative executor fit (`infersim-speculative-fit`): `SpeculativeFit`'s coefficients.

Every reader refuses a file of another format or version with a one-line error naming it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import InfersimError
from ..hardware.profile import HardwareProfile
from ..paths import hwprofiles_dir
from ..yamlio import write_atomic

CALIB_FORMAT = "infersim-calibration"
CALIB_VERSION = 1
SOURCE_KEY = "calibration"
HASH_KEY = "calibration.sha256"
PATH_KEY = "calibration.path"

FIT_FORMAT = "infersim-executor-fit"
FIT_VERSION = 3  # 3 added the per-copy term; a version-2 fit reads as one without it
FIT_VERSIONS_READ = (2, FIT_VERSION)
SPEC_FIT_FORMAT = "infersim-speculative-fit"


# ---- a measured profile's sidecar ----------------------------------------------------------
def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_calibration(path: str | Path, expected_sha256: str | None) -> dict:
    """Read a sidecar only if its SHA-256 is the one the profile recorded."""
    path = Path(path)
    if not path.is_file():
        raise InfersimError(f"{path}: calibration file not found")
    if not expected_sha256:
        raise InfersimError(f"{path}: no recorded sha256 for this calibration file; refusing to load it")
    got = sha256_file(path)
    if got != str(expected_sha256).lower():
        raise InfersimError(
            f"{path}: sha256 {got[:12]}... does not match the {expected_sha256[:12]}... recorded "
            f"in the profile; refusing to load a modified or unknown calibration file"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InfersimError(f"{path}: unreadable calibration file ({exc.__class__.__name__})") from None
    if not isinstance(data, dict) or data.get("format") != CALIB_FORMAT:
        raise InfersimError(f"{path}: not an infersim calibration file")
    if int(data.get("version", -1)) != CALIB_VERSION:
        raise InfersimError(
            f"{path}: calibration format version {data.get('version')} is not supported "
            f"(this infersim reads version {CALIB_VERSION})"
        )
    return data


def calibration_candidates(hardware: HardwareProfile, explicit: str | Path | None = None) -> list[Path]:
    if explicit:
        return [Path(explicit).expanduser()]
    ref = hardware.sources.get(SOURCE_KEY)
    if not ref:
        raise InfersimError(
            f"hardware profile '{hardware.name}' has no measured calibration (sources.{SOURCE_KEY}); "
            f"measure one with `sim profile --out PROFILE.yaml` or use cost_model: roofline"
        )
    rel = Path(ref)
    out = [rel] if rel.is_absolute() else [hwprofiles_dir() / rel, Path.cwd() / rel]
    if hardware.sources.get(PATH_KEY):
        out.append(Path(hardware.sources[PATH_KEY]))
    return out


def calibration_for(hardware: HardwareProfile, explicit: str | Path | None = None) -> dict:
    """The verified sidecar of a measured profile."""
    cands = calibration_candidates(hardware, explicit)
    expected = hardware.sources.get(HASH_KEY)
    for p in cands:
        if p.is_file():
            return load_calibration(p, expected)
    raise InfersimError(
        f"hardware profile '{hardware.name}': calibration file "
        f"'{hardware.sources.get(SOURCE_KEY, cands[0])}' not found (looked in "
        f"{', '.join(str(c.parent) for c in cands)})"
    )


# ---- the profiled transformer -------------------------------------------------------------------
# ---- executor fits ----------------------------------------------------------------------------
def read_fit_json(path: str | Path, what: str = "calibration file") -> dict:
    """A fit file's JSON object, or a one-line error naming the file."""
    path = Path(path)
    if not path.is_file():
        raise InfersimError(f"{what} not found: {path}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise InfersimError(f"{path}: cannot read the {what} ({exc.__class__.__name__})") from None
    except json.JSONDecodeError as exc:
        raise InfersimError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise InfersimError(f"{path}: not a {what} (a JSON object expected)")
    return data


def write_fit_json(path: str | Path, data: dict) -> None:
    write_atomic(Path(path), json.dumps(data, indent=2, sort_keys=True) + "\n")
