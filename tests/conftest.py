"""Shared fixtures and the optional parts a test may need.

A test that needs an optional part carries its marker and is skipped only where that part is
absent: `torch` (PyTorch, transformers and tokenizers: the executor), `browser` (a Chromium
binary), `cuda` (a CUDA device). `slow` marks the end-to-end runs (`-m "not slow"` leaves them
out while iterating). The README's test command installs every part, so CI runs them all."""

import importlib.util
import os

import pytest

from tests.utils import chromium

# plots and the CLI must never need a display
os.environ.setdefault("MPLBACKEND", "Agg")


def _has_torch() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "tokenizers"))


def _has_cuda() -> bool:
    if not _has_torch():
        return False
    import torch

    return torch.cuda.is_available()


# marker -> (is the part present, what to install when it is not)
OPTIONAL_PARTS = {
    "torch": (_has_torch, 'PyTorch, transformers and tokenizers: pip install -e ".[test]"'),
    "browser": (lambda: chromium() is not None, "Chromium: apt-get install -y chromium chromium-driver"),
    "cuda": (_has_cuda, "a CUDA device"),
}


def pytest_runtest_setup(item):
    for marker, (present, what) in OPTIONAL_PARTS.items():
        if item.get_closest_marker(marker) is not None and not present():
            pytest.skip(f"needs {what}")


@pytest.fixture(scope="session", autouse=True)
def torch_one_thread():
    """torch runs with one thread in every test (where installed): the executor's outputs do not
    depend on it, and multi-threaded torch collapses when another process takes the other core.
    A test that wants more threads sets them itself (tests.utils.torch_threads)."""
    if not _has_torch():
        yield
        return
    import infersim.executor  # noqa: F401  (before torch: OpenMP threads wait passively)
    from tests.utils import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def zoo_dir():
    """The executor's default model zoo (real trained models): this machine's own build where
    it has one, else the weights shipped with the package, copied into the cache on first use
    (executor/zoo/__init__.py `ensure_zoo`). Returns the zoo folder."""
    if not _has_torch():
        pytest.skip(f"needs {OPTIONAL_PARTS['torch'][1]}")
    import infersim.executor  # noqa: F401  (before torch work: passive OpenMP waits)
    from infersim.executor.zoo import ensure_zoo

    return ensure_zoo()


@pytest.fixture(scope="module")
def zoo_target(zoo_dir):
    """The zoo's target model, loaded on the CPU in fp32 (once per test module)."""
    from infersim.executor.models import load_model

    return load_model("zoo-target", device="cpu", dtype="fp32")


@pytest.fixture
def small_workload():
    """A workload spec built in code (tests/utils.py small_workload_spec), serving options as
    keyword arguments."""
    from tests.utils import small_workload_spec

    return small_workload_spec
