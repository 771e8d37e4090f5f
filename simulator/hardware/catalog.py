"""Hardware profiles by name (hwprofiles/*.yaml) or path, with an optional host-link preset
(simulator/catalog/host_links.yaml) in place of the profile's own: the host link belongs to
the machine the GPU sits in, so one GPU profile serves hosts with different PCIe generations."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from ..catalog_loader import canonical_names, resolve
from ..errors import InfersimError, UnknownNameError
from ..paths import catalog_dir, hwprofiles_dir
from ..yamlio import load_mapping, validate
from .profile import HardwareProfile, HostLink


def list_hardware() -> list[str]:
    return canonical_names(hwprofiles_dir())


def list_host_links() -> list[str]:
    return sorted(_host_links())


def load_host_link(name: str) -> HostLink:
    presets = _host_links()
    found = presets.get(_link_key(name))
    if found is None:
        raise UnknownNameError("host link", name, list(presets))
    return found.model_copy(deep=True)


def load_hardware(name_or_path: str, host_link: str | None = None) -> HardwareProfile:
    as_path = Path(str(name_or_path)).expanduser()
    if as_path.suffix in (".yaml", ".yml", ".json") and not as_path.exists():
        raise InfersimError(f"{as_path}: file not found")
    path = resolve("hardware profile", str(name_or_path), hwprofiles_dir())
    stat = path.stat()
    profile = _load(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    # Profiles are mutable pydantic models; a copy keeps one caller's edits from leaking into
    # every later load of the same name.
    update = {"host_link": load_host_link(host_link)} if host_link else {}
    return profile.model_copy(deep=True, update=update)


@lru_cache(maxsize=None)
def _load(path: str, _mtime_ns: int, _size: int) -> HardwareProfile:
    return validate(HardwareProfile, load_mapping(path), path)


def _link_key(name: str) -> str:
    # "PCIe4x16", "pcie-4-x16" and "pcie_4x16" all mean the same preset.
    return re.sub(r"[\s_\-]", "", str(name).lower())


@lru_cache(maxsize=None)
def _host_links() -> dict[str, HostLink]:
    path = catalog_dir() / "host_links.yaml"
    return {
        _link_key(key): validate(HostLink, entry if isinstance(entry, dict) else {}, f"{path}: {key}")
        for key, entry in load_mapping(path).items()
    }
