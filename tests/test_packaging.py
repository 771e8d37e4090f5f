"""The installed layout: one import name over the repository's top-level folders."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
MAPPED = {"simulator", "executor", "analysis", "hwprofiles", "traces"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_code_folder_is_listed_under_infersim():
    on_disk = {"infersim", "infersim.cli"} | {
        "infersim." + ".".join(p.parent.relative_to(ROOT).parts)
        for top in MAPPED
        for p in (ROOT / top).rglob("__init__.py")
    }
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    assert listed == on_disk


def test_top_level_folders_install_under_one_name():
    mapping = _pyproject()["tool"]["setuptools"]["package-dir"]
    assert mapping == {"infersim": "infersim", **{f"infersim.{t}": t for t in MAPPED}}


def test_packaged_data_resolves_through_importlib_resources():
    from infersim.simulator import paths

    assert (paths.hwprofiles_dir() / "a100-80gb-sxm.yaml").is_file()
    assert (paths.workloads_dir() / "chatbot.yaml").is_file()
    assert any(paths.models_dir().glob("*.yaml"))


# a development machine's folders: a user's home, the project's work tree, the reference material
MACHINE_PATH = re.compile(r"/(?:home|root|Users|work)/|\.\./shared\b")
SHIPPED_TEXT = ("*.py", "*.md", "*.yaml", "*.json", "*.toml", "*.txt", "*.html")


def test_no_shipped_file_names_a_development_machine_path():
    """Code, docs and shipped data (profiles, trained heads' metadata) name files by package,
    home-relative (`~/...`) or public URL, never by where a developer's machine kept them."""
    tops = [ROOT / t for t in (*MAPPED, "infersim", "docs", "examples", "benchmarks", "tests")]
    files = [p for top in tops for pattern in SHIPPED_TEXT for p in top.rglob(pattern)]
    files += [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "pyproject.toml"]
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in files
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if MACHINE_PATH.search(line)
    ]
    assert len(files) > 100 and not found, found


def test_records_name_home_folders_relative_to_home():
    from infersim.simulator.paths import home_relative

    assert home_relative(Path.home() / ".cache" / "infersim" / "zoo") == "~/.cache/infersim/zoo"
    assert home_relative("~/x") == "~/x"
    outside = Path("/") / "opt" / "models" / "m"
    assert home_relative(outside) == str(outside)
