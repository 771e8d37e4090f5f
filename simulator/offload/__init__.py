"""KV-cache offload to CPU memory with selective prefetch (FlexGen, H2O, INT4, InfiniGen).

  config.py     the workload's `offload:` section
  policies.py   KV placement policies in a registry (gpu, full, h2o, int4, infinigen)
  sparsity.py   important tokens by context length, layer and alpha, from catalog data
  costmodel.py  OffloadCostModel: per-layer compute pipelined with host-link transfers
  memory.py     the CPU-pool memory plan of an offloading replica
  replica.py    the serving replica (`replica_class(section)`)
  setup.py      builds the above from a model, a hardware profile and a section

docs/offload.md is the user guide."""

from ..costmodel import COST_MODELS
from .config import OffloadSection
from .costmodel import OffloadCostModel
from .policies import POLICIES, KVShape, PlacementPolicy, build_policy, coverage
from .setup import OffloadSetup, build_offload
from .sparsity import SparsityModel, load_sparsity

# the offload pipeline registers itself: the cost-model package sits below this one
COST_MODELS.register(OffloadCostModel.name)(OffloadCostModel)

__all__ = [
    "OffloadSection",
    "OffloadCostModel",
    "POLICIES",
    "KVShape",
    "PlacementPolicy",
    "build_policy",
    "coverage",
    "OffloadSetup",
    "build_offload",
    "SparsityModel",
    "load_sparsity",
]
