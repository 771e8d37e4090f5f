"""Factories and checks the test modules share (imported as `tests.utils`)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path


def small_workload_spec(*, count: int = 60, speculation: dict | None = None, **serving):
    """OPT-1.3B-sized serving on an A100 with a tiny KV pool, so preemption happens within a
    few dozen requests: `count` requests, an optional `speculation:` section; other keyword
    arguments override the serving section."""
    from infersim.simulator.workload.schema import WorkloadSpec

    doc = {
        "name": "small",
        "model": "opt-1.3b",
        "hardware": {"profile": "a100-80gb-pcie"},
        "serving": {"gpu_blocks": 48, "cpu_blocks": 24, "block_size": 16, **serving},
        "requests": {
            "count": count,
            "arrival": {"type": "poisson", "rate": 200.0},
            "prompt_tokens": {"type": "lognormal", "mean": 60, "cv": 0.8, "max": 300},
            "output_tokens": {"type": "lognormal", "mean": 40, "cv": 0.8, "max": 200},
        },
        "seed": 3,
    }
    if speculation is not None:
        doc["speculation"] = speculation
    return WorkloadSpec.model_validate(doc)


def fixed_burst_spec(
    model: str, *, count: int, prompt_tokens: int, output_tokens: int, profile: str = "a100-80gb-pcie", **sections
):
    """`count` requests of fixed prompt and output lengths, all arriving at t = 0, on `model` and
    the hardware `profile`; `sections` are further top-level workload fields (name, seed,
    serving, speculation, offload)."""
    from infersim.simulator.workload.schema import WorkloadSpec

    return WorkloadSpec.model_validate(
        {
            "model": model,
            "hardware": {"profile": profile},
            "requests": {
                "count": count,
                "arrival": {"type": "burst"},
                "prompt_tokens": {"type": "fixed", "value": prompt_tokens},
                "output_tokens": {"type": "fixed", "value": output_tokens},
            },
            **sections,
        }
    )


def zoo_workload(
    name: str,
    *,
    max_batch_size: int,
    rate: float,
    output_tokens: tuple[int, int],
    seed: int,
    speculation: dict | None = None,
    count: int = 6,
) -> dict:
    """A small `sim exec` workload on the zoo target: `count` requests with uniform 20-60-token
    prompts, as a dict ready for write_yaml."""
    low, high = output_tokens
    wl = {
        "name": name,
        "model": "zoo-target",
        "hardware": {"profile": "a100-80gb-pcie"},
        "serving": {"max_batch_size": max_batch_size},
        "requests": {
            "count": count,
            "arrival": {"type": "poisson", "rate": rate},
            "prompt_tokens": {"type": "uniform", "low": 20, "high": 60},
            "output_tokens": {"type": "uniform", "low": low, "high": high},
        },
        "seed": seed,
    }
    if speculation is not None:
        wl["speculation"] = speculation
    return wl


def chromium() -> str | None:
    """The Chromium (or Chrome) binary on PATH, if any."""
    import shutil

    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def write_yaml(path: Path, data) -> Path:
    import yaml

    path = Path(path)
    path.write_text(yaml.safe_dump(data))
    return path


def one_line_error(capsys) -> str:
    """What the command printed on stderr, checked to be one line without a traceback."""
    err = capsys.readouterr().err.strip()
    assert err and "\n" not in err and "Traceback" not in err, err
    return err


@contextmanager
def torch_threads(n: int):
    """torch with `n` threads inside the block (the executor's outputs do not depend on it; a
    shared 2-core machine makes multi-threaded torch collapse under contention)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
