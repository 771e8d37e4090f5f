"""Model specs by name: the built-in catalog (simulator/catalog/models/*.yaml), a model YAML
anywhere, or a Hugging Face config.json (the file, or the checkpoint folder holding it)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from ..catalog_loader import canonical_names, resolve
from ..errors import InfersimError
from ..paths import models_dir
from ..yamlio import load_mapping, validate
from .hf_config import spec_from_hf_config
from .spec import ModelSpec


def list_models() -> list[str]:
    return canonical_names(models_dir())


def load_model(name_or_path: str) -> ModelSpec:
    as_path = Path(str(name_or_path)).expanduser()
    if as_path.suffix in (".yaml", ".yml", ".json") and not as_path.exists():
        # Looks like a path, so "unknown model" with the catalog listing would mislead.
        raise InfersimError(f"{as_path}: file not found")
    if str(name_or_path).startswith("zoo-") and not as_path.exists():
        path = _zoo_config(str(name_or_path))
    else:
        path = resolve("model", str(name_or_path), models_dir())
    stat = path.stat()
    # Keyed on mtime and size too, so an edited file is re-read rather than served stale.
    return _load(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


def _zoo_config(name: str) -> Path:
    """A model of the executor's zoo (`sim zoo build`), by name, as its HF config.json."""
    try:
        from infersim.executor.zoo import resolve_zoo_model
    except ImportError as exc:  # the zoo's cache key needs the executor extra (torch)
        raise InfersimError(f"model '{name}' is from the executor's zoo, which needs pip install \".[executor]\" "
                            f"({exc})") from None
    return resolve_zoo_model(name) / "config.json"


@lru_cache(maxsize=None)
def _load(path: str, _mtime_ns: int, _size: int) -> ModelSpec:
    file = Path(path)
    data = load_mapping(file)
    if "model_type" in data:  # a Hugging Face config.json; our own files never carry model_type
        name = file.parent.name if file.name == "config.json" else file.stem
        return spec_from_hf_config(data, name=name, source=path)
    return validate(ModelSpec, data, path)
