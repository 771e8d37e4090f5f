"""The zoo's training text: the running Python's standard library source, found offline on
any machine with Python, fixed by the Python version (PSF licence).

Files are every `*.py` under the stdlib folder, in sorted POSIX-path order, leaving out
installed packages (site-packages, dist-packages), the test suites (any folder named test,
tests or idle_test: large, repetitive and often stripped by distributions) and the
build-specific `_sysconfigdata*` module. The corpus hash is the SHA-256 over (path, NUL,
bytes, NUL) of those files; a zoo is keyed by it, and the hash expected for each Python minor
version is pinned below, so a different corpus (another patch release, a distribution that
patches the stdlib) is reported instead of silently training different models.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from infersim.simulator.errors import InfersimError

if TYPE_CHECKING:
    import torch

# corpus sha256 by Python "major.minor.micro" (the stdlib changes between patch releases)
PINNED_SHA256: dict[str, str] = {
    "3.11.7": "131bb9269948a36a264b80e82e1e037c7477726b96fe51eee89fa85538f85b31",
}
ALLOW_UNPINNED_ENV = "INFERSIM_ZOO_ALLOW_UNPINNED"
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
HELDOUT_EVERY = 20  # every 20th file (in corpus order) is held out for perplexity and acceptance


@dataclass(frozen=True)
class Corpus:
    root: Path
    files: tuple[str, ...]  # POSIX paths relative to root, sorted
    sha256: str
    num_bytes: int
    python: str

    def read(self, rel: str) -> str:
        return (self.root / rel).read_bytes().decode("utf-8", errors="replace")

    def split(self) -> tuple[list[str], list[str]]:
        """(train files, held-out files): every HELDOUT_EVERY-th file is held out."""
        train = [f for i, f in enumerate(self.files) if i % HELDOUT_EVERY != HELDOUT_EVERY // 2]
        held = [f for i, f in enumerate(self.files) if i % HELDOUT_EVERY == HELDOUT_EVERY // 2]
        return train, held

    def texts(self, files) -> list[str]:
        return [self.read(f) for f in files]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _list_files(root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        for name in filenames:
            if name.endswith(".py") and not name.startswith("_sysconfigdata"):
                out.append((Path(dirpath) / name).relative_to(root).as_posix())
    return sorted(out)


def files_sha256(root: Path, files) -> tuple[str, int]:
    """The corpus hash of `files` (paths relative to `root`, in the order given): SHA-256 over
    (path, NUL, bytes, NUL) of each; and their total size in bytes."""
    h = hashlib.sha256()
    total = 0
    for rel in files:
        data = (root / rel).read_bytes()
        total += len(data)
        h.update(rel.encode())
        h.update(b"\0")
        h.update(data)
        h.update(b"\0")
    return h.hexdigest(), total


@lru_cache(maxsize=4)
def load_corpus(root: str | None = None, check: bool = True) -> Corpus:
    """The stdlib corpus of the running Python (or of `root`). With `check`, a hash that
    differs from the one pinned for this Python version is an error unless the environment
    variable INFERSIM_ZOO_ALLOW_UNPINNED=1 accepts it (the zoo is then keyed by the new hash)."""
    base = Path(root) if root else stdlib_root()
    files = _list_files(base)
    if not files:
        raise InfersimError(f"no Python source files under {base}: cannot build the model zoo corpus")
    digest, total = files_sha256(base, files)
    version = "%d.%d.%d" % sys.version_info[:3]
    if check and root is None:
        expected = PINNED_SHA256.get(version)
        if expected != digest and os.environ.get(ALLOW_UNPINNED_ENV) != "1":
            why = (
                f"the pinned hash for Python {version} is {expected}"
                if expected
                else f"no corpus hash is pinned for Python {version} (pinned: {', '.join(PINNED_SHA256)})"
            )
            raise InfersimError(
                f"model zoo corpus {base} ({len(files)} files, {total} bytes) has sha256 {digest}, but {why}: "
                f"the zoo would train on different text. Set {ALLOW_UNPINNED_ENV}=1 to build from it anyway "
                f"(the zoo is keyed by the corpus hash), or pin it in executor/zoo/corpus.py"
            )
    return Corpus(base, tuple(files), digest, total, version)


def held_out_windows(tokenizer, n: int, tokens: int, seed: int, *, split: str = "held") -> torch.Tensor:
    """n windows of `tokens` tokens, one per file (corpus order) long enough, at a seeded
    offset: [n, tokens]. split 'train' gives the skewing sample from training files (InfiniGen's
    offline skewing input; the held-out ones measure perplexity and sparsity)."""
    corpus = load_corpus()
    train, held = corpus.split()
    rng = np.random.default_rng(seed)
    out = []
    for f in held if split == "held" else train:
        ids = tokenizer(corpus.read(f))["input_ids"]
        if len(ids) >= tokens:
            off = int(rng.integers(0, len(ids) - tokens + 1))
            out.append(ids[off : off + tokens])
        if len(out) == n:
            break
    if len(out) < n:
        raise InfersimError(f"only {len(out)} {split} files hold {tokens} tokens; asked for {n} windows")
    return torch.tensor(out)
