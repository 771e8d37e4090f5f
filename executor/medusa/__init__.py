"""Medusa on real models (issue #8): Medusa-1 heads trained on the frozen zoo target by
self-distillation (`train.py`, cached by `store.py`), their top-i accuracies (`accuracy.py`,
written for the simulator by `catalog.py`), candidate trees (`tree.py`, the simulator's own tree
builders), greedy and typical acceptance (`acceptance.py`) and batched tree decoding over the
paged KV cache (`decode.py`). Nothing here imports torch at package import time."""
