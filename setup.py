"""Package list for setuptools: the code packages, plus the two top-level data folders
(`hwprofiles/`, `traces/`) mapped under `infersim_data` (see package-dir in pyproject.toml),
which `find_packages` cannot discover because they live outside that package's folder."""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["simulator*", "executor*", "analysis*", "infersim_data"])
    + ["infersim_data.hwprofiles", "infersim_data.traces"],
)
