"""One decision path: the simulator's replica and the real executor's engine carry out a
scheduler's decisions through the same code (infersim.simulator.engine.decision), so every
preemption policy, `swap_tail` included, gives the same schedule and the same counts in both
when they serve the same requests with the same KV pools.

The executor runs the zoo's trained target model (built once, cached; see
test_executor_zoo.py). Both engines price cost-aware preemption with the same fixed cost model,
so the policies see identical states; the iteration times differ (simulated vs measured) but
no decision depends on them, as every request arrives at 0."""

import numpy as np
import pytest

import infersim.executor  # noqa: F401  (before torch: OpenMP threads wait passively)

torch = pytest.importorskip("torch")

from infersim.executor.engine import Engine, ExecSequence  # noqa: E402
from infersim.executor.kvcache import KVCacheConfig  # noqa: E402
from infersim.executor.prompts import make_prompts  # noqa: E402
from infersim.simulator.costmodel import COST_MODELS, CostModel  # noqa: E402
from infersim.simulator.metrics.collector import SERIES_COLUMNS, MetricsCollector  # noqa: E402
from infersim.simulator.policies import build_scheduler  # noqa: E402
from infersim.simulator.policies.preemption import PREEMPTION_POLICIES  # noqa: E402
from infersim.simulator.simulation import Simulation  # noqa: E402
from infersim.simulator.workload.requests import Requests  # noqa: E402
from infersim.simulator.workload.schema import WorkloadSpec  # noqa: E402
from tests.utils import requests_section  # noqa: E402

PROMPT_LENS = [23, 150, 7, 64, 101, 40, 12, 88, 130, 55, 31, 76]
OUTPUT_LENS = [30, 12, 41, 25, 18, 36, 9, 28, 15, 33, 22, 40]
# a CPU pool too small for every victim: the swap-only policies stall and fall back to recompute
GPU_BLOCKS, CPU_BLOCKS = 16, 6
# the columns of one iteration that are not times: batch size and tokens, blocks, queues, bytes swapped
SCHEDULE_COLUMNS = [SERIES_COLUMNS.index(c) for c in SERIES_COLUMNS if not c.endswith("_s")]
COUNTERS = (
    "preempt_swap",
    "preempt_recompute",
    "preempt_recompute_forced",
    "swap_out_bytes",
    "swap_in_bytes",
    "aborted",
)


class FixedCost(CostModel):
    """1 ms + 0.1 ms per token an iteration, 5 GB/s over the host link; deaf to measurements."""

    name = "fixed_for_decision_test"
    from_workload = True  # the workloads of this test name it

    def __init__(self, *_, **__):
        pass

    def iteration_time_s(self, batch) -> float:
        return 1e-3 + 1e-4 * float(np.sum(batch.query_tokens))

    def transfer_time_s(self, nbytes, direction) -> float:
        return float(nbytes) / 5e9

    def kv_transfer_time_s(self, nbytes, direction, copies=1) -> float:
        return self.transfer_time_s(nbytes, direction)

    def observe_iteration(self, tokens, seconds) -> None:
        pass

    def observe_transfer(self, nbytes, seconds, direction) -> None:
        pass


@pytest.fixture(scope="module", autouse=True)
def fixed_cost_registered():
    """The test's cost model, registered by name for this module only (the registry is global)."""
    COST_MODELS.register(FixedCost.name)(FixedCost)
    yield
    COST_MODELS.unregister(FixedCost.name)


def simulate(preemption: str) -> Simulation:
    spec = WorkloadSpec.model_validate(
        {
            "name": "decision-path",
            "model": "zoo-target",
            "hardware": {"profile": "a100-80gb-pcie"},
            "serving": {
                "gpu_blocks": GPU_BLOCKS,
                "cpu_blocks": CPU_BLOCKS,
                "block_size": 16,
                "dtype": "fp32",
                "preemption": preemption,
                "cost_model": "fixed_for_decision_test",
            },
            "requests": requests_section(len(PROMPT_LENS), 1, 1),
        }
    )
    requests = Requests(np.array(PROMPT_LENS), np.array(OUTPUT_LENS), np.zeros(len(PROMPT_LENS)))
    sim = Simulation(spec, requests, step_mode=True)  # one series row per iteration, as the executor's
    sim.run()
    return sim


def execute(target, preemption: str, sim: Simulation) -> Engine:
    metrics = MetricsCollector(len(PROMPT_LENS))
    engine = Engine(
        target,
        build_scheduler("fcfs", preemption),
        KVCacheConfig(GPU_BLOCKS, 16, CPU_BLOCKS),
        limits=sim.limits,
        metrics=metrics,
        cost_model=FixedCost(),
        realtime=False,
    )
    prompts = make_prompts(PROMPT_LENS, tokenizer=target.tokenizer, vocab_size=target.vocab_size, seed=11)
    for i, (p, o) in enumerate(zip(prompts, OUTPUT_LENS)):
        engine.submit(ExecSequence(i, p, o, 0.0))
    engine.run()
    return engine


@pytest.mark.parametrize("preemption", PREEMPTION_POLICIES.names())
def test_both_engines_carry_out_the_same_decisions(zoo_target, preemption):
    sim = simulate(preemption)
    engine = execute(zoo_target, preemption, sim)
    assert engine.cache.bytes_per_block == sim.memory.kv_bytes_per_block
    ran, real = sim.metrics, engine.metrics
    assert {c: real.counters[c] for c in COUNTERS} == {c: ran.counters[c] for c in COUNTERS}
    np.testing.assert_array_equal(real.close_series()[:, SCHEDULE_COLUMNS], ran.close_series()[:, SCHEDULE_COLUMNS])
    for col in ("preempt_swap", "preempt_recompute"):  # the same victims, as often
        np.testing.assert_array_equal(real.requests_table()[col], ran.requests_table()[col])
    # the schedule preempted, and the swap-only policies fell back to recompute: the case the
    # executor once counted apart (it read the policy's name, not its swap_only flag)
    c = ran.counters
    assert c["preempt_recompute"] > 0 and (c["preempt_swap"] > 0) == (preemption != "recompute")
    swap_only = PREEMPTION_POLICIES.get(preemption).swap_only
    assert (c["preempt_recompute_forced"] > 0) == swap_only
    assert c["preempt_recompute_forced"] == (c["preempt_recompute"] if swap_only else 0)
