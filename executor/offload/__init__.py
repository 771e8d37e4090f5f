"""KV-cache policies (InfiniGen, H2O, INT4, full) run on real models: a dense layer-by-layer
Llama forward whose attention each policy restricts, teacher-forced perplexity and attention
mass kept, and the important-token counts the simulator's sparsity data holds."""
from .evaluate import EvalResult, evaluate_policy
from .model import DenseLlama, full_forward
from .policies import FullCache, H2O, InfiniGen, Int4KV, KVPolicy, build_kv_policy
from .pool import KVPool

__all__ = ["DenseLlama", "EvalResult", "FullCache", "H2O", "InfiniGen", "Int4KV", "KVPolicy", "KVPool",
           "build_kv_policy", "evaluate_policy", "full_forward"]
