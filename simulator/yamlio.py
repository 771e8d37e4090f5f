"""Reading YAML/JSON data files into pydantic models with one-line errors, and atomic writes."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import InfersimError, pydantic_error_line

M = TypeVar("M", bound=BaseModel)


def load_mapping(path: str | Path) -> dict[str, Any]:
    """Load a YAML or JSON file that must hold a mapping at the top level."""
    path = Path(path)
    if path.is_dir():
        raise InfersimError(f"{path}: is a folder; name a {'JSON' if path.suffix == '.json' else 'YAML'} file")
    if not path.is_file():
        raise InfersimError(f"{path}: file not found")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InfersimError(f"{path}: cannot read ({exc.__class__.__name__})") from None
    if not text.strip():
        raise InfersimError(f"{path}: the file is empty")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        if isinstance(exc, json.JSONDecodeError):
            where = f" at line {exc.lineno}, column {exc.colno}"
        raise InfersimError(f"{path}: malformed {'JSON' if path.suffix == '.json' else 'YAML'}{where}") from None
    if data is None:
        raise InfersimError(f"{path}: holds nothing but comments; expected a mapping at the top level")
    if not isinstance(data, dict):
        raise InfersimError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def validate(model: type[M], data: dict[str, Any], source: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InfersimError(pydantic_error_line(source, exc)) from None


def load_model_file(model: type[M], path: str | Path) -> M:
    return validate(model, load_mapping(path), str(path))


def _umask_mode() -> int:
    """The mode an ordinary new file would get (mkstemp makes files private, 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def first_missing_folder(path: Path) -> Path | None:
    """The outermost folder of `path` that does not exist yet (None: it exists)."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing = folder
    return missing


def remove_created_folders(created: Path | None, innermost: Path) -> None:
    """Remove the folders from `innermost` up to `created` that a failed command made, as long as
    they are empty (os.rmdir refuses a folder that holds anything)."""
    if created is None:
        return
    created, innermost = Path(os.path.abspath(created)), Path(os.path.abspath(innermost))
    if innermost != created and created not in innermost.parents:
        return  # nothing below `innermost` was created by this command
    for folder in (innermost, *innermost.parents):
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == created:
            return


def _temporary_beside(path: Path, prefix: str, suffix: str) -> tuple[int, str, Path | None]:
    """A new temporary file in `path`'s folder (created if needed), and the outermost folder
    it created (None: none); a folder that cannot be created or written is one line naming `path`."""
    created = first_missing_folder(path.parent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return (*tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix), created)
    except OSError as exc:
        remove_created_folders(created, path.parent)
        raise _cannot_write(path, exc) from None


def _cannot_write(path: Path, exc: OSError) -> InfersimError:
    return InfersimError(f"{path}: cannot write there ({exc.strerror or exc})")


def check_writable_in(folder: Path, path: Path) -> None:
    """Refuse, before any work, a `path` the atomic writers could not write into `folder` (its
    nearest existing folder): a file made there and removed, since permissions alone do not
    tell (root on a read-only mount, /proc). The one line is the writers' own."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise _cannot_write(path, exc) from None


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """Write to a temporary file in the same folder, then rename over the target, so a crash
    never leaves a half-written result and an old result is never lost to a failed write."""
    path = Path(path)
    fd, tmp, created = _temporary_beside(path, f".{path.name}.", ".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        remove_created_folders(created, path.parent)
        raise


def atomic_path(path: str | Path):
    """Context manager yielding a temporary path that replaces `path` on success
    (for writers such as pandas/matplotlib that want a filename)."""

    @contextlib.contextmanager
    def _cm():
        p = Path(path)
        fd, tmp, created = _temporary_beside(p, f".{p.stem}.", p.suffix)
        os.close(fd)
        try:
            yield Path(tmp)
            os.chmod(tmp, _umask_mode())
            os.replace(tmp, p)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
                remove_created_folders(created, p.parent)

    return _cm()
