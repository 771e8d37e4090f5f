"""Real tensors: models from local checkpoints, the model zoo, the paged-KV engine.

OpenMP threads wait passively (sleep at barriers instead of spinning): on a small shared
machine a spinning thread that loses its core stalls every parallel region, and torch on 2
cores ran 20x slower under contention (measured: 5.1 s vs 0.26 s per training step). It only
takes effect when this package is imported before torch; numerics do not depend on it."""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
