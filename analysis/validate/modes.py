"""Executor modes: how a validation case is run for real, and which statistics the real run
records for the simulator to use.

A mode is the hook between the validation matrix and the executor's features. It names
- the module that provides the real execution (`executor.run` for plain serving; the
  speculative, Medusa and offload executors live in their own packages),
- how to run it (`run(spec, requests, model, out, opts)`, writing a
  `sim exec` run directory), and
- `statistics(run_dir) -> dict`: what the run measured that the simulator takes as input
  (acceptance per draft, Medusa head accuracies, attention sparsity), and
  `sim_updates(stats) -> dict`: those statistics as workload-section updates, e.g.
  {"speculation": {...}}, applied to the simulator's copy of the workload.

A feature executor plugs in by exposing, in its package, `execute(spec, requests, model, out,
opts)` (the `sim exec` signature; `opts` an executor.options.ExecOptions), `recorded_statistics(run_dir) -> dict` and
`simulator_updates(stats) -> dict`. Until it does, its cases report "not available" with the
reason, and the rest of the matrix runs."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from infersim.simulator.registry import Registry

from .execute import run_executor

HOOKS = ("execute", "recorded_statistics", "simulator_updates")


@dataclass(frozen=True)
class ExecutorMode:
    name: str
    module: str  # the package that executes this mode
    statistics: tuple[str, ...] = ()  # what the real run records for the simulator (documentation and reports)

    def availability(self) -> tuple[bool, str]:
        """(available, reason when not)."""
        try:
            mod = importlib.import_module(self.module)
        except ImportError as exc:
            return False, f"{self.module} is not available ({exc.__class__.__name__}: {exc})"
        if self.module == "infersim.executor.run":
            return True, ""
        missing = [h for h in HOOKS if not callable(getattr(mod, h, None))]
        if missing:
            return False, f"{self.module} does not expose the validation hooks {', '.join(missing)}"
        return True, ""

    def _hook(self, name: str) -> Callable:
        return getattr(importlib.import_module(self.module), name)

    def run(self, spec, requests, model: str, out: Path, opts) -> None:
        """The real run into `out` (execute.run_executor with this mode's hook); `opts` an
        execute.CaseOptions."""
        run_executor(spec, requests, model, out, opts, execute=self._hook("execute"))

    def recorded(self, run_dir: Path) -> dict:
        if self.module == "infersim.executor.run":
            return {}
        return dict(self._hook("recorded_statistics")(Path(run_dir)))

    def sim_updates(self, stats: dict) -> dict:
        if self.module == "infersim.executor.run" or not stats:
            return {}
        return dict(self._hook("simulator_updates")(stats))


MODES: Registry[ExecutorMode] = Registry("executor mode")
for _m in (
    ExecutorMode("plain", "infersim.executor.run"),
    ExecutorMode("speculative", "infersim.executor.speculative", ("acceptance per draft", "tokens per step")),
    ExecutorMode(
        "minions",
        "infersim.executor.speculative",
        ("acceptance per SSM", "speculation length over time", "tokens per step"),
    ),
    ExecutorMode("medusa", "infersim.executor.medusa", ("head accuracies", "tokens per step")),
    ExecutorMode("offload", "infersim.executor.offload", ("attention sparsity", "bytes prefetched")),
):
    MODES.register(_m.name)(_m)
