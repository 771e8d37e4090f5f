"""The `offload:` section of a workload file.

```yaml
offload:
  policy: infinigen          # gpu | full (FlexGen) | h2o | int4 | infinigen   (registry names)
  params: {alpha: 4}         # the policy's own parameters (see `simulator.offload.policies`)
  sparsity: opt-13b          # important-token data (simulator/catalog/sparsity/), name or YAML path
  overlap: ffn               # how a layer's KV load overlaps compute: ffn | layer | none
  weights_gpu_percent: 100   # the rest of the weights streams over the host link every layer
  cpu_memory_gb: 96          # host memory that holds the KV pool
```

Every field has a default; `offload: {policy: infinigen}` is a complete section."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, Field, PositiveFloat, PositiveInt

from ..validation import STRICT_CONFIG


class OffloadSection(BaseModel):
    model_config = STRICT_CONFIG

    policy: str = Field(
        "full", description="KV placement policy (registry name): gpu, full (FlexGen), h2o, int4, " "infinigen"
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="the policy's parameters, checked by the policy (unknown keys are "
        "an error naming the known ones)",
    )
    sparsity: Optional[str] = Field(
        None,
        description="important-token data: a name in simulator/catalog/sparsity/ "
        "or a YAML path; None: the file named after the model, else "
        "opt-13b (recorded in the run summary)",
    )
    overlap: Literal["ffn", "layer", "none"] = Field(
        "ffn",
        description="ffn: layer i+1's KV loads while layer i's FFN runs, after layer i's attention and "
        "prediction (FlexGen's loop with attention and MLP as separate layers; InfiniGen Fig. 18 "
        "shows FFN hidden under the transfer); layer: the load overlaps all of layer i "
        "(after the prediction that chooses it); none: load, compute, store one after another",
    )
    weights_gpu_percent: float = Field(
        100.0,
        ge=0,
        le=100,
        description="percent of the weights resident on the GPU; the rest is copied "
        "over the host link layer by layer in every iteration",
    )
    kv_store_gbps: Optional[PositiveFloat] = Field(
        None,
        description="effective GB/s of KV stores into CPU memory (d2h); None: the host link's d2h rate. "
        "FlexGen measured 0.97 GiB/s for cache stores on its host (pageable memory, strided copies)",
    )
    cpu_memory_gb: PositiveFloat = Field(96.0, description="host memory in GB (1e9); InfiniGen's host had 96 GB DDR4")
    cpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="fraction of host memory the KV pool (and CPU weights) may use"
    )
    layer_overhead_us: float = Field(
        0.0,
        ge=0,
        description="fixed time per layer per iteration on the compute "
        "stream (runtime dispatch: eager PyTorch, Python); 0 by "
        "default, a calibration knob",
    )
    pool_blocks: Optional[PositiveInt] = Field(
        None, description="explicit KV pool size in blocks (overrides the " "memory plan)"
    )
