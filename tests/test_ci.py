"""CI runs exactly the README's test command, and a run that collects no tests fails it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_test_command() -> str:
    """The command in the README's code block that runs the tests (`python -m pytest`)."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    found = [line for b in blocks for line in b.splitlines() if line.rstrip().endswith("python -m pytest")]
    assert len(found) == 1, found
    return found[0].strip()


def test_ci_runs_the_readme_test_command_and_fails_with_it():
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [line for line in script if line.strip() and not line.startswith("#")]
    assert commands[0] == "set -euo pipefail"  # any failing step, pytest's included, fails the script
    assert commands[-1] == readme_test_command()


def test_a_run_that_collects_no_tests_is_not_a_success(tmp_path):
    """pytest exits 5 when it collects nothing: a non-zero status, so `.ci/run` (set -e) fails."""
    (tmp_path / "test_nothing.py").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 5, done.stdout
