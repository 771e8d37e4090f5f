"""Model specs by name: the built-in catalog (simulator/catalog/models/*.yaml), a model YAML
anywhere, a Hugging Face config.json (the file, or the checkpoint folder holding it), or a
name another layer provides: the executor registers its zoo's `zoo-*` names when imported
(`register_model_source`), so the simulator models them without depending on the executor."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Callable

from ..catalog_loader import canonical_names, resolve
from ..errors import InfersimError
from ..paths import models_dir
from ..yamlio import load_mapping, validate
from .hf_config import spec_from_hf_config
from .spec import ModelSpec

# name prefix -> the function giving such a model's Hugging Face config.json
_MODEL_SOURCES: dict[str, Callable[[str], Path]] = {}


def register_model_source(prefix: str, config_path: Callable[[str], Path]) -> None:
    """Names starting with `prefix` resolve through `config_path(name)` (unless a file of that
    name exists)."""
    _MODEL_SOURCES[prefix] = config_path


def list_models() -> list[str]:
    return canonical_names(models_dir())


def load_model(name_or_path: str) -> ModelSpec:
    as_path = Path(str(name_or_path)).expanduser()
    if as_path.suffix in (".yaml", ".yml", ".json") and not as_path.exists():
        # Looks like a path, so "unknown model" with the catalog listing would mislead.
        raise InfersimError(f"{as_path}: file not found")
    source = next((f for prefix, f in _MODEL_SOURCES.items() if str(name_or_path).startswith(prefix)), None)
    if source is not None and not as_path.exists():
        path = source(str(name_or_path))
    else:
        path = resolve("model", str(name_or_path), models_dir())
    stat = path.stat()
    # Keyed on mtime and size too, so an edited file is re-read rather than served stale.
    return _load(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=None)
def _load(path: str, _mtime_ns: int, _size: int) -> ModelSpec:
    file = Path(path)
    data = load_mapping(file)
    if "model_type" in data:  # a Hugging Face config.json; our own files never carry model_type
        name = file.parent.name if file.name == "config.json" else file.stem
        return spec_from_hf_config(data, name=name, source=path)
    return validate(ModelSpec, data, path)
