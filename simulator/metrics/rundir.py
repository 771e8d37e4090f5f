"""A run is a directory: resolved config, per-request rows, time series, summary, plots.
It is built in a hidden sibling folder and moved into place at the end, so an interrupted
or failed run never leaves a half-written directory nor destroys a previous one.

A folder is only ever replaced when this tool wrote it: every folder a command writes holds a
marker file (MARKER, with the command and version); any other existing folder is refused
unless the user passes --force. Files are never replaced by folders, nor folders by files."""

from __future__ import annotations

import glob
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from infersim import __version__

from ..errors import InfersimError
from ..yamlio import check_writable_in, first_missing_folder, remove_created_folders

MARKER = ".infersim-run"
# tests of interruption stop a real process at a named stage (see pause_point)
PAUSE_ENV = "INFERSIM_PAUSE_AT"
# signals that end a command: held back while a finished folder is swapped into place
_END_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _marker_text(command: str) -> str:
    return json.dumps({"command": command, "infersim": __version__}) + "\n"


def is_tool_folder(path: Path) -> bool:
    """True for a real folder (not a link) holding this tool's marker file."""
    path = Path(path)
    return path.is_dir() and not path.is_symlink() and (path / MARKER).is_file()


def folder_command(path: Path) -> str | None:
    """The command whose marker a tool folder holds (`run`, `sweep`, ...), None when unreadable."""
    try:
        return json.loads((Path(path) / MARKER).read_text()).get("command")
    except (OSError, ValueError, AttributeError):
        return None


def _writable_parent(path: Path) -> None:
    """The nearest existing ancestor of `path` must be a folder we can write into."""
    parent = path.parent
    while not parent.exists():
        if parent.is_symlink():
            raise InfersimError(f"{path}: its folder {parent} is a broken link")
        parent = parent.parent
    if not parent.is_dir():
        raise InfersimError(f"{path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK):
        raise InfersimError(f"{path}: cannot write into {parent} (read-only or no permission)")
    check_writable_in(parent, path)


def check_out_dir(path: Path | str, *, force: bool = False, option: str = "--out", command: str | None = None) -> Path:
    """Refuse, before any work, an output folder the command may not (re)place: the current
    folder or one of its ancestors, an existing file, a folder this tool did not write or (when
    `command` is given) that another command wrote (unless `force`), a place that cannot be
    written. Returns the path."""
    raw = str(path)
    if raw.strip() == "":
        raise InfersimError(f"{option}: empty path; name a folder, e.g. {option} runs/mine")
    path = Path(raw)
    here, full = Path.cwd().resolve(), path.resolve()
    if full == here or full in here.parents:
        what = "the current folder" if full == here else f"{full}, a folder above the current one"
        raise InfersimError(f"{option} {raw}: is {what}; name a new or an earlier run folder, e.g. {option} runs/mine")
    if path.is_symlink():
        raise InfersimError(f"{option} {raw}: is a link; name a real folder")
    if path.exists() and not path.is_dir():
        raise InfersimError(f"{option} {raw}: is a file, not a folder; name a folder")
    try:
        holds_files = path.is_dir() and any(path.iterdir())
    except OSError as exc:
        raise InfersimError(f"{option} {raw}: cannot read the folder ({exc.strerror})") from None
    if holds_files and not is_tool_folder(path) and not force:
        raise InfersimError(
            f"{option} {raw}: folder exists and was not written by infersim (no {MARKER} in it); "
            f"name another folder, or pass --force to replace it"
        )
    other = folder_command(path) if holds_files and command is not None and not force else None
    if other is not None and other != command:  # a sweep's results are not a run to replace, nor a place for a study
        raise InfersimError(
            f"{option} {raw}: holds the results of `sim {other}`, not of `sim {command}`; "
            f"name another folder, or pass --force to replace it"
        )
    _writable_parent(path)
    return path


def check_out_file(path: Path | str, suffixes: tuple[str, ...], *, option: str, force: bool = False) -> Path:
    """Refuse, before any work, a file output that names a folder, has another suffix than
    `suffixes` (lower case, with the dot), exists already (unless `force`: the command's
    --force) or cannot be written."""
    raw = str(path)
    if raw.strip() == "":
        raise InfersimError(f"{option}: empty path; name a file ({', '.join(suffixes)})")
    path = Path(raw)
    if path.is_dir() or raw.endswith(os.sep):
        raise InfersimError(f"{option} {raw}: is a folder; name a file ({', '.join(suffixes)})")
    if path.suffix.lower() not in suffixes:
        raise InfersimError(f"{option} {raw}: unsupported extension '{path.suffix}'; use {', '.join(suffixes)}")
    if (path.exists() or path.is_symlink()) and not force:
        raise InfersimError(f"{option} {raw}: exists; name another file, or pass --force to replace it")
    _writable_parent(path)
    return path


def check_folder_option(path: Path | str, option: str) -> Path:
    """A folder the command reads and fills (a cache, a root): refused when it names a file."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise InfersimError(f"{option} {path}: is a file; name a folder")
    return path


def pause_point(stage: str) -> None:
    """With the environment variable INFERSIM_PAUSE_AT set to `stage`, say so on stderr and wait
    for a signal: tests kill a real command at a known moment (e.g. "simulating", "writing")
    instead of after a guessed delay. Does nothing otherwise."""
    if os.environ.get(PAUSE_ENV) != stage:
        return

    sys.stderr.write(f"infersim: paused at {stage}\n")
    sys.stderr.flush()
    while True:
        time.sleep(60)


@contextmanager
def held_signals():
    """Hold SIGINT and SIGTERM back for a few file-system steps that must not be cut in half
    (a folder swap); a signal that came meanwhile is delivered at the end."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _END_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _staging_prefix(target: Path, pid: int | None = None) -> str:
    """A staging folder's name up to its random part: the target, this host and the process,
    so that a later run can tell a dead run's leftover from a live one's folder."""
    host = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"
    return f".{target.name}.tmp-{host}-{os.getpid() if pid is None else pid}-"


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: alive
        return False
    return False


def remove_stale_staging(target: Path) -> list[Path]:
    """Remove the staging folders of `target` left by runs of this host whose process is gone
    (killed by SIGKILL or the OOM killer, which no clean-up survives); a live run's folder, a
    folder of another host (a shared file system) and anything not named as this tool names
    them stay. Returns the folders removed."""
    target = Path(target)
    mine = re.compile(re.escape(_staging_prefix(target, 0)[: -len("0-")]) + r"(\d+)-[A-Za-z0-9_]+$")
    gone = []
    if not target.parent.is_dir():
        return gone
    for p in target.parent.glob(f".{glob.escape(target.name)}.tmp-*"):
        m = mine.match(p.name)
        if (
            m
            and p.is_dir()
            and not p.is_symlink()
            and int(m.group(1)) != os.getpid()
            and _process_gone(int(m.group(1)))
        ):
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p)
    return gone


def _mkdtemp(target: Path) -> Path:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(target)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=_staging_prefix(target)))
    except OSError as exc:
        raise InfersimError(f"{target}: cannot create the output folder ({exc.strerror})") from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; a run directory is an ordinary folder
    return tmp


@contextmanager
def staged_folder(target: Path):
    """Yield a hidden temporary folder beside `target` (the folders above made as needed); on
    success it replaces `target` whole: the previous folder is moved aside, the new one moved in
    and the previous one removed, signals held back meanwhile. On any error or signal the
    temporary folder, and the folders made for it, are removed and `target` is left as it was; a
    killed run's folder goes at the next run (remove_stale_staging)."""
    target = Path(target)
    created = first_missing_folder(target.parent)  # removed again if the command fails
    tmp = _mkdtemp(target)
    try:
        yield tmp
        with held_signals():
            old = None
            if target.exists():
                old = target.parent / f".{target.name}.old-{os.getpid()}"
                os.replace(target, old)
            os.replace(tmp, target)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
    finally:
        with held_signals():
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
                remove_created_folders(created, target.parent)


@contextmanager
def staged_dir(target: Path, *, command: str = "run", force: bool = False):
    """staged_folder for a command's output folder: `target` checked first with check_out_dir,
    and the finished folder holds the marker file."""
    target = check_out_dir(target, force=force, command=command)
    with staged_folder(target) as tmp:
        yield tmp
        (tmp / MARKER).write_text(_marker_text(command))


class StagedFiles:
    """The files of one result (a profile, its sidecar and measured GEMM table, a figure),
    written under hidden temporary names beside their targets and moved into place together
    by commit(): an interruption before the commit leaves every target as it was, one during
    it waits (signals held back) and a failed rename puts the previous files back. Targets
    are committed in the order given, the main file (the one naming the others) last.
    Use it through staged_files()."""

    def __init__(self, targets):
        self.targets = [Path(t) for t in targets if t is not None]
        self._token = f"{os.getpid()}-{secrets.token_hex(3)}"
        self._created: list[tuple[Path | None, Path]] = []  # (outermost folder made, its folder)

    @property
    def main(self) -> Path:
        """The target committed last: the file that names the others."""
        return self.targets[-1]

    def path(self, target: Path | str) -> Path:
        """Where `target`'s new content is written meanwhile (its folder made if needed): a
        hidden name in the same folder that keeps the target's suffixes, which writers such as
        pandas and matplotlib go by. Reading it back (a cost model on a staged table) works."""
        target = Path(target)
        if target not in self.targets:
            raise ValueError(f"{target} is not one of the staged targets")
        folder = target.parent
        if not folder.is_dir():
            self._created.append((first_missing_folder(folder), folder))
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise InfersimError(f"{target}: cannot create its folder ({exc.strerror})") from None
        return self._staged(target)

    def _staged(self, target: Path) -> Path:
        return target.parent / f".staged-{self._token}.{target.name}"

    def written(self) -> list[Path]:
        """The targets whose new content was written (the others are left as they are)."""
        return [t for t in self.targets if self._staged(t).is_file()]

    def commit(self) -> None:
        pause_point("committing")
        with held_signals():
            moved: list[tuple[Path, Path | None]] = []  # (target placed, its previous file aside)
            try:
                for target in self.written():
                    aside = None
                    if target.exists() or target.is_symlink():
                        aside = target.with_name(f".{target.name}.old-{self._token}")
                        os.replace(target, aside)
                    moved.append((target, aside))
                    os.replace(self._staged(target), target)
            except BaseException:
                for target, aside in reversed(moved):
                    _put_back(target, aside)
                raise
            for _, aside in moved:
                if aside is not None:
                    aside.unlink()

    def discard(self) -> None:
        """Remove what was staged and not committed, and the folders made for it while empty."""
        with held_signals():
            for target in self.targets:
                if self._staged(target).exists():
                    self._staged(target).unlink()
            for created, folder in self._created:
                remove_created_folders(created, folder)


def _put_back(target: Path, aside: Path | None) -> None:
    """Undo one step of a failed commit: the new file goes, the previous one comes back."""
    if aside is not None:
        os.replace(aside, target)
    elif target.exists():
        target.unlink()


@contextmanager
def staged_files(*targets: Path | None):
    """Yield a StagedFiles for `targets` (None entries ignored: an output not asked for); on
    success every written one replaces its target, on any error or signal none does and the
    staged files are removed."""
    staged = StagedFiles(targets)
    try:
        yield staged
        staged.commit()
    finally:
        staged.discard()


def claim_dir(target: Path, *, command: str, force: bool = False) -> Path:
    """For commands that fill their folder in place (resumable sweeps, studies): check it,
    create it and mark it as this tool's. Returns the path."""
    target = check_out_dir(target, force=force, command=command)
    try:
        target.mkdir(parents=True, exist_ok=True)
        if not (target / MARKER).is_file():
            (target / MARKER).write_text(_marker_text(command))
    except OSError as exc:
        raise InfersimError(f"{target}: cannot create the output folder ({exc.strerror})") from None
    return target


@contextmanager
def claimed_dir(target: Path, *, command: str, force: bool = False):
    """claim_dir for a command that fills its folder in place (a study): a folder this call
    created (with the folders above it it had to create) is removed again when the command
    fails or is interrupted, so a refusal or a Ctrl-C leaves nothing; a folder that was there
    stays."""
    created = first_missing_folder(Path(target))
    path = claim_dir(target, command=command, force=force)
    try:
        yield path
    except BaseException:
        if created is not None:
            with held_signals():
                shutil.rmtree(path, ignore_errors=True)
                remove_created_folders(created, Path(path).parent)
        raise


def json_clean(obj):
    """JSON without NaN (not valid JSON): NaN becomes null."""
    if isinstance(obj, dict):
        return {k: json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_clean(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return None if math.isnan(float(obj)) else float(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(json_clean(data), indent=2, sort_keys=True) + "\n")


def write_yaml(path: Path, data) -> None:
    path.write_text(yaml.safe_dump(json_clean(data), sort_keys=True))


def write_table(path: Path, columns: dict[str, np.ndarray]) -> None:
    pq.write_table(pa.table(columns), str(path))


def read_columns(path: Path, what: str = "a `sim exec` run directory") -> dict[str, np.ndarray]:
    """A run folder's parquet table as numpy columns; a missing file is a one-line error naming
    the folder and what it should have been."""
    path = Path(path)
    if not path.is_file():
        raise InfersimError(f"{path.parent}: missing {path.name} (not {what})")
    t = pq.read_table(str(path))
    return {c: t.column(c).to_numpy() for c in t.column_names}
