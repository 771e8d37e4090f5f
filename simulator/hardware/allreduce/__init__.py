"""Tensor-parallel all-reduce: which kernel a deployment's all-reduces run (`hardware.all_reduce`),
chosen by name from `ALL_REDUCE_KERNELS`: nccl (the profile's measured NCCL fits), custom (vLLM's
and SGLang's custom kernel, from the measured table `hwprofiles/_custom_all_reduce.yaml`), auto
(the custom kernel where the engines use it, NCCL elsewhere)."""

from __future__ import annotations

from ...registry import Registry
from ..profile import HardwareProfile
from .auto import AutoAllReduce
from .base_all_reduce import AllReduce
from .custom import CustomAllReduce
from .nccl import NcclAllReduce

ALL_REDUCE_KERNELS: Registry[type[AllReduce]] = Registry("all-reduce kernel")
for _cls in (NcclAllReduce, CustomAllReduce, AutoAllReduce):
    ALL_REDUCE_KERNELS.register(_cls.name)(_cls)

ALL_REDUCE_CHOICES = ("nccl", "custom", "auto")


def build_all_reduce(name: str, hardware: HardwareProfile) -> AllReduce:
    return ALL_REDUCE_KERNELS.get(name)(hardware)


__all__ = [
    "ALL_REDUCE_CHOICES",
    "ALL_REDUCE_KERNELS",
    "AllReduce",
    "AutoAllReduce",
    "CustomAllReduce",
    "NcclAllReduce",
    "build_all_reduce",
]
