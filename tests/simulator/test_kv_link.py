"""The disaggregated KV link: unset, it is the cluster's per-GPU adapters, min(prefill TP, decode
TP) of them (hardware.cluster.inter_node: 50 GB/s and 5 µs each by default); given, it keeps its
meaning (one prefill replica's total). Transfer times by hand for TP 1->1, 4->2 and 8->8, the
bytes sent when the decode pool replicates KV heads, and the link's record in the run folder."""

import json

import pytest

from infersim.cli.main import main
from infersim.simulator.disaggregation.config import KVLinkSection
from infersim.simulator.disaggregation.link import bytes_kv_sent_per_token, resolve_kv_link
from infersim.simulator.models.catalog import load_model
from infersim.simulator.parallel.config import ClusterSection
from infersim.simulator.simulation import simulate
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import WorkloadSpec
from tests.utils import requests_section, write_yaml

PROMPT = 1024
# llama-2-7b in fp16: K and V, 32 layers x 4096 values (32 heads, split evenly at TP <= 32) of 2 bytes
LLAMA2_KV_BYTES_PER_TOKEN = 2 * 32 * 4096 * 2  # 524,288
# llama-3-70b in bf16: K and V, 80 layers x 8 KV heads x 128 values of 2 bytes
LLAMA3_KV_BYTES_PER_TOKEN = 2 * 80 * 8 * 128 * 2  # 327,680
EXPLICIT = {"bandwidth_gbps": 25.0, "latency_us": 10.0}


def _spec(model: str, prefill_tp: int, decode_tp: int, link: dict | None = None, **hardware) -> WorkloadSpec:
    pools = {"prefill": {"tensor_parallel": prefill_tp}, "decode": {"tensor_parallel": decode_tp}}
    if link is not None:
        pools["link"] = link
    return WorkloadSpec.model_validate(
        {
            "model": model,
            "hardware": {"profile": "h100-sxm", "disaggregated": pools, **hardware},
            "serving": {"dtype": "bf16" if model == "llama-3-70b" else "fp16"},
            "requests": requests_section(1, PROMPT, 4),
        }
    )


def _transfer(spec: WorkloadSpec) -> tuple[float, float]:
    """The one request's transfer time and the bytes sent."""
    res = simulate(spec, build_requests(spec, "."))
    return float(res.requests["transfer_s"][0]), res.extra["disaggregation"]["kv_transfer_bytes"]


@pytest.mark.parametrize(
    "prefill_tp, decode_tp, adapters",
    [(1, 1, 1), (4, 2, 2), (8, 8, 8)],  # 4->2: the decode side's two GPUs (two adapters) bound it
)
def test_default_link_is_the_cluster_adapters_in_parallel(prefill_tp, decode_tp, adapters):
    nbytes = PROMPT * LLAMA2_KV_BYTES_PER_TOKEN  # 536.9 MB: no head replicated, the cache once
    transfer_s, sent = _transfer(_spec("llama-2-7b", prefill_tp, decode_tp))
    # 1->1: 5 µs + 536.9 MB / 50 GB/s = 10.743 ms; 4->2: / 100 GB/s = 5.374 ms; 8->8: / 400 GB/s = 1.347 ms
    assert transfer_s == pytest.approx(5e-6 + nbytes / (adapters * 50e9), rel=1e-12)
    assert sent == nbytes


@pytest.mark.parametrize("prefill_tp, decode_tp", [(1, 1), (4, 2), (8, 8)])
def test_an_explicit_link_is_the_replica_total_as_before(prefill_tp, decode_tp):
    nbytes = PROMPT * LLAMA2_KV_BYTES_PER_TOKEN
    transfer_s, sent = _transfer(_spec("llama-2-7b", prefill_tp, decode_tp, EXPLICIT))
    assert transfer_s == pytest.approx(10e-6 + nbytes / 25e9, rel=1e-12)  # 21.485 ms whatever the TPs
    assert sent == nbytes


def test_each_unset_field_comes_from_the_cluster_it_names():
    slow = {"cluster": {"inter_node": {"bandwidth_gbps": 12.5, "latency_us": 2.0}}}
    nbytes = PROMPT * LLAMA2_KV_BYTES_PER_TOKEN
    transfer_s, _ = _transfer(_spec("llama-2-7b", 2, 2, **slow))
    assert transfer_s == pytest.approx(2e-6 + nbytes / (2 * 12.5e9), rel=1e-12)
    transfer_s, _ = _transfer(_spec("llama-2-7b", 2, 2, {"latency_us": 10.0}))
    assert transfer_s == pytest.approx(10e-6 + nbytes / 100e9, rel=1e-12)
    transfer_s, _ = _transfer(_spec("llama-2-7b", 2, 2, {"bandwidth_gbps": 25.0}))
    assert transfer_s == pytest.approx(5e-6 + nbytes / 25e9, rel=1e-12)


def test_replicated_kv_heads_put_each_decode_gpus_copy_on_the_link():
    """Llama-3-70B has 8 KV heads. A decode pool at TP 16 holds one whole head per GPU (each
    head on two GPUs): every decode GPU receives its own, 16 heads in all, twice the cache,
    over min(8, 16) = 8 adapters. A prefill pool at TP 16 replicates too, but sends only what
    a TP 8 decode pool holds: the cache once."""
    model = load_model("llama-3-70b")
    assert bytes_kv_sent_per_token(model, 16, "bf16") == 2 * LLAMA3_KV_BYTES_PER_TOKEN
    assert bytes_kv_sent_per_token(model, 8, "bf16") == LLAMA3_KV_BYTES_PER_TOKEN
    doubled = PROMPT * 2 * LLAMA3_KV_BYTES_PER_TOKEN  # 671.1 MB
    transfer_s, sent = _transfer(_spec("llama-3-70b", 8, 16))
    assert sent == doubled
    assert transfer_s == pytest.approx(5e-6 + doubled / (8 * 50e9), rel=1e-12)  # 1.683 ms
    transfer_s, sent = _transfer(_spec("llama-3-70b", 8, 16, EXPLICIT))
    assert transfer_s == pytest.approx(10e-6 + doubled / 25e9, rel=1e-12)
    once = PROMPT * LLAMA3_KV_BYTES_PER_TOKEN
    transfer_s, sent = _transfer(_spec("llama-3-70b", 16, 8))
    assert sent == once
    assert transfer_s == pytest.approx(5e-6 + once / (8 * 50e9), rel=1e-12)


def test_resolved_link_names_where_each_value_came_from():
    default = resolve_kv_link(KVLinkSection(), ClusterSection().inter_node, 4, 2)
    assert (default.bandwidth_gbps, default.adapters, default.adapter_gbps, default.latency_us) == (100.0, 2, 50.0, 5.0)
    assert default.bandwidth_from == default.latency_from == "hardware.cluster.inter_node"
    assert default.describe() == "100 GB/s = 2 x 50 GB/s per-GPU adapters, 5 µs (hardware.cluster.inter_node)"
    given = resolve_kv_link(KVLinkSection(**EXPLICIT), ClusterSection().inter_node, 8, 8)
    assert given.adapters is None and given.bandwidth_from == "hardware.disaggregated.link"
    assert given.describe() == "25 GB/s, 10 µs (hardware.disaggregated.link)"


def test_run_records_and_prints_the_link(tmp_path, capsys):
    spec = _spec("llama-2-7b", 4, 2).model_dump(mode="json", exclude_none=True)
    wl = write_yaml(tmp_path / "wl.yaml", spec)
    out = tmp_path / "run"
    assert main(["run", "-w", str(wl), "-o", str(out), "--no-plots"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "KV link: 100 GB/s = 2 x 50 GB/s per-GPU adapters, 5 µs (hardware.cluster.inter_node)" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["disaggregation"]["kv_link"]["bandwidth_gbps"] == 100.0
    config = (out / "config.yaml").read_text()
    assert "bandwidth_from: hardware.cluster.inter_node" in config and "adapters: 2" in config
