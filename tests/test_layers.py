"""The package's layers run one way and no package imports itself in a circle: the
import-linter contracts in pyproject.toml ([tool.importlinter]) hold.

import-linter finds a package's modules by walking its folder, and the repository's top-level
folders (simulator/, executor/, analysis/) install under `infersim` through package-dir, so
the check runs on a folder tree of links laid out as the installed package is."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# installed name under infersim -> the repository folder it comes from
LAYOUT = {
    "cli": ROOT / "infersim" / "cli",
    "simulator": ROOT / "simulator",
    "executor": ROOT / "executor",
    "analysis": ROOT / "analysis",
    "hwprofiles": ROOT / "hwprofiles",
    "traces": ROOT / "traces",
}


def lint_imports_command() -> str:
    local = Path(sys.executable).with_name("lint-imports")
    found = str(local) if local.exists() else shutil.which("lint-imports")
    if found is None:
        pytest.fail('lint-imports not found: pip install -e ".[test]" installs import-linter')
    return found


def test_import_contracts_hold(tmp_path):
    pkg = tmp_path / "infersim"
    pkg.mkdir()
    shutil.copy(ROOT / "infersim" / "__init__.py", pkg / "__init__.py")
    for name, folder in LAYOUT.items():
        (pkg / name).symlink_to(folder, target_is_directory=True)
    # run from the link tree, so that `infersim` is found there and not in the repository root
    res = subprocess.run(
        [lint_imports_command(), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Contracts: 3 kept, 0 broken." in res.stdout
