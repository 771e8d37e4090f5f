"""KV-cache policies (InfiniGen, H2O, INT4, full) run on real models: a dense layer-by-layer
Llama forward whose attention each policy restricts, teacher-forced perplexity and attention
mass kept, and the important-token counts the simulator's sparsity data holds; and serving
(serve.py, runner.py): continuous batching with the KV cache in a host pool, each layer loading
the tokens the policy selects — with the validation matrix's hooks (validate_hooks.py)."""

from .evaluate import EvalResult, evaluate_policy
from .model import DenseLlama, full_forward
from .policies import H2O, FullCache, InfiniGen, Int4KV, KVPolicy, build_kv_policy
from .pool import KVPool
from .validate_hooks import execute, recorded_statistics, simulator_updates

__all__ = [
    "DenseLlama",
    "EvalResult",
    "FullCache",
    "H2O",
    "InfiniGen",
    "Int4KV",
    "KVPolicy",
    "KVPool",
    "build_kv_policy",
    "evaluate_policy",
    "execute",
    "full_forward",
    "recorded_statistics",
    "simulator_updates",
]
