"""Name -> spec lookup over folders of YAML files, shared by models, hardware and workloads.

A name may be a catalog entry (file stem, the `name` field, or an alias; case-insensitive)
or a path to a file."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .errors import InfersimError, UnknownNameError
from .registry import name_key
from .yamlio import load_mapping


@lru_cache(maxsize=None)
def index_folder(folder: str, suffixes: tuple[str, ...] = (".yaml", ".yml")) -> dict[str, Path]:
    """Map every normalised name and alias in a folder to its file."""
    out: dict[str, Path] = {}
    for path in sorted(Path(folder).iterdir()):
        if path.suffix not in suffixes or path.name.startswith("_"):
            continue
        out[name_key(path.stem)] = path
        try:
            data = load_mapping(path)
        except Exception:
            continue
        for key in [data.get("name", "")] + list(data.get("aliases", []) or []):
            if key:
                out.setdefault(name_key(str(key)), path)
    return out


def canonical_names(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and not p.name.startswith("_"))


def resolve(kind: str, name: str, folder: Path) -> Path:
    """A catalog name, or an existing file path, to a file path."""
    as_path = Path(name).expanduser()
    if as_path.suffix in (".yaml", ".yml", ".json") and as_path.is_file():
        return as_path
    if as_path.is_dir() and (as_path / "config.json").is_file():
        return as_path / "config.json"
    if as_path.is_dir():
        holds = " without config.json" if kind == "model" else ""  # a checkpoint folder names a model
        raise InfersimError(f"{as_path}: is a folder{holds}; name a {kind} or its YAML file")
    found = index_folder(str(folder)).get(name_key(name))
    if found is None:
        raise UnknownNameError(kind, name, canonical_names(folder))
    return found
