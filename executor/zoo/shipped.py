"""The default zoo as shipped with the package: the weights `sim zoo ship` wrote from a build of
DEFAULT_ZOO (tokenizer, model checkpoints, the default Medusa heads of zoo-target), under the
build key they were trained for and with each file's SHA-256 (`shipped/SHIPPED.json`).

A zoo folder whose key is the shipped key is filled from the shipped files instead of being
trained: the files are copied into the cache (checked against their checksums first), so the
cache stays the one place the executor reads and writes (Medusa heads trained later land
beside the models as before). A cache that already holds a model keeps it; a key that differs
(another spec, corpus, torch/transformers/tokenizers version) trains as before."""

from __future__ import annotations

import importlib.resources
import json
import shutil
from pathlib import Path

from infersim.simulator.costmodel.calibration_file import sha256_file
from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import staged_folder

MANIFEST = "SHIPPED.json"


def shipped_dir() -> Path:
    """The package's shipped-zoo folder (in a source checkout and an installed package alike)."""
    return Path(str(importlib.resources.files("infersim.executor.zoo"))) / "shipped"


def shipped_manifest(folder: Path | None = None) -> dict:
    """The shipped zoo's manifest: {key, corpus_sha256, versions, spec, files: {path: sha256}};
    empty when nothing is shipped."""
    f = Path(folder or shipped_dir()) / MANIFEST
    return json.loads(f.read_text()) if f.is_file() else {}


def _entries(files: dict) -> list[str]:
    """The folders a zoo is made of, as the shipped files name them: tokenizer/, one per model,
    medusa/<target>-<key>/ per set of heads."""
    out = []
    for rel in sorted(files):
        parts = Path(rel).parts
        top = "/".join(parts[:2]) if parts[0] == "medusa" else parts[0]
        if len(parts) > 1 and top not in out:
            out.append(top)
    return out


def install_shipped(d: Path, folder: Path | None = None) -> bool:
    """Fill zoo folder `d` from the shipped files when its key (the folder's name) is the shipped
    key: each missing piece is copied in atomically after its checksums are checked. Returns
    whether the key matched. Call it under the zoo's lock."""
    src = Path(folder or shipped_dir())
    man = shipped_manifest(src)
    if not man or man.get("key") != d.name:
        return False
    files = man["files"]
    d.mkdir(parents=True, exist_ok=True)
    for entry in _entries(files):
        target = d / entry
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with staged_folder(target) as tmp:
            for rel in (r for r in files if r.startswith(entry + "/")):
                got = sha256_file(src / rel)
                if got != files[rel]:
                    raise InfersimError(
                        f"{src / rel}: checksum {got[:12]} is not the shipped {files[rel][:12]} "
                        f"(field files in {src / MANIFEST}): reinstall infersim"
                    )
                dst = tmp / Path(rel).relative_to(entry)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src / rel, dst)
    if not (d / "zoo.json").exists():
        shutil.copyfile(src / "zoo.json", d / "zoo.json")
    return True


def ship(d: Path, out: Path | None = None) -> Path:
    """Write zoo folder `d` (built, with its Medusa heads) as the shipped zoo: its zoo.json,
    tokenizer, models and trained heads, and SHIPPED.json with the key and every file's
    SHA-256. Leaves out lock files and unfinished (hidden) folders."""
    out = Path(out or shipped_dir())
    manifest = json.loads((d / "zoo.json").read_text())
    keep = [
        p
        for p in sorted(d.rglob("*"))
        if p.is_file()
        and not p.name.endswith(".lock")
        and not any(part.startswith(".") for part in p.relative_to(d).parts)
    ]
    with staged_folder(out) as tmp:  # a shipped zoo is replaced whole, never left half copied
        files = {}
        for p in keep:
            rel = p.relative_to(d).as_posix()
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, tmp / rel)
            if rel != "zoo.json":
                files[rel] = sha256_file(p)
        data = {
            "key": d.name,
            "corpus_sha256": manifest["corpus_sha256"],
            "versions": manifest["versions"],
            "spec": manifest["spec"],
            "files": files,
        }
        (tmp / MANIFEST).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return out
