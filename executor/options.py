"""How a workload is executed on a real model: the options every executor entry point (plain,
speculative, offload; `sim exec` and the validation hooks) takes, declared once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class ExecOptions:
    """The settings of one `sim exec` run, apart from what it serves (workload, requests, model)
    and where it writes (the run folder)."""

    device: str | None = field(default="cpu", metadata={"help": "torch device: cpu, cuda, cuda:1"})
    dtype: str | None = field(default=None, metadata={"help": "fp32, fp16 or bf16; None: the device's default"})
    realtime: bool = field(
        default=True,
        metadata={"help": "arrivals wait on the wall clock; False jumps the clock over idle gaps"},
    )
    plots: bool = field(default=True, metadata={"help": "draw the run folder's plots/"})
    csv: bool = field(default=False, metadata={"help": "write CSV copies of the parquet tables"})
    quiet: bool = field(default=True, metadata={"help": "no progress bar"})
    device_memory_gb: float | None = field(
        default=None,
        metadata={"help": "device memory the KV blocks are planned in (CPU; default 4 GiB); None: the GPU's"},
    )
    log: Callable[[str], None] | None = field(default=None, metadata={"help": "progress lines (model loading)"})
    force: bool = field(
        default=False,
        metadata={"help": "replace an output folder infersim did not write (rundir.check_out_dir)"},
    )
    source: str = field(
        default="workload",
        metadata={"help": "what the workload came from (its file name), named by refusals of its settings"},
    )


# what the validation hooks run with: the clock jumps idle gaps and nothing is drawn
VALIDATION = ExecOptions(realtime=False, plots=False)
