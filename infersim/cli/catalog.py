"""`sim models`, `sim hardware`, `sim workloads`: what is built in."""
from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="list built-in models, or show one (name, alias, YAML or config.json)",
                       description="List the model catalog with derived sizes, or show one model.")
    p.add_argument("name", nargs="?", help="model name, alias, YAML file or HF config.json / checkpoint folder; "
                                           "`sim models build` trains the executor's model zoo (= sim zoo build)")
    p.add_argument("--dtype", default="fp16", help="fp32, fp16, bf16, int8, int4 (default fp16)")
    p.set_defaults(func=run_models)
    p = sub.add_parser("hardware", help="list built-in hardware profiles, or show one",
                       description="List hardware profiles, or show one profile's numbers and sources.")
    p.add_argument("name", nargs="?")
    p.set_defaults(func=run_hardware)
    p = sub.add_parser("workloads", help="list built-in workloads", description="List the built-in workloads.")
    p.set_defaults(func=run_workloads)
    p = sub.add_parser("schema", help="print the JSON schema of a data file (workload, model, hardware)",
                       description="Print the JSON schema (field names, types, defaults, descriptions) of a "
                                   "workload, model or hardware YAML file.")
    p.add_argument("kind", choices=["workload", "model", "hardware"])
    p.set_defaults(func=run_schema)


def run_models(args: argparse.Namespace) -> int:
    if args.name == "build":  # `sim models build`: the zoo's build, by the name the docs use
        from . import zoo

        return zoo.run(argparse.Namespace(zoo_command="build", models=[], root=None, quiet=False))
    from rich.console import Console
    from rich.table import Table

    from infersim.simulator.models.catalog import list_models, load_model

    names = [args.name] if args.name else list_models()
    table = Table(title=f"models ({args.dtype})")
    for col in ("name", "family", "layers", "hidden", "heads/kv", "params (B)", "weights (GB)", "KV/token (KiB)"):
        table.add_column(col, justify="right" if col not in ("name", "family") else "left")
    for name in names:
        m = load_model(name)
        table.add_row(m.name, m.family, str(m.num_layers), str(m.hidden_size), f"{m.num_heads}/{m.kv_heads}",
                      f"{m.params_total() / 1e9:.3f}", f"{m.weight_bytes(args.dtype) / 1e9:.2f}",
                      f"{m.bytes_kv_per_token(args.dtype) / 1024:.0f}")
    Console().print(table)
    if args.name:
        print(f"source: {m.source}")
    return 0


def run_hardware(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from infersim.simulator.hardware.catalog import list_hardware, load_hardware

    names = [args.name] if args.name else list_hardware()
    table = Table(title="hardware profiles")
    for col in ("name", "kernels", "fp16 TFLOP/s", "HBM GB/s", "memory GB", "host link", "H2D/D2H GB/s"):
        table.add_column(col)
    for name in names:
        h = load_hardware(name)
        inherits = f" from {h.calibration.inherits}" if h.mode == "derived" else ""
        table.add_row(h.name, h.mode + inherits, f"{h.peak_tflops['fp16']:g}", f"{h.memory_bandwidth_gbps:g}",
                      f"{h.memory_gb:g}", h.host_link.name, f"{h.host_link.h2d_gbps:g}/{h.host_link.d2h_gbps:g}")
    Console().print(table)
    print("kernels: measured = fitted to measured kernel times; derived = a measured card's fits on this card's own "
          "peaks; datasheet = pure roofline (NAME:datasheet gives it for any profile)")
    if args.name:
        print(f"source: {h.source}")
        if h.calibration is not None:
            c = h.calibration
            print(f"calibration: {c.status}" + (f", inherits {c.inherits}: {c.why}" if c.inherits else "")
                  + (f"; {c.source}" if c.source else ""))
    return 0


def run_workloads(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from infersim.simulator.workload.builder import list_workloads, load_workload

    table = Table(title="built-in workloads (use by bare name: sim run --workload NAME)")
    for col in ("name", "model", "hardware", "description"):
        table.add_column(col)
    for name in list_workloads():
        spec, _ = load_workload(name)
        table.add_row(name, spec.model, spec.hardware.profile, (spec.description or "").strip().split("\n")[0][:80])
    Console().print(table)
    return 0


def run_schema(args: argparse.Namespace) -> int:
    import json

    from infersim.simulator.hardware.profile import HardwareProfile
    from infersim.simulator.models.spec import ModelSpec
    from infersim.simulator.workload.schema import WorkloadSpec

    model = {"workload": WorkloadSpec, "model": ModelSpec, "hardware": HardwareProfile}[args.kind]
    print(json.dumps(model.model_json_schema(), indent=2))
    return 0
