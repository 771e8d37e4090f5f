"""The cluster a deployment runs on: GPUs per node and the link between nodes.

The defaults describe an NVIDIA DGX/HGX H100 cluster: 8 GPUs per node, one ConnectX-7
InfiniBand NDR adapter per GPU at 400 Gb/s (50 GB/s) per direction (NVIDIA DGX H100 user
guide, https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html), and the
few microseconds of one RDMA hop (NVIDIA ConnectX-7 datasheet, https://www.nvidia.com/en-us/networking/ethernet/connectx-7/:
sub-microsecond adapter latency; NCCL's small-message time across nodes is several
microseconds)."""

from __future__ import annotations

from pydantic import BaseModel, Field, NonNegativeFloat, PositiveFloat, PositiveInt

from ..validation import STRICT_CONFIG


class InterNodeLink(BaseModel):
    """The network between nodes, per GPU (each GPU has its own adapter on DGX/HGX nodes)."""

    model_config = STRICT_CONFIG
    name: str = "InfiniBand NDR (ConnectX-7, one per GPU)"
    bandwidth_gbps: PositiveFloat = Field(50.0, description="per GPU, per direction, GB/s (400 Gb/s NDR = 50 GB/s)")
    latency_us: NonNegativeFloat = Field(5.0, description="one message's fixed time across nodes, microseconds")
    source: str = (
        "NVIDIA DGX H100 user guide: 8 ConnectX-7 adapters, 400 Gb/s InfiniBand NDR each, one per GPU; "
        "latency: a few microseconds per RDMA message through one switch"
    )


class ClusterSection(BaseModel):
    """`hardware.cluster`: how a replica's GPUs sit on nodes. A replica's GPUs fill nodes in
    order (stage 0's tensor-parallel group first); replicas never share a node with a replica
    that does not fit beside them."""

    model_config = STRICT_CONFIG
    gpus_per_node: PositiveInt = Field(8, description="GPUs in one node (8 on DGX/HGX)")
    inter_node: InterNodeLink = InterNodeLink()
