"""A folder written in a hidden sibling and moved into place whole: a zoo piece (the tokenizer,
a model, shipped weights) is either complete or absent, whatever interrupts its writing."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


@contextlib.contextmanager
def staged(target: Path):
    """Yield a temporary folder beside `target`; on success it replaces `target`."""
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
