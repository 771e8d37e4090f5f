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
