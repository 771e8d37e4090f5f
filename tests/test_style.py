"""The code's style is checked, not argued: ruff's lint rules and its formatter, as configured in
pyproject.toml ([tool.ruff]), hold over the whole repository."""

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _ruff(*args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff")
    assert exe, "ruff is not installed (pip install -e '.[test]')"
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_lint_passes():
    done = _ruff("check", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_leaves_every_file_unchanged():
    done = _ruff("format", "--check", ".")
    assert done.returncode == 0, done.stdout + done.stderr
