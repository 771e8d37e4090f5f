"""Medusa on real models: Medusa-1 heads trained on the frozen zoo target by
self-distillation (`train.py`, cached by `store.py`), their top-i accuracies (`accuracy.py`,
written for the simulator by `catalog.py`), candidate trees (`tree.py`, the simulator's own tree
builders), greedy and typical acceptance (`acceptance.py`) and batched tree decoding over the
paged KV cache (`decode.py`); served with arrivals and continuous batching by `sim exec`
through the speculative engine (`serve.py`). Nothing here imports torch at package import time."""

from . import method  # noqa: E402,F401  (registers Medusa's decoder with the speculative engine)

# the validation matrix's hooks (analysis/validate/modes.py); imports nothing heavy
from .validate_hooks import execute, recorded_statistics, simulator_updates  # noqa: E402,F401
