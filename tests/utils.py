"""Factories and checks the test modules share (imported as `tests.utils`)."""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace


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


def poisson(rate_per_s: float) -> dict:
    """An open-loop `arrival:` section at `rate_per_s` requests per second."""
    return {"type": "poisson", "rate": rate_per_s}


def _lengths(tokens: int | tuple[int, int]) -> dict:
    if isinstance(tokens, tuple):
        low, high = tokens
        return {"type": "uniform", "low": low, "high": high}
    return {"type": "fixed", "value": tokens}


def requests_section(
    count: int, prompt_tokens: int | tuple[int, int], output_tokens: int | tuple[int, int], arrival: dict | None = None
) -> dict:
    """A workload's `requests:` section: `count` requests whose prompt and output lengths are
    fixed (an int) or uniform over (low, high), all arriving at t = 0 unless `arrival` says
    otherwise (poisson(rate) gives an open loop)."""
    return {
        "count": count,
        "arrival": arrival or {"type": "burst"},
        "prompt_tokens": _lengths(prompt_tokens),
        "output_tokens": _lengths(output_tokens),
    }


def fixed_lengths_spec(
    model: str,
    *,
    count: int,
    prompt_tokens: int,
    output_tokens: int,
    profile: str = "a100-80gb-pcie",
    arrival: dict | None = None,
    **sections,
):
    """`count` requests of fixed prompt and output lengths, all arriving at t = 0 unless
    `arrival` says otherwise, on `model` and the hardware `profile`; `sections` are further
    top-level workload fields (name, seed, serving, speculation, offload)."""
    from infersim.simulator.workload.schema import WorkloadSpec

    return WorkloadSpec.model_validate(
        {
            "model": model,
            "hardware": {"profile": profile},
            "requests": requests_section(count, prompt_tokens, output_tokens, arrival),
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
    wl = {
        "name": name,
        "model": "zoo-target",
        "hardware": {"profile": "a100-80gb-pcie"},
        "serving": {"max_batch_size": max_batch_size},
        "requests": requests_section(count, (20, 60), output_tokens, poisson(rate)),
        "seed": seed,
    }
    if speculation is not None:
        wl["speculation"] = speculation
    return wl


def llama_spec(name: str, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int, vocab: int):
    """A Llama-family ModelSpec of the given shape, built in code (no catalog entry)."""
    from infersim.simulator.models.spec import ModelSpec

    return ModelSpec(
        name=name,
        family="llama",
        source="test",
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
    )


def memory_options(**fields):
    """MemoryOptions for plan_memory: 16-token fp16 blocks, TP 1, 90% of the GPU, 4 GB of swap,
    4096 batched tokens and 256 sequences, unless `fields` say otherwise."""
    from infersim.simulator.engine.memory import MemoryOptions

    base = {
        "block_size": 16,
        "dtype": "fp16",
        "kv_dtype": "fp16",
        "tp": 1,
        "gpu_memory_utilization": 0.9,
        "swap_space_gb": 4.0,
        "max_batched_tokens": 4096,
        "max_batch_size": 256,
    }
    return MemoryOptions(**{**base, **fields})


class Seq(SimpleNamespace):
    """A sequence as the scheduling policies see it, built by hand."""

    @property
    def num_tokens(self):
        return self.prompt_len + self.generated


def seq(rid, prompt, generated=0, arrival=0.0, gpu=0, cpu=0, computed=None) -> Seq:
    """Sequence `rid` with a `prompt`-token prompt and `generated` tokens out, holding `gpu` and
    `cpu` KV blocks; its KV is computed up to the last token (nothing before its first step)."""
    n = prompt + generated
    return Seq(
        rid=rid,
        prompt_len=prompt,
        generated=generated,
        arrival_s=arrival,
        first_enqueue_s=arrival,
        computed=(n - 1 if generated else 0) if computed is None else computed,
        num_gpu_blocks=gpu,
        num_cpu_blocks=cpu,
    )


def scheduler_state(cost_model, **fields):
    """A SchedulerState with empty queues at t = 0, 16-token blocks and default limits; `fields`
    set the pool sizes and whatever else differs."""
    from infersim.simulator.policies import SchedulerLimits, SchedulerState

    base = {
        "now_s": 0.0,
        "waiting": [],
        "running": [],
        "swapped": [],
        "block_size": 16,
        "limits": SchedulerLimits(),
        "cost_model": cost_model,
    }
    return SchedulerState(**{**base, **fields})


def folder_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder`, keyed by its path relative to it."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


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
