"""A GPU (or any device) as numbers: peaks, memory, host link, interconnect, efficiencies.

Host-to-device and device-to-host bandwidth are separate fields because they differ in
practice (FlexGen measured 12.89 vs 0.97 GB/s on one host) and because the host link is a
property of the machine the GPU sits in, not of the GPU (InfiniGen's A6000 sat on PCIe 3.0).
Units: GB/s and TFLOP/s are decimal (1e9 bytes, 1e12 FLOP) as on datasheets."""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, Field, PositiveFloat, NonNegativeFloat, model_validator

from ..validation import STRICT_CONFIG

OPERATOR_CLASSES = ("linear", "attention", "elementwise", "communication")


class HostLink(BaseModel):
    model_config = STRICT_CONFIG
    name: str = "PCIe 4.0 x16"
    h2d_gbps: PositiveFloat = Field(description="achieved host-to-device copy bandwidth, GB/s")
    d2h_gbps: PositiveFloat = Field(description="achieved device-to-host copy bandwidth, GB/s")
    latency_us: NonNegativeFloat = 10.0
    copy_issue_us: NonNegativeFloat = Field(
        0.0, description="host cost of issuing one async copy (driver call): a stream of many small copies "
                         "cannot run faster than one per copy_issue_us, whatever the bandwidth; 0 = not known")
    source: str = ""


class Interconnect(BaseModel):
    """GPU-to-GPU link used by tensor-parallel all-reduce."""
    model_config = STRICT_CONFIG
    name: str = "PCIe"
    bandwidth_gbps: PositiveFloat = Field(description="per direction, per GPU, GB/s")
    latency_us: NonNegativeFloat = 10.0
    source: str = ""


class Efficiency(BaseModel):
    """Achieved fraction of the peaks for one operator class (1.0 = datasheet roofline)."""
    model_config = STRICT_CONFIG
    compute: float = Field(1.0, gt=0, le=1.5)
    memory: float = Field(1.0, gt=0, le=1.5)
    source: str = "datasheet peak (not calibrated)"


class Overheads(BaseModel):
    model_config = STRICT_CONFIG
    kernel_launch_us: NonNegativeFloat = 0.0  # added once per kernel
    iteration_us: NonNegativeFloat = 0.0  # added once per engine iteration (scheduling, sampling)
    source: str = ""


class HardwareProfile(BaseModel):
    model_config = STRICT_CONFIG

    name: str
    aliases: list[str] = []
    source: str
    peak_tflops: dict[str, PositiveFloat] = Field(description="dense peak per dtype: fp16, bf16, fp32, int8, int4")
    memory_bandwidth_gbps: PositiveFloat
    memory_gb: PositiveFloat
    host_link: HostLink
    interconnect: Optional[Interconnect] = None
    efficiency: dict[str, Efficiency] = {}
    overheads: Overheads = Overheads()
    sources: dict[str, str] = {}  # field -> citation

    @model_validator(mode="after")
    def _check(self):
        unknown = set(self.efficiency) - set(OPERATOR_CLASSES)
        if unknown:
            raise ValueError(f"unknown operator class {sorted(unknown)} in efficiency; known: {list(OPERATOR_CLASSES)}")
        if "fp16" not in self.peak_tflops:
            raise ValueError("peak_tflops must give at least fp16")
        return self

    def peak_flops(self, dtype: str) -> float:
        """FLOP/s for a compute dtype; int4 falls back to int8 rate and bf16 to fp16."""
        table = self.peak_tflops
        for key in (dtype, {"bf16": "fp16", "int4": "int8"}.get(dtype, "fp16"), "fp16"):
            if key in table:
                return table[key] * 1e12
        raise KeyError(dtype)

    def memory_bandwidth_bytes_per_s(self) -> float:
        return self.memory_bandwidth_gbps * 1e9

    def efficiency_for(self, op_class: str) -> Efficiency:
        return self.efficiency.get(op_class, Efficiency())

    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9
