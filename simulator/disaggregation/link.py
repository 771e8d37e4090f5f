"""The KV link a disaggregated deployment uses, and the bytes one token's KV puts on it.

Unset (`hardware.disaggregated.link` without `bandwidth_gbps` or `latency_us`), the link is the
cluster's: on DGX/HGX nodes every GPU has its own InfiniBand adapter
(`hardware.cluster.inter_node`, 50 GB/s per GPU by default), and a tensor-parallel KV cache
moves shard by shard, each GPU's over its own adapter, as DistServe
(https://arxiv.org/abs/2401.09670), Mooncake (https://arxiv.org/abs/2407.00079) and vLLM's
disaggregated prefill connectors (NIXL, LMCache) send it. A transfer then runs over
min(prefill TP, decode TP) adapters at once: each decode GPU receives its own shard, and when
the degrees differ the side with fewer GPUs (fewer adapters) bounds it. A `bandwidth_gbps`
given in the workload is one prefill replica's total, all its GPUs together.

The bytes sent are what the decode GPUs hold: decode TP x one GPU's shard. When the decode TP
exceeds the model's KV heads, each decode GPU holds one whole replicated head (as vLLM shards
a GQA model), so the bytes sent grow past the model's KV cache; MLA's latent is whole on every
GPU, so each decode GPU receives all of it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from .config import KVLinkSection

CLUSTER = "hardware.cluster.inter_node"
WORKLOAD = "hardware.disaggregated.link"


@dataclass(frozen=True)
class ResolvedKVLink:
    """The link one prefill replica sends KV over (the cost model's `KVLink`)."""

    bandwidth_gbps: float  # one prefill replica's, every adapter it uses together
    latency_us: float
    adapters: Optional[int]  # per-GPU adapters a transfer uses in parallel (None: the user's total)
    adapter_gbps: Optional[float]  # one adapter's bandwidth (None: the user's total)
    bandwidth_from: str  # CLUSTER or WORKLOAD
    latency_from: str

    def record(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return describe_kv_link(self.record())


def describe_kv_link(link: dict) -> str:
    """A `ResolvedKVLink.record()` in one line, each value's origin named:
    `200 GB/s = 4 x 50 GB/s per-GPU adapters, 5 µs (hardware.cluster.inter_node)`."""
    bw = f"{link['bandwidth_gbps']:g} GB/s"
    if link["adapters"] is not None:
        bw += f" = {link['adapters']} x {link['adapter_gbps']:g} GB/s per-GPU adapters"
    latency = f"{link['latency_us']:g} µs"
    if link["bandwidth_from"] == link["latency_from"]:
        return f"{bw}, {latency} ({link['latency_from']})"
    return f"{bw} ({link['bandwidth_from']}), {latency} ({link['latency_from']})"


def resolve_kv_link(link: KVLinkSection, inter_node, prefill_tp: int, decode_tp: int) -> ResolvedKVLink:
    """The workload's link, each unset field from the cluster's per-GPU adapters (`inter_node`: a
    parallel.config.InterNodeLink, the placements' cluster's)."""
    if link.bandwidth_gbps is None:
        adapters = min(int(prefill_tp), int(decode_tp))
        bw = (adapters * inter_node.bandwidth_gbps, adapters, inter_node.bandwidth_gbps, CLUSTER)
    else:
        bw = (link.bandwidth_gbps, None, None, WORKLOAD)
    latency = (inter_node.latency_us, CLUSTER) if link.latency_us is None else (link.latency_us, WORKLOAD)
    return ResolvedKVLink(bw[0], latency[0], bw[1], bw[2], bw[3], latency[1])


def bytes_kv_sent_per_token(model, decode_tp: int, dtype: Optional[str] = None) -> float:
    """Bytes one token's KV puts on the link: every decode GPU's shard (see the module docstring)."""
    return int(decode_tp) * model.bytes_kv_per_token_per_gpu(decode_tp, dtype)
