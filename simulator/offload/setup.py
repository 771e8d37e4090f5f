"""Everything an offload run needs, built from the workload's sections: the policy (with its
sparsity data), the offload cost model over the roofline, and the memory plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..costmodel.roofline import RooflineCostModel
from ..hardware.profile import HardwareProfile
from ..models.dtypes import kv_dtype_for, normalize_dtype
from ..models.spec import ModelSpec
from .config import OffloadSection
from .costmodel import OffloadCostModel
from .policies import POLICIES, KVShape, PlacementPolicy, build_policy
from .sparsity import SparsityModel, default_sparsity_name, load_sparsity


@dataclass
class OffloadSetup:
    section: OffloadSection
    policy: PlacementPolicy
    base: RooflineCostModel
    sparsity_name: Optional[str]
    sparsity_borrowed: bool

    def cost_model(self, *, compute=None, link=None) -> OffloadCostModel:
        """A fresh cost model (each replica binds sequence lengths on its own); `compute` and
        `link` replace the roofline's compute stages and the profile's host link with
        calibrated ones (calibrated.py)."""
        s = self.section
        return OffloadCostModel(
            self.base,
            self.policy,
            overlap=s.overlap,
            weights_gpu_fraction=s.weights_gpu_percent / 100.0,
            kv_store_gbps=s.kv_store_gbps,
            layer_overhead_us=s.layer_overhead_us,
            compute=compute,
            link=link,
        )

    def describe(self) -> dict:
        d = {
            "policy": self.policy.name,
            "params": self.policy.params.model_dump(),
            "overlap": self.section.overlap,
            "weights_gpu_percent": self.section.weights_gpu_percent,
            "kv_store_gbps": self.section.kv_store_gbps,
            "host_link": self.base.hardware.host_link.name,
        }
        if self.sparsity_name is not None:
            d["sparsity"] = self.sparsity_name + (
                " (borrowed: no data for this model)" if self.sparsity_borrowed else ""
            )
        return d


def build_policy_for(
    model: ModelSpec, section: OffloadSection, dtype: str = "fp16", kv_dtype: Optional[str] = None
) -> tuple[PlacementPolicy, Optional[str], bool]:
    cls = POLICIES.get(section.policy)  # an unknown name fails here, in one line
    sparsity, name, borrowed = None, None, False
    if cls.sparsity_use != "none":
        if section.sparsity is not None:
            name = section.sparsity
        else:
            name, borrowed = default_sparsity_name(model.name)
        alpha = float((section.params or {}).get("alpha", 4.0))
        required = cls.sparsity_use == "required"
        sparsity = SparsityModel(load_sparsity(name), alpha if required else _any_alpha(name, alpha))
    shape = KVShape.of(model, normalize_dtype(dtype), kv_dtype_for(dtype, kv_dtype))
    return build_policy(section.policy, section.params, shape, sparsity), name, borrowed


def _any_alpha(name: str, alpha: float) -> float:
    """Policies that only use sparsity for their quality proxy take the data's nearest alpha."""
    alphas = [t.alpha for t in load_sparsity(name).important_tokens]
    return min(alphas, key=lambda a: abs(a - alpha))


def build_offload(
    model: ModelSpec,
    hardware: HardwareProfile,
    section: OffloadSection,
    *,
    dtype: str = "fp16",
    kv_dtype: Optional[str] = None,
    tensor_parallel: int = 1,
    base: Optional[RooflineCostModel] = None,
) -> OffloadSetup:
    dtype = normalize_dtype(dtype)
    kv = kv_dtype_for(dtype, kv_dtype)
    policy, name, borrowed = build_policy_for(model, section, dtype, kv)
    if base is None:
        base = RooflineCostModel(model, hardware, dtype=dtype, kv_dtype=kv, tensor_parallel=tensor_parallel)
    return OffloadSetup(section, policy, base, name, borrowed)
