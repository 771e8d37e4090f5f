"""The `sim` subcommands: which module under infersim.cli implements each one, and its one-line
help. `sim` imports only the module of the command it runs (each module declares its flags in
`add_parser(subparsers)` and does the work in `run(args) -> int`), so a command starts without
loading every other command's machinery, and `sim --help` lists them all from here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    module: str  # infersim.cli.<module>
    help: str  # the line `sim --help` shows


COMMANDS: dict[str, Command] = {
    "run": Command("run", "simulate serving a workload (built-in name or YAML file)"),
    "roofline": Command("roofline", "per-operator roofline table and plot (Medusa Figs. 9-17)"),
    "medusa": Command("medusa", "Medusa speedup study: rate / overhead vs candidates, batch, sequence (Figs. 21-23)"),
    "medusa-train": Command("medusa_train", "train Medusa heads on a zoo target (cached) and show their accuracies"),
    "models": Command("catalog", "list built-in models, or show one (name, alias, YAML or config.json)"),
    "hardware": Command("catalog", "list built-in hardware profiles, or show one"),
    "workloads": Command("catalog", "list built-in workloads"),
    "schema": Command("catalog", "print the JSON schema of a data file (workload, model, hardware)"),
    "plan": Command("plan", "capacity plan: goodput per replica, replicas, GPUs and cost per hardware option"),
    "sweep": Command("sweep", "policy and parameter search over a space of configurations (grid or Optuna)"),
    "exec": Command("exec", "serve a workload on a real model (PyTorch) with the simulator's policies"),
    "zoo": Command("zoo", "build or list the executor's model zoo (small LMs trained offline)"),
    "profile": Command("profile", "measure the torch device and write a calibrated hardware profile"),
    "calibrate": Command("calibrate", "fit a hardware profile from measured kernel tables"),
    "validate": Command("validate", "compare the simulator with the real executor on the same requests"),
}
