"""Where the built-in data lives, in a source checkout or an installed package alike."""

from __future__ import annotations

import importlib.resources
from pathlib import Path


def _package_dir(package: str) -> Path:
    return Path(str(importlib.resources.files(package)))


def hwprofiles_dir() -> Path:
    return _package_dir("infersim.hwprofiles")


def workloads_dir() -> Path:
    """Built-in workloads live in the top-level `traces/` folder."""
    return _package_dir("infersim.traces")


def models_dir() -> Path:
    return _package_dir("infersim.simulator") / "catalog" / "models"


def catalog_dir() -> Path:
    return _package_dir("infersim.simulator") / "catalog"


def home_relative(path: Path | str) -> str:
    """`path` as a record names it: under the home folder as `~/...`, so that a file shipped with
    the package (a measured profile, trained heads) names no user's home on the machine that
    wrote it; elsewhere as given."""
    p = Path(path).expanduser()
    try:
        return str(Path("~") / p.resolve().relative_to(Path.home().resolve()))
    except ValueError:
        return str(path)
