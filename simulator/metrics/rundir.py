"""A run is a directory: resolved config, per-request rows, time series, summary, plots.
It is built in a hidden sibling folder and moved into place at the end, so an interrupted
or failed run never leaves a half-written directory nor destroys a previous one."""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import yaml


@contextmanager
def staged_dir(target: Path):
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; a run directory is an ordinary folder
    try:
        yield tmp
        old = None
        if target.exists():
            old = target.parent / f".{target.name}.old-{os.getpid()}"
            os.replace(target, old)
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _clean(obj):
    """JSON without NaN (not valid JSON): NaN becomes null."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        return None if math.isnan(float(obj)) else float(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(_clean(data), indent=2, sort_keys=True) + "\n")


def write_yaml(path: Path, data) -> None:
    path.write_text(yaml.safe_dump(_clean(data), sort_keys=True))


def write_table(path: Path, columns: dict[str, np.ndarray]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), str(path))
