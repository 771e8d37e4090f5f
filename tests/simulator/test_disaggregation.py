"""Prefill/decode disaggregation: hand-calculated transfer times (plain and layer-wise
streamed), decode admission waiting for decode-side blocks, blocks held on the prefill side
until the transfer ends, blocks conserved on both sides, the per-request phases adding up,
event mode equal to step mode, determinism, and one-line errors for bad sections."""

import re
from pathlib import Path

import numpy as np
import pytest

from infersim.cli.main import main
from infersim.simulator.costmodel import BatchShape
from infersim.simulator.errors import InfersimError
from infersim.simulator.preflight import check_workload
from infersim.simulator.simulation import Simulation, simulate
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import WorkloadSpec
from tests.utils import one_line_error, requests_section, small_workload_spec, write_yaml

LINK = {"bandwidth_gbps": 25.0, "latency_us": 10.0}
# llama-2-7b in fp16: K and V, 32 layers x 4096 values of 2 bytes per token
KV_BYTES_PER_TOKEN = 2 * 32 * 4096 * 2


def _one_request(prompt: int, output: int, streaming: bool = False, **pools) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {
            "model": "llama-2-7b",
            "hardware": {
                "profile": "a100-80gb-pcie",
                "disaggregated": {"link": LINK, "layerwise_streaming": streaming, **pools},
            },
            "requests": requests_section(1, prompt, output),
        }
    )


def _run(spec, step_mode=False):
    return simulate(spec, build_requests(spec, "."), step_mode=step_mode)


def _disaggregated(spec: WorkloadSpec, prefill=1, decode=1, streaming=False, **link) -> WorkloadSpec:
    data = spec.model_dump()
    data["hardware"]["disaggregated"] = {
        "prefill": {"replicas": prefill},
        "decode": {"replicas": decode, "router": "least_outstanding"},
        "link": {**LINK, **link},
        "layerwise_streaming": streaming,
    }
    return WorkloadSpec.model_validate(data)


def test_one_request_ttft_is_prefill_plus_transfer():
    spec = _one_request(1024, 8)
    res = _run(spec)
    sim_cost = Simulation(spec, build_requests(spec, ".")).deployment.pools["prefill"]["cost_model"]
    prefill_s = sim_cost.iteration_time_s(BatchShape(np.array([1024]), np.array([0]), np.array([1])))
    transfer_s = 10e-6 + 1024 * KV_BYTES_PER_TOKEN / 25e9  # 21.485 ms
    req = res.requests
    assert req["first_token_s"][0] == pytest.approx(prefill_s + transfer_s, rel=1e-12)
    assert req["transfer_s"][0] == pytest.approx(transfer_s, rel=1e-12)
    assert req["prefill_s"][0] == pytest.approx(prefill_s, rel=1e-12)
    assert req["transfer_wait_s"][0] == 0 and req["decode_queueing_s"][0] == 0
    assert res.extra["disaggregation"]["kv_transfer_bytes"] == 1024 * KV_BYTES_PER_TOKEN


def test_layerwise_streaming_exposes_one_layer_share():
    plain, streamed = _run(_one_request(1024, 8)), _run(_one_request(1024, 8, streaming=True))
    wire_s = 1024 * KV_BYTES_PER_TOKEN / 25e9
    prefill_s = plain.requests["prefill_s"][0]
    assert wire_s / 32 < prefill_s / 32  # the link keeps up with the layers: only the last share shows
    assert streamed.requests["transfer_s"][0] == pytest.approx(10e-6 + wire_s / 32, rel=1e-12)
    assert streamed.requests["first_token_s"][0] == pytest.approx(prefill_s + 10e-6 + wire_s / 32, rel=1e-12)
    assert streamed.extra["disaggregation"]["kv_transfers_streamed"] == 1


def test_streaming_over_a_slow_link_exposes_what_the_prefill_cannot_hide():
    spec = _one_request(1024, 8, streaming=True, link={"bandwidth_gbps": 1.0, "latency_us": 0.0})
    res = _run(spec)
    wire_s, prefill_s = 1024 * KV_BYTES_PER_TOKEN / 1e9, res.requests["prefill_s"][0]
    assert res.requests["transfer_s"][0] == pytest.approx(wire_s - 31 / 32 * prefill_s, rel=1e-12)


def test_one_token_request_finishes_on_the_prefill_replica():
    res = _run(_one_request(512, 1))
    assert res.requests["replica"][0] == 0 and np.isnan(res.requests["transfer_s"][0])
    assert res.extra["disaggregation"]["kv_transfers"] == 0


def test_prefill_blocks_are_held_until_the_transfer_ends():
    spec = _one_request(1024, 4, link={"bandwidth_gbps": 1.0, "latency_us": 0.0})
    sim = Simulation(spec, build_requests(spec, "."))
    dep = sim.deployment
    prefill, decode = dep.replicas["prefill"][0], dep.replicas["decode"][0]
    sim.env.process(sim._open_loop())
    for rep in sim.replicas:
        sim.env.process(rep.run())
    transfer_s = 1024 * KV_BYTES_PER_TOKEN / 1e9
    sim.env.run(until=0.2 + transfer_s / 2)  # the prefill (~0.07 s) is over, the transfer is not
    assert prefill.blocks.used_gpu == 1024 // 16  # still held by the KV on its way
    assert decode.blocks.used_gpu == -(-1025 // 16)  # taken before the transfer started
    sim.env.run()
    assert prefill.blocks.used_gpu == 0 and decode.blocks.used_gpu == 0


def test_decode_admission_waits_for_decode_blocks():
    base = small_workload_spec(gpu_blocks=48, cpu_blocks=0)
    data = base.model_dump()
    data["requests"] = {
        "count": 3,
        "arrival": {"type": "burst"},
        "prompt_tokens": {"type": "fixed", "value": 400},  # 26 blocks with its first token
        "output_tokens": {"type": "fixed", "value": 50},
    }
    spec = _disaggregated(WorkloadSpec.model_validate(data))
    res = _run(spec)
    req = res.requests
    assert (req["aborted"] == 0).all()
    order = np.argsort(req["transfer_start_s"])
    # one request's KV fits the 48-block decode pool at a time: each transfer starts when the last decode ends
    for a, b in zip(order, order[1:]):
        assert req["transfer_start_s"][b] == req["finish_s"][a]
        assert req["transfer_wait_s"][b] > 0


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("preemption,chunked", [("recompute", False), ("swap", False), ("recompute", True)])
def test_blocks_conserved_phases_add_up_and_event_equals_step(preemption, chunked, streaming):
    spec = _disaggregated(
        small_workload_spec(
            preemption=preemption, chunked_prefill=chunked, max_batched_tokens=256 if chunked else None
        ),
        prefill=1,
        decode=2,
        streaming=streaming,
        bandwidth_gbps=0.5,
    )
    requests = build_requests(spec, ".")
    sim = Simulation(spec, requests)
    a = sim.run()
    for rep in sim.replicas:
        assert rep.blocks.free_gpu == rep.blocks.total_gpu and rep.blocks.free_cpu == rep.blocks.total_cpu
    b = simulate(spec, build_requests(spec, "."), step_mode=True)
    for col in a.requests:
        assert np.array_equal(a.requests[col], b.requests[col], equal_nan=True), col
    req = a.requests
    ok = (req["aborted"] == 0) & (req["output_tokens"] > 1)
    assert ok.sum() > 40
    phases = ("prefill_s", "transfer_wait_s", "transfer_s", "decode_queueing_s", "decode_s")
    parts = (req["first_scheduled_s"] - req["arrival_s"]) + sum(req[c] for c in phases)
    np.testing.assert_allclose(parts[ok], (req["finish_s"] - req["arrival_s"])[ok], rtol=1e-9, atol=1e-12)
    assert set(np.unique(req["replica"][ok])) == {1, 2}  # both decode replicas served
    assert (req["prefill_replica"][ok] == 0).all()


def test_deterministic():
    spec = _disaggregated(small_workload_spec(), prefill=2, decode=1, streaming=True)
    a, b = _run(spec), _run(spec)
    for col in a.requests:
        assert np.array_equal(a.requests[col], b.requests[col], equal_nan=True), col


def test_pools_take_their_own_profile_and_parallelism():
    spec = _one_request(
        2048, 4, prefill={"replicas": 1, "tensor_parallel": 2, "profile": "h100-sxm"}, decode={"replicas": 1}
    )
    sim = Simulation(spec, build_requests(spec, "."))
    pools = sim.deployment.pools
    assert pools["prefill"]["hardware"].name == "h100-sxm" and pools["prefill"]["tensor_parallel"] == 2
    assert pools["decode"]["hardware"].name == "a100-80gb-pcie"
    res = sim.run()
    assert res.extra["disaggregation"]["pools"]["prefill"]["gpus"] == 2


def test_a_pool_whose_tensor_parallel_group_spans_nodes_all_reduces_over_the_network():
    """Llama-3-70B decode pool at TP 16 on 8-GPU H100 nodes: its all-reduces are those of a
    colocated TP 16 replica across two nodes (the node's all-reduce, two network hops, the ring
    over the adapters), not an NVSwitch all-reduce of 16; TP 8 stays inside a node."""
    pools = {"prefill": {"tensor_parallel": 8}, "decode": {"tensor_parallel": 16}}
    spec = WorkloadSpec.model_validate(
        {
            "model": "llama-3-70b",
            "hardware": {"profile": "h100-sxm", "disaggregated": pools},
            "serving": {"dtype": "bf16"},
            "requests": requests_section(1, 1024, 4),
        }
    )
    sim = Simulation(spec, build_requests(spec, "."))
    prefill, decode = (sim.deployment.pools[name]["cost_model"] for name in ("prefill", "decode"))
    assert not hasattr(prefill, "links") and decode.links.placement.tp_crosses_nodes
    colocated = WorkloadSpec.model_validate(
        {
            "model": "llama-3-70b",
            "hardware": {"profile": "h100-sxm", "tensor_parallel": 16},
            "serving": {"dtype": "bf16"},
            "requests": requests_section(1, 1024, 4),
        }
    )
    step = BatchShape.decode(np.full(8, 1024))
    expected = Simulation(colocated, build_requests(colocated, ".")).cost_model.iteration_time_s(step)
    assert decode.iteration_time_s(step) == expected
    assert sim.run().extra["disaggregation"]["pools"]["decode"]["gpus"] == 16


@pytest.mark.parametrize(
    "hardware, message",
    [
        (
            {
                "expert_parallel": 2,
                "disaggregated": {"prefill": {"tensor_parallel": 2}, "decode": {"tensor_parallel": 1}},
            },
            "must equal the tensor-parallel degree (hardware.disaggregated.decode.tensor_parallel 1)",
        ),
        (
            {"cluster": {"gpus_per_node": 12}, "disaggregated": {"decode": {"tensor_parallel": 16}}},
            "hardware.disaggregated.decode.tensor_parallel': tensor parallel 16 neither divides",
        ),
    ],
)
def test_pools_expert_parallelism_and_nodes_checked_per_pool(hardware, message):
    """Expert parallelism spreads experts over each pool's tensor-parallel group (Mixtral, EP 2:
    both pools at TP 2 run; a pool at TP 1 is named); a pool's group spanning nodes splits evenly
    over them and takes what a colocated group across nodes takes (a mixture of experts too)."""

    def spec(hardware):
        return WorkloadSpec.model_validate(
            {
                "model": "mixtral-8x7b",
                "hardware": {"profile": "h100-sxm", **hardware},
                "requests": requests_section(1, 64, 4),
            }
        )

    with pytest.raises(InfersimError, match=re.escape(message)):
        check_workload(spec(hardware), "wl.yaml")
    check_workload(spec({"disaggregated": {"decode": {"tensor_parallel": 16}}}), "wl.yaml")
    pools = {"prefill": {"tensor_parallel": 2}, "decode": {"tensor_parallel": 2}}
    both = spec({"expert_parallel": 2, "disaggregated": pools})
    check_workload(both, "wl.yaml")
    sim = Simulation(both, build_requests(both, "."))
    assert sim.deployment.pools["decode"]["cost_model"].ep == 2


@pytest.mark.parametrize(
    "hardware,extra,field",
    [
        ({"replicas": 2, "disaggregated": {}}, {}, "hardware"),
        ({"disaggregated": {"decode": {"profile": "no-such-gpu"}}}, {}, "hardware.disaggregated.decode.profile"),
        ({"disaggregated": {"prefill": {"tensor_parallel": 3}}}, {}, "hardware.disaggregated.prefill.tensor_parallel"),
        ({"disaggregated": {"link": {"bandwidth_gbps": 0}}}, {}, "hardware.disaggregated.link.bandwidth_gbps"),
        ({"disaggregated": {"decode": {"router": "nope"}}}, {}, "hardware.disaggregated.decode.router"),
        ({"disaggregated": {}}, {"offload": {"policy": "full"}}, "hardware.disaggregated"),
        ({"disaggregated": {}}, {"serving": {"prefix_caching": True}}, "hardware.disaggregated"),
    ],
)
def test_bad_sections_are_one_line_errors(tmp_path, capsys, hardware, extra, field):
    wl = write_yaml(
        tmp_path / "wl.yaml",
        {
            "model": "llama-2-7b",
            "hardware": hardware,
            "requests": requests_section(2, 10, 10),
            **extra,
        },
    )
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "out"), "--quiet"]) == 2
    err = one_line_error(capsys)
    assert "wl.yaml" in err and field in err
    assert not (tmp_path / "out").exists()


def test_a_pool_the_model_does_not_fit_is_refused_naming_it():
    spec = WorkloadSpec.model_validate(
        {
            "model": "llama-2-70b",
            "hardware": {"disaggregated": {"prefill": {"tensor_parallel": 4}, "decode": {"tensor_parallel": 1}}},
            "requests": requests_section(1, 10, 10),
        }
    )
    with pytest.raises(InfersimError, match="hardware.disaggregated.decode"):
        Simulation(spec, build_requests(spec, "."))


def test_run_folder_carries_the_phases(tmp_path):
    import json

    import pandas as pd

    wl = Path(__file__).resolve().parents[2] / "examples" / "disaggregation" / "disaggregated-7b.yaml"
    out = tmp_path / "run"
    assert main(["run", "-w", str(wl), "-n", "20", "-o", str(out), "-q", "--csv"]) == 0
    table = pd.read_csv(out / "requests.csv")
    for col in ("prefill_replica", "prefill_s", "transfer_wait_s", "transfer_s", "decode_queueing_s", "decode_s"):
        assert col in table.columns
    assert table["transfer_s"].notna().all()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["disaggregation"]["kv_transfers_streamed"] > 0
    assert set(summary["disaggregation"]["pools"]) == {"prefill", "decode"}
    assert (out / "plots" / "disaggregation_phases.png").exists()
