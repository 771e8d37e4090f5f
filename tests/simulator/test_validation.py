"""The shared input rules (simulator/validation.py) against hand-worked cases."""

from __future__ import annotations

import math

import pytest

from infersim.simulator.errors import InfersimError
from infersim.simulator.models.spec import ModelSpec
from infersim.simulator.validation import (
    BASE_BYTES,
    BYTES_PER_REPLICA,
    BYTES_PER_REQUEST,
    MAX_SEED,
    arrivals_notice,
    check_memory,
    check_seed,
    check_tensor_parallel,
    expected_requests,
    finite_positive,
    simulation_bytes,
    whole_number,
)
from infersim.simulator.workload.schema import WorkloadSpec
from tests.utils import llama_spec, requests_section


def _model(heads: int, kv_heads: int) -> ModelSpec:
    return llama_spec("m", 2, 64 * heads, heads, kv_heads, 128, 100)


@pytest.mark.parametrize(
    "heads,kv,tp,ok",
    [
        (32, 32, 1, True),
        (32, 32, 2, True),
        (32, 32, 3, False),
        (64, 64, 3, False),
        (64, 8, 8, True),  # KV heads split evenly, one per GPU
        (64, 8, 16, True),  # 16 % 8 == 0: each KV head replicated on two GPUs
        (24, 6, 4, False),  # 6 % 4 and 4 % 6 are both non-zero
        (32, 8, 32, True),  # 32 % 8 == 0
    ],
)
def test_tensor_parallel_rule(heads, kv, tp, ok):
    model = _model(heads, kv)
    if ok:
        assert check_tensor_parallel(model, tp) == tp
    else:
        with pytest.raises(InfersimError, match="hardware.tensor_parallel"):
            check_tensor_parallel(model, tp, source="w.yaml")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0, -1.0, True, "3"])
def test_finite_positive_refuses(value):
    with pytest.raises(InfersimError, match="--rate: expected a finite number > 0"):
        finite_positive(value, "--rate")


def test_seed_range():
    assert check_seed(0) == 0 and check_seed(MAX_SEED) == MAX_SEED
    for bad in (-1, MAX_SEED + 1, 1.5):
        with pytest.raises(InfersimError, match="seed"):
            check_seed(bad, "--seed")


def test_whole_number_reads_scientific_counts():
    assert whole_number("1e12") == 10**12 and whole_number("1_000") == 1000 and whole_number(1000.0) == 1000
    assert whole_number("ten") == "ten" and whole_number(1.5) == 1.5


def test_memory_estimate_by_hand():
    # 1e9 requests on 3 replicas: 256 MiB + 512 B x 1e9 + 4096 B x 3, twice for two workers
    assert simulation_bytes(1e9, parallel=2, replicas=3) == 2 * (
        BASE_BYTES + BYTES_PER_REQUEST * 1e9 + BYTES_PER_REPLICA * 3
    )
    with pytest.raises(InfersimError, match=r"about 512 TB of memory.*--no-memory-check"):
        check_memory(simulation_bytes(1e12), "w.yaml: field 'requests.count': 1e12 requests")
    check_memory(simulation_bytes(1e12), "allowed", allow=True)  # the override
    check_memory(simulation_bytes(100), "small")


def _spec(**requests) -> WorkloadSpec:
    base = {
        "arrival": {"type": "poisson", "rate": 5.0},
        "prompt_tokens": {"type": "fixed", "value": 4},
        "output_tokens": {"type": "fixed", "value": 4},
    }
    return WorkloadSpec.model_validate({"requests": {**base, **requests}})


def test_count_and_duration_rule():
    assert expected_requests(_spec(count=100)) == 100
    assert expected_requests(_spec(duration_s=10)) == 50  # rate x duration
    assert expected_requests(_spec(count=100, duration_s=10)) == 50  # whichever ends first
    both = _spec(count=100, duration_s=10)
    assert "ended arrivals after 47 of the 100 requests" in arrivals_notice(both, 47)
    assert arrivals_notice(both, 100) is None
    assert arrivals_notice(_spec(count=100), 100) is None and arrivals_notice(_spec(duration_s=10), 47) is None


def test_schema_refuses_non_finite_and_reads_1e12():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="finite"):
        _spec(count=5, arrival={"type": "poisson", "rate": math.inf})
    with pytest.raises(ValidationError):
        WorkloadSpec.model_validate(
            {
                "seed": -1,
                "requests": requests_section(1, 1, 1),
            }
        )
    assert _spec(count="1e12").requests.count == 10**12


def test_max_model_len_past_the_models_context_is_refused():
    """Llama-3-8B was trained on 8,192 positions: serving 32k-token prompts on it is refused in
    one line (as vLLM refuses it); Llama-3.1-8B's 131,072 accepts it, and 8,192 itself is fine."""
    from infersim.simulator.preflight import check_workload
    from tests.utils import fixed_lengths_spec

    def spec(model: str, max_model_len: int):
        return fixed_lengths_spec(
            model,
            count=4,
            prompt_tokens=100,
            output_tokens=10,
            profile="h100-sxm",
            serving={"max_model_len": max_model_len},
        )

    with pytest.raises(InfersimError) as exc:
        check_workload(spec("llama-3-8b", 32768), "chat.yaml")
    assert str(exc.value) == (
        "chat.yaml: field 'serving.max_model_len': 32,768 is longer than llama-3-8b's context of 8,192 tokens; "
        "lower it or leave it out"
    )
    check_workload(spec("llama-3-8b", 8192), "chat.yaml")
    check_workload(spec("llama-3.1-8b", 32768), "chat.yaml")


@pytest.mark.parametrize("cpus,most", [(1, 2), (2, 2), (16, 16)])
def test_threads_run_from_one_to_the_machines_cpus(monkeypatch, cpus, most):
    """At least 2 allowed, the profiler's default, even on one CPU."""
    from infersim.simulator.validation import check_threads

    monkeypatch.setattr("infersim.simulator.validation.usable_cpus", lambda: cpus)
    assert check_threads(1) == 1 and check_threads(most) == most and check_threads(0, zero_ok=True) == 0
    for bad, zero_ok in ((most + 1, False), (0, False), (-1, True), (True, False)):
        with pytest.raises(
            InfersimError, match=rf"^--threads: expected a whole number from {int(not zero_ok)} to {most} "
        ):
            check_threads(bad, zero_ok=zero_ok)
