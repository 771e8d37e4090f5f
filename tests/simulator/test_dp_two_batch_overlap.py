"""Two-batch overlap of data-parallel attention (`hardware.two_batch_overlap`), checked against
the formula worked out by hand from the cost model's parts: each micro-batch's own work priced
at its own token count, the group's experts on its copies, its dispatch and combine. DeepSeek-V3
in fp8 at EP 16 on two nodes of H100s (datasheet roofline): decode at 32 sequences per rank costs
more with the option (the weights are read twice), at 256 it costs less; 2,048 prompt tokens per
rank hide their compute behind the all-to-alls across two nodes, and on one node of H200s at EP 8
hide nearly all their all-to-all time behind the compute."""

from __future__ import annotations

import numpy as np
import pytest

from infersim.simulator.costmodel import BatchShape
from infersim.simulator.errors import InfersimError
from infersim.simulator.workload.schema import WorkloadSpec
from infersim.simulator.yamlio import validate
from tests.simulator.test_dp_attention import build, dp_spec
from tests.simulator.test_dp_lockstep import _skewed, run

SPARSE, DENSE = 58, 3  # DeepSeek-V3's layers


def models(ep: int = 16, **hardware):
    """The cost models without and with the option."""
    return build(dp_spec(ep, **hardware)).cost_model, build(dp_spec(ep, two_batch_overlap=True, **hardware)).cost_model


def parts(cm, batch: BatchShape):
    """(first, last, dense layer, a sparse layer's own work) of `batch` on one rank, from the cost
    model's operator times (no routed experts)."""
    first, last, layer = cm.model_parts_s(batch.totals(), np.zeros(1))
    own = {k: float(v[0]) for k, v in layer.items()}
    return (
        float(np.ravel(first)[0]),
        float(np.ravel(last)[0]),
        own["every"] + own["dense"],
        own["every"] + own["sparse"],
    )


def overlapped_by_hand(cm, batch_of, tokens: int, ep: int = 16) -> tuple[float, float]:
    """(step with two-batch overlap, the step's all-to-all time without it) for every one of the
    `ep` ranks running `batch_of(tokens)`: the halves floor(T/2) and the rest, each rank's peers
    alike."""
    a2a, experts = cm.all_to_all, cm.group_experts
    first, last, _, _ = parts(cm, batch_of(tokens))
    dense = sparse = comm = 0.0
    for h in (tokens // 2, tokens - tokens // 2):
        _, _, d, s = parts(cm, batch_of(h))
        dense += d
        sparse += s + float(experts.expert_time_s(ep * h))
        comm += float(a2a.dispatch_time_s(h) + a2a.combine_time_s(h))
    exposed = float(a2a.dispatch_time_s(tokens // 2) + a2a.combine_time_s(tokens - tokens // 2))
    step = first + last + DENSE * dense + SPARSE * max(sparse, comm) + exposed
    return step, SPARSE * float(a2a.dispatch_time_s(tokens) + a2a.combine_time_s(tokens))


def decode(contexts: int):
    return lambda n: BatchShape.decode([contexts] * n)


def prefill(n: int) -> BatchShape:
    """Prompts of 128 tokens, n / 128 of them."""
    return BatchShape.of([128] * (n // 128), [0] * (n // 128))


@pytest.mark.parametrize("tokens", [32, 256, 33])
def test_a_decode_step_is_the_overlap_formula_by_hand(tokens):
    plain, tbo = models()
    hand, _ = overlapped_by_hand(tbo, decode(2000), tokens)
    assert tbo.iteration_time_s(BatchShape.decode([2000] * tokens)) == pytest.approx(hand, rel=1e-12)
    # the plain step is untouched by the option's code path
    got = plain.iteration_time_s(BatchShape.decode([2000] * tokens))
    first, last, dense, own = parts(plain, BatchShape.decode([2000] * tokens))
    a2a = plain.all_to_all
    routed = a2a.dispatch_time_s(tokens) + plain.group_experts.expert_time_s(16 * tokens) + a2a.combine_time_s(tokens)
    assert got == pytest.approx(first + last + DENSE * dense + SPARSE * (own + float(routed)), rel=1e-12)


def test_deepseek_v3_decode_loses_at_32_per_rank_and_gains_at_256():
    """At 32 sequences of 800 tokens per rank a step is mostly weight reads: splitting reads the
    rank's attention and shared weights and its GPU's touched experts twice: the step grows by
    13.0 ms (22.57 -> 35.55 ms) where the all-to-alls it could hide take 3.8 ms (latency
    included). At 256
    sequences of 2,000 tokens the all-to-alls take 26.4 ms of the 64.04 ms step and the overlap
    saves 9.4 ms (54.64 ms)."""
    plain, tbo = models()
    small = BatchShape.decode([800] * 32)
    large = BatchShape.decode([2000] * 256)
    assert round(plain.iteration_time_s(small) * 1e3, 2) == 22.57
    assert round(tbo.iteration_time_s(small) * 1e3, 2) == 35.55
    assert round(plain.iteration_time_s(large) * 1e3, 2) == 64.04
    assert round(tbo.iteration_time_s(large) * 1e3, 2) == 54.64
    _, comm_small = overlapped_by_hand(tbo, decode(800), 32)
    _, comm_large = overlapped_by_hand(tbo, decode(2000), 256)
    assert round(comm_small * 1e3, 1) == 3.8 and round(comm_large * 1e3, 1) == 26.4


def test_on_nvlink_a_prefill_hides_nearly_all_its_all_to_alls():
    """EP 8 in one node of H200s, 2,048 prompt tokens per rank (16 prompts of 128): compute
    dominates (95.6 ms against 41.3 ms of all-to-alls over NVLink) and halving the compute-bound
    GEMMs costs little, so the overlap saves 97% of the all-to-all time: all but one dispatch, one
    combine and the extra weight reads."""
    plain, tbo = models(8, profile="h200:datasheet")
    step = tbo.iteration_time_s(prefill(2048))
    hand, comm = overlapped_by_hand(tbo, prefill, 2048, ep=8)
    assert step == pytest.approx(hand, rel=1e-12)
    gain = plain.iteration_time_s(prefill(2048)) - step
    assert round(comm * 1e3, 1) == 41.3 and round(gain / comm, 2) == 0.97


def test_across_nodes_a_prefill_hides_its_compute_behind_the_all_to_alls():
    """EP 16 over two nodes, the same prompts: 4 of each token's 8 copies cross the 50 GB/s
    adapter, 207.1 ms of all-to-alls in a 312.8 ms step. Communication dominates, so the
    overlapped step is about the all-to-alls alone (216.2 ms) and the gain is 91% of the compute
    it hides."""
    plain, tbo = models()
    hand, comm = overlapped_by_hand(tbo, prefill, 2048)
    before, step = plain.iteration_time_s(prefill(2048)), tbo.iteration_time_s(prefill(2048))
    assert step == pytest.approx(hand, rel=1e-12)
    assert (round(comm * 1e3, 1), round(before * 1e3, 1), round(step * 1e3, 1)) == (207.1, 312.8, 216.2)
    assert round((before - step) / (before - comm), 2) == 0.91


def test_a_rank_of_one_token_keeps_the_whole_group_unsplit():
    """SGLang cannot split a batch of one sequence and agrees on the overlap across the ranks:
    the group then steps as without the option. A rank in a dummy pass does not stop it."""
    plain, tbo = models()
    one, busy = BatchShape.decode([800]), BatchShape.decode([800] * 256)
    assert tbo.group_iteration_time_s([one] + [busy] * 15) == plain.group_iteration_time_s([one] + [busy] * 15)
    assert tbo.iteration_time_s(one) == plain.iteration_time_s(one)
    with_idle = [None] + [busy] * 15
    assert tbo.group_iteration_time_s(with_idle) < plain.group_iteration_time_s(with_idle)


@pytest.mark.parametrize("mode", [True, "auto"])
def test_decode_stretches_equal_single_steps_with_the_option(mode):
    tbo = build(dp_spec(16, two_batch_overlap=mode)).cost_model
    contexts = [[800 + i for i in range(32)], None] + [[900] * 3] * 14
    steps = tbo.group_decode_step_times_s(contexts, 4)
    for k in range(4):
        shapes = [None if c is None else BatchShape.decode([x + k for x in c]) for c in contexts]
        assert steps[k] == tbo.group_iteration_time_s(shapes)


def test_the_option_needs_data_parallel_attention_in_one_line():
    spec = dp_spec(
        1,
        replicas=1,
        data_parallel_attention=False,
        two_batch_overlap=True,
        tensor_parallel=8,
        profile="h200:datasheet",
    )
    with pytest.raises(InfersimError) as err:
        build(spec)
    msg = str(err.value)
    assert "field 'hardware.two_batch_overlap'" in msg and "data_parallel_attention" in msg and "\n" not in msg


def test_serving_with_the_option_is_deterministic_and_jumps_as_it_steps():
    spec = _skewed(chunked_prefill=True, max_batched_tokens=512)
    spec = spec.model_copy(update={"hardware": spec.hardware.model_copy(update={"two_batch_overlap": True})})
    (sim, a), (_, b), (_, c) = run(spec), run(spec), run(spec, step_mode=True)
    assert sim.cost_model.two_batch_overlap
    for col in a.requests:
        assert np.array_equal(a.requests[col], b.requests[col], equal_nan=True), col
        assert np.array_equal(a.requests[col], c.requests[col], equal_nan=True), col
    assert np.array_equal(a.series, b.series)
    assert sim.resolved()["parallel"]["data_parallel_attention"]["two_batch_overlap"] is True


def test_auto_splits_only_the_steps_it_makes_shorter():
    """`two_batch_overlap: auto` prices each group step both ways and runs the shorter: at 32
    sequences of 800 per rank the plain step (22.57 ms, datasheet) against the split's 35.55; at
    256 of 2,000 the split's 54.64 against 64.04; a prefill of 2,048 tokens per rank, 216.2
    against 312.8."""
    plain, tbo = models()
    auto = build(dp_spec(16, two_batch_overlap="auto")).cost_model
    for batch in (BatchShape.decode([800] * 32), BatchShape.decode([2000] * 256), prefill(2048)):
        want = min(plain.iteration_time_s(batch), tbo.iteration_time_s(batch))
        assert auto.iteration_time_s(batch) == want
    assert auto.iteration_time_s(BatchShape.decode([800] * 32)) == plain.iteration_time_s(BatchShape.decode([800] * 32))
    assert auto.iteration_time_s(prefill(2048)) == tbo.iteration_time_s(prefill(2048))


def test_auto_decides_per_group_step():
    """A group of 15 busy ranks (256 sequences) and one of 32: the group step is the slowest
    rank's either way, and auto takes the shorter of the two group steps."""
    plain, tbo = models()
    auto = build(dp_spec(16, two_batch_overlap="auto")).cost_model
    for shapes in (
        [BatchShape.decode([800] * 32)] * 16,
        [BatchShape.decode([800] * 32)] + [BatchShape.decode([2000] * 256)] * 15,
        [None] + [BatchShape.decode([2000] * 256)] * 15,
    ):
        want = min(plain.group_iteration_time_s(shapes), tbo.group_iteration_time_s(shapes))
        assert auto.group_iteration_time_s(shapes) == want


def test_auto_is_validated_and_reported():
    spec = _skewed(chunked_prefill=True, max_batched_tokens=512)
    spec = spec.model_copy(update={"hardware": spec.hardware.model_copy(update={"two_batch_overlap": "auto"})})
    (sim, a), (_, b) = run(spec), run(spec)
    for col in a.requests:
        assert np.array_equal(a.requests[col], b.requests[col], equal_nan=True), col
    assert sim.resolved()["parallel"]["data_parallel_attention"]["two_batch_overlap"] == "auto"
    data = spec.model_dump(mode="json")
    data["hardware"]["two_batch_overlap"] = "sometimes"
    with pytest.raises(InfersimError) as err:
        validate(WorkloadSpec, data, "w.yaml")
    assert "w.yaml" in str(err.value) and "hardware.two_batch_overlap" in str(err.value)
    assert "\n" not in str(err.value)
