"""Running the executor for validation: one torch thread (timings on a shared machine),
arrivals replayed without sleeping, no plots (the report draws its own).

The objects alive before the run (torch, transformers, the loaded model: several hundred
thousand) are moved out of the garbage collector's reach for its duration (`gc.freeze`), so a
full collection in the middle of a millisecond iteration walks only what the run itself
allocates; calibration and validated runs are treated alike."""
from __future__ import annotations

import gc
from pathlib import Path


def run_executor(spec, requests, model: str, out: Path, *, device: str = "cpu", dtype: str | None = None,
                 threads: int = 1) -> dict:
    import torch

    from executor.run import execute

    prev = torch.get_num_threads()
    torch.set_num_threads(max(1, int(threads)))
    gc.collect()
    gc.freeze()
    try:
        return execute(spec, requests, model, Path(out), device=device, dtype=dtype, realtime=False, plots=False,
                       quiet=True)
    finally:
        gc.unfreeze()
        torch.set_num_threads(prev)
