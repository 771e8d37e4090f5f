"""The installed layout: one import name over the repository's top-level folders."""

from __future__ import annotations

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
