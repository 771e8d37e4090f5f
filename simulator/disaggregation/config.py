"""The `hardware.disaggregated:` section of a workload file.

```yaml
hardware:
  profile: h100-sxm
  disaggregated:
    prefill: {replicas: 1, tensor_parallel: 2}          # profile: hardware.profile unless given
    decode: {replicas: 2, tensor_parallel: 1, router: least_outstanding}
    link: {bandwidth_gbps: 25, latency_us: 10}           # unset: the cluster's per-GPU adapters (link.py)
    layerwise_streaming: false
```

With the section present, `hardware.replicas` and `hardware.tensor_parallel` stay at 1: each
pool gives its own."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, Field, NonNegativeFloat, PositiveFloat, PositiveInt

from ..validation import STRICT_CONFIG

POOLS = ("prefill", "decode")  # the section's pools, in the order requests pass them


class _Strict(BaseModel):
    model_config = STRICT_CONFIG


class PoolSection(_Strict):
    replicas: PositiveInt = Field(1, description="replicas (instances) in the pool")
    tensor_parallel: PositiveInt = Field(1, description="GPUs per replica (tensor parallelism)")
    profile: Optional[str] = Field(None, description="hardware profile of the pool; None: hardware.profile")
    router: Optional[str] = Field(None, description="router registry name for the pool; None: hardware.router")

    @property
    def gpus(self) -> int:
        return self.replicas * self.tensor_parallel


class KVLinkSection(_Strict):
    """The link a prefill replica sends KV caches over. Unset fields come from the cluster
    (`hardware.cluster.inter_node`): one adapter per GPU, min(prefill TP, decode TP) of them
    at once (link.py)."""

    bandwidth_gbps: Optional[PositiveFloat] = Field(
        None,
        description="GB/s from one prefill replica, all its GPUs together; None: hardware.cluster.inter_node's "
        "bandwidth per GPU times min(prefill TP, decode TP)",
    )
    latency_us: Optional[NonNegativeFloat] = Field(
        None, description="fixed cost of one transfer, microseconds; None: hardware.cluster.inter_node's latency"
    )


class DisaggregatedSection(_Strict):
    prefill: PoolSection = PoolSection()
    decode: PoolSection = PoolSection()
    link: KVLinkSection = KVLinkSection()
    layerwise_streaming: bool = Field(
        False,
        description="send each layer's KV as soon as the prefill has computed it, so that the transfer "
        "overlaps the prefill and only the last layer's share follows it (when the link and the "
        "decode side's blocks are free at the prefill's end)",
    )

    @property
    def gpus(self) -> int:
        return self.prefill.gpus + self.decode.gpus
