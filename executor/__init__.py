"""Real tensors: models from local checkpoints, the model zoo, the paged-KV engine.

Importing the package does two things, both on purpose at import time:

- OpenMP threads wait passively (sleep at barriers instead of spinning): on a small shared
  machine a spinning thread that loses its core stalls every parallel region, and torch on 2
  cores ran 20x slower under contention (measured: 5.1 s vs 0.26 s per training step). The
  OpenMP runtime reads OMP_WAIT_POLICY once, when `import torch` loads it, and the executor's
  modules import torch, so this package's own import is the last moment the setting can be
  made; a call at an entry point would come after torch is loaded and change nothing. A value
  the user set is kept; numerics do not depend on it.
- The zoo's model names (`zoo-target`, ...) are registered with the simulator's model catalog,
  so workloads and cost models can name them (the simulator never imports the executor)."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from . import zoo  # noqa: E402,F401  (registers the zoo's model names with the simulator's catalog)
