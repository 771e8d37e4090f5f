"""The validation matrix: each case is a workload, a policy configuration, an executor mode
(which real execution it needs and which recorded statistics feed the simulator) and what to
compare. The small matrix (`small=True`) runs in the test suite; `matrix.py` runs them all."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from infersim.simulator.errors import UnknownNameError
from infersim.simulator.workload.schema import WorkloadSpec

# what a case compares, beyond the latency/throughput metrics every case has
COMPARE = ("latency", "preemption", "swap", "recompute", "acceptance", "offload", "prefix")


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    mode: str  # analysis.validate.modes.MODES name
    workload: dict  # a WorkloadSpec without model (the validated model is filled in)
    compare: tuple[str, ...] = ("latency",)
    small: bool = False  # part of the small matrix the test suite runs
    why: str = ""

    def spec(self, model: str, seed: int | None = None, requests: int | None = None):
        d = copy.deepcopy(self.workload)
        d["name"] = self.name
        d["model"] = model
        d.setdefault("serving", {}).setdefault("dtype", "fp32")
        if seed is not None:
            d["seed"] = seed
        if requests is not None:
            d["requests"]["count"] = int(requests)
        return WorkloadSpec.model_validate(d)


_LOAD = {
    "prompt_tokens": {"type": "uniform", "low": 16, "high": 320},
    "output_tokens": {"type": "uniform", "low": 8, "high": 128},
}
_PRESSURE = {
    "prompt_tokens": {"type": "uniform", "low": 24, "high": 192},
    "output_tokens": {"type": "uniform", "low": 24, "high": 128},
}


def _pressure(preemption: str, cpu_blocks: int = 256) -> dict:
    # 80 blocks of 16 tokens hold about six sequences' whole KV: decoding grows past the pool
    return {
        "serving": {"max_batch_size": 16, "gpu_blocks": 80, "cpu_blocks": cpu_blocks, "preemption": preemption},
        "requests": {"count": 48, "arrival": {"type": "poisson", "rate": 300.0}, **_PRESSURE},
    }


_SPEC_REQ = {
    "count": 32,
    "arrival": {"type": "poisson", "rate": 100.0},
    "prompt_tokens": {"type": "uniform", "low": 16, "high": 160},
    "output_tokens": {"type": "uniform", "low": 32, "high": 96},
}

CASES: dict[str, Case] = {}


def _register(case: Case) -> None:
    CASES[case.name] = case


_register(
    Case(
        "plain-load",
        "Plain decoding under load",
        "plain",
        {
            "serving": {"max_batch_size": 32, "gpu_blocks": 1024, "cpu_blocks": 0},
            "requests": {"count": 96, "arrival": {"type": "poisson", "rate": 250.0}, **_LOAD},
        },
        ("latency",),
        small=True,
        why="continuous batching with a queue: batch sizes up to 32, mixed prefill and decode",
    )
)
_register(
    Case(
        "preempt-recompute",
        "Recompute preemption under memory pressure",
        "plain",
        _pressure("recompute", cpu_blocks=0),
        ("latency", "preemption", "recompute"),
        small=True,
        why="the KV pool is too small for the batch: sequences are evicted and prefilled again",
    )
)
_register(
    Case(
        "preempt-swap",
        "Swap preemption under memory pressure",
        "plain",
        _pressure("swap"),
        ("latency", "preemption", "swap"),
        why="evicted sequences' KV is copied to host blocks and back",
    )
)
_register(
    Case(
        "preempt-cost-aware",
        "Cost-aware preemption under memory pressure",
        "plain",
        _pressure("cost_aware"),
        ("latency", "preemption", "swap", "recompute"),
        why="each eviction picks swap or recompute by predicted cost (AdaptiveLLM 3.3)",
    )
)
_register(
    Case(
        "spec-draft",
        "One-draft speculative decoding",
        "speculative",
        {
            "serving": {"max_batch_size": 8, "gpu_blocks": 512},
            "requests": copy.deepcopy(_SPEC_REQ),
            "speculation": {
                "method": "draft",
                "speculation_length": 4,
                "sampling": {"mode": "greedy"},
                "drafts": [{"model": "zoo-draft-a", "acceptance": {"kind": "iid", "alpha": 0.5}}],
            },
        },
        ("latency", "acceptance"),
        small=True,
        why="acceptance measured by the real run replaces the catalog's",
    )
)
for _name, _title, _over in (
    (
        "minions-voting",
        "Minions: majority voting over three drafts",
        {"selector": {"enabled": False}, "pipeline": {"enabled": False}},
    ),
    (
        "minions-adaptive",
        "Minions: adaptive speculation length",
        {"voting": {"enabled": False}, "pipeline": {"enabled": False}},
    ),
    (
        "minions-pipeline",
        "Minions: draft/verify pipeline",
        {"voting": {"enabled": False}, "selector": {"enabled": False}},
    ),
):
    _register(
        Case(
            _name,
            _title,
            "minions",
            {
                "serving": {"max_batch_size": 16, "gpu_blocks": 512},
                "requests": copy.deepcopy(_SPEC_REQ),
                "speculation": {
                    "method": "minions",
                    "speculation_length": 4,
                    "drafts": [{"model": f"zoo-draft-{x}", "acceptance": {"kind": "iid", "alpha": 0.5}} for x in "abc"],
                    **_over,
                },
            },
            ("latency", "acceptance"),
        )
    )
_register(
    Case(
        "medusa-tree",
        "Medusa heads with a token tree",
        "medusa",
        {
            "serving": {"max_batch_size": 4, "gpu_blocks": 512},
            "requests": copy.deepcopy(_SPEC_REQ),
            "speculation": {
                "method": "medusa",
                "sampling": {"mode": "greedy"},
                "medusa": {"tree": {"type": "choices"}},
            },
        },
        ("latency", "acceptance"),
        why="head accuracies measured by the real heads feed the simulator's tree model",
    )
)
_register(
    Case(
        "prefix-multiturn",
        "Prefix caching over multi-turn conversations",
        "plain",
        {
            "serving": {"max_batch_size": 32, "gpu_blocks": 1024, "cpu_blocks": 0, "prefix_caching": True},
            "requests": {
                "count": 96,
                "arrival": {"type": "poisson", "rate": 5.0},
                "prompt_tokens": {"type": "uniform", "low": 16, "high": 64},
                "output_tokens": {"type": "uniform", "low": 16, "high": 48},
                # 32 conversations of 3 turns after a 64-token system prompt; a turn arrives 4.7 s
                # or more after the previous turn of its conversation (6.4 s on average), which has
                # finished by then in both engines even on a busy CPU, so which blocks a turn finds
                # cached does not hang on timing (a busy 2-core CPU can take 3 s a request)
                "sharing": {"conversations": 32, "system_prompt_tokens": 64, "max_turns": 3},
            },
        },
        ("latency", "prefix"),
        why="a turn's prefill skips the blocks its conversation and the system prompt left cached",
    )
)
for _policy, _title in (
    ("full", "full KV load (FlexGen)"),
    ("h2o", "H2O heavy hitters"),
    ("infinigen", "InfiniGen speculative prefetch"),
):
    _register(
        Case(
            f"offload-{_policy}",
            f"KV offload: {_title}",
            "offload",
            {
                "serving": {"max_batch_size": 8},
                "requests": {
                    "count": 16,
                    "arrival": {"type": "poisson", "rate": 50.0},
                    "prompt_tokens": {"type": "uniform", "low": 256, "high": 768},
                    "output_tokens": {"type": "fixed", "value": 64},
                },
                # overlap none: the CPU executor (one torch thread) runs each copy in line with the compute,
                # so the simulator's pipeline must be the sequential one; on CUDA ffn/layer overlap
                "offload": {"policy": _policy, "overlap": "none"},
            },
            ("latency", "offload"),
            why="sparsity recorded by the real attention feeds the simulator's fetch sizes",
        )
    )


def get_case(name: str) -> Case:
    if name not in CASES:
        raise UnknownNameError("validation case", name, list(CASES))
    return CASES[name]


def small_matrix() -> list[Case]:
    return [c for c in CASES.values() if c.small]


def case_from_spec(spec) -> Case:
    """An ad-hoc case for a user's workload: the executor mode its sections need, and the
    comparisons its preemption policy makes meaningful."""
    mode = "plain"
    if spec.speculation is not None:
        mode = {"draft": "speculative", "minions": "minions", "medusa": "medusa"}[spec.speculation.method]
    elif spec.offload is not None:
        mode = "offload"
    compare = ["latency", "preemption"]
    if spec.serving.preemption in ("swap", "cost_aware"):
        compare.append("swap")
    if spec.serving.preemption in ("recompute", "cost_aware"):
        compare.append("recompute")
    if spec.speculation is not None:
        compare.append("acceptance")
    return Case(
        spec.name, spec.description or spec.name, mode, spec.model_dump(mode="json", exclude_none=True), tuple(compare)
    )
