"""A small model zoo trained offline: a byte-level BPE tokenizer and small causal LMs (a
Llama target, Llama drafts distilled from it, a small OPT) on the Python standard library's
source, deterministic by seed and cached on disk. Names like `zoo-target` resolve to the
checkpoint folder wherever the executor takes a model."""

from __future__ import annotations

import json
import os
import subprocess as sp
import sys
from pathlib import Path

from infersim.simulator.errors import InfersimError, did_you_mean
from infersim.simulator.models.catalog import register_model_source
from infersim.simulator.progress import log_line

from .shipped import shipped_manifest
from .spec import DEFAULT_ZOO, TINY_ZOO, ModelRecipe, ZooSpec

ZOO_PREFIX = "zoo-"


def is_zoo_name(name: str) -> bool:
    return str(name).startswith(ZOO_PREFIX) and "/" not in str(name) and not Path(str(name)).exists()


def zoo_names(spec: ZooSpec = DEFAULT_ZOO) -> list[str]:
    return [r.name for r in spec.models]


def resolve_zoo_model(
    name: str, *, build: bool = False, spec: ZooSpec = DEFAULT_ZOO, root: Path | None = None, log=None
) -> Path:
    """The checkpoint folder of a zoo model: this machine's own build when it has the model;
    else the shipped weights (copied into the cache under their own build key); else, with
    `build`, trained (with its teacher) first, or an error telling how to build it."""
    from .build import build_zoo, zoo_root

    if name not in zoo_names(spec):
        hint = did_you_mean(name, zoo_names(spec))
        raise InfersimError(f"unknown zoo model '{name}'{hint}; the zoo has: {', '.join(zoo_names(spec))}")
    d = _ready_zoo_dir(spec, root, log, lambda d: (d / name / "zoo.json").exists())
    if d is not None:
        return d / name
    if not build:
        looked = own_zoo_dir(spec, root) or Path(root or zoo_root())
        raise InfersimError(f"zoo model '{name}' is not built yet (looked in {looked}): run `sim zoo build`")
    return build_zoo(spec, root=root, names=[name], log=log) / name


def _ready_zoo_dir(spec: ZooSpec, root: Path | None, log, has) -> Path | None:
    """The first zoo folder for which `has(folder)` holds: this machine's own build (filled from
    the shipped files when its key is the shipped key), else the shipped weights (default zoo
    only); None when neither has it."""
    from .build import fill_from_shipped

    own = own_zoo_dir(spec, root)
    if own is not None and not has(own):
        fill_from_shipped(own)
    if own is not None and has(own):
        return own
    shipped = shipped_zoo_dir(root, log) if spec is DEFAULT_ZOO else None
    return shipped if shipped is not None and has(shipped) else None


def own_zoo_dir(spec: ZooSpec = DEFAULT_ZOO, root: Path | None = None) -> Path | None:
    """The folder of the zoo this machine builds (keyed by its corpus, recipes and library
    versions), or None where its Python's standard library has no pinned corpus hash."""
    from .build import zoo_dir

    try:
        return zoo_dir(spec, root)
    except InfersimError:
        return None


_told: set[str] = set()


def shipped_zoo_dir(root: Path | None = None, log=None) -> Path | None:
    """The shipped weights, in the cache folder of their own build key (copied in once,
    checksums checked), or None where the package ships none. Models trained elsewhere load
    anywhere (safetensors checkpoints): a machine whose Python, torch, transformers or
    tokenizers differ from the shipped build serves them instead of training for half an hour;
    `sim zoo build` trains a zoo of its own."""
    from .build import fill_from_shipped, zoo_root

    man = shipped_manifest()
    if not man:
        return None
    d = Path(root or zoo_root()) / man["key"]
    fill_from_shipped(d)
    if man["key"] not in _told:
        _told.add(man["key"])
        built = ", ".join(f"{k} {v}" for k, v in sorted(man.get("versions", {}).items()))
        (log or log_line)(f"zoo: the shipped weights (built with {built}; this machine's own build is missing)")
    return d


def _config_path(name: str) -> Path:
    """A zoo model's Hugging Face config.json, for the simulator's model catalog."""
    try:
        return resolve_zoo_model(name) / "config.json"
    except ImportError as exc:  # the zoo's cache key needs the executor extra (torch)
        raise InfersimError(
            f"model '{name}' is from the executor's zoo, which needs pip install \".[executor]\" " f"({exc})"
        ) from None


register_model_source(ZOO_PREFIX, _config_path)


def ensure_zoo(spec: ZooSpec = DEFAULT_ZOO, root: Path | None = None, log=None, subprocess: bool = True) -> Path:
    """The whole zoo's folder: this machine's own build, else the shipped weights
    (`shipped_zoo_dir`), else built. The default zoo is trained in a child process
    (`python -m infersim.executor.zoo.build`) that this one waits for: the training gets a
    fresh interpreter with OpenMP set up for a shared machine, and its memory is returned when
    it ends."""
    from .build import build_zoo, is_complete

    d = _ready_zoo_dir(spec, root, log, lambda d: is_complete(d, spec.models))
    if d is not None:
        return d
    if not subprocess or spec is not DEFAULT_ZOO:
        return build_zoo(spec, root=root, log=log)
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    cmd = [sys.executable, "-m", "infersim.executor.zoo.build"] + (["--root", str(root)] if root else [])
    res = sp.run(cmd, env=env)
    if res.returncode != 0:
        raise InfersimError(f"building the model zoo failed (exit {res.returncode}): {' '.join(cmd)}")
    return build_zoo(spec, root=root, log=log)  # finds it all cached


def zoo_manifest(path: Path) -> dict:
    f = Path(path) / "zoo.json"
    return json.loads(f.read_text()) if f.exists() else {}


__all__ = [
    "DEFAULT_ZOO",
    "TINY_ZOO",
    "ModelRecipe",
    "ZooSpec",
    "ensure_zoo",
    "is_zoo_name",
    "resolve_zoo_model",
    "zoo_manifest",
    "zoo_names",
]
