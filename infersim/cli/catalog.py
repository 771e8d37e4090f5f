"""`sim models`, `sim hardware`, `sim workloads`: what is built in."""

from __future__ import annotations

import argparse
import json
import re

from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from infersim.simulator.hardware.catalog import list_hardware, load_hardware
from infersim.simulator.hardware.profile import HardwareProfile
from infersim.simulator.models.catalog import list_models, load_model
from infersim.simulator.models.spec import ModelSpec
from infersim.simulator.workload.builder import list_workloads, load_workload
from infersim.simulator.workload.schema import WorkloadSpec

from . import zoo
from .commands import COMMANDS


def _listing(sub, command: str, description: str, name_help: str, func):
    """`sim models`, `sim hardware`, `sim workloads`: the catalog, or one entry of it by NAME."""
    p = sub.add_parser(command, help=COMMANDS[command].help, description=description)
    p.add_argument("name", nargs="?", help=name_help)
    p.set_defaults(func=func)
    return p


def add_parser(sub) -> None:
    p = _listing(
        sub,
        "models",
        "List the model catalog with derived sizes, or show one model.",
        "model name, alias, YAML file or HF config.json / checkpoint folder; "
        "`sim models build` trains the executor's model zoo (= sim zoo build)",
        run_models,
    )
    p.add_argument(
        "--dtype",
        default="fp16",
        help="weight dtype: fp32, fp16, bf16, fp8, int8, int4 (quantised ones keep the embedding and LM head in 16 bits; default fp16)",
    )
    _listing(
        sub,
        "hardware",
        "List hardware profiles, or show one profile's numbers and sources.",
        "hardware profile name, alias or YAML file (default: list them all)",
        run_hardware,
    )
    _listing(
        sub,
        "workloads",
        "List the built-in workloads, or print one workload's file (its sources and every section).",
        "a built-in workload's name or a workload YAML file: print it, checked (default: list them all)",
        run_workloads,
    )
    p = sub.add_parser(
        "schema",
        help=COMMANDS["schema"].help,
        description="Print the JSON schema (field names, types, defaults, descriptions) of a "
        "workload, model or hardware YAML file.",
    )
    p.add_argument("kind", choices=["workload", "model", "hardware"], help="which file's schema to print")
    p.set_defaults(func=run_schema)


def run_models(args: argparse.Namespace) -> int:
    if args.name == "build":  # `sim models build`: the zoo's build, by the name the docs use
        return zoo.run(argparse.Namespace(zoo_command="build", models=[], root=None, quiet=False))

    names = [args.name] if args.name else list_models()
    rows = []
    for name in names:
        m = load_model(name)
        rows.append(
            (
                m.name,
                m.family,
                str(m.num_layers),
                str(m.hidden_size),
                f"{m.num_heads}/{m.kv_heads}",
                f"{m.params_total() / 1e9:.3f}",
                f"{m.params_active_per_token() / 1e9:.3f}",
                f"{m.moe.num_experts} top-{m.moe.experts_per_token}" if m.moe else "dense",
                f"{m.weight_bytes(args.dtype) / 1e9:.2f}",
                f"{m.bytes_kv_per_token(args.dtype) / 1024:.0f}",
            )
        )
    show_catalog(
        f"models ({args.dtype})",
        [
            "name",
            "family",
            "layers",
            "hidden",
            "heads/kv",
            "params (B)",
            "active (B)",
            "experts",
            "weights (GB)",
            "KV/token (KiB)",
        ],
        rows,
        numeric_from=2,
    )
    if args.name:
        print(f"source: {m.source}")
        for line in model_details(m):
            print(line)
    return 0


def model_details(m: ModelSpec) -> list[str]:
    """The layer's layout, which the table's columns leave out: block, norms, rotary, biases."""
    if m.shared_block_norm:
        block = "parallel (attention and MLP read one input norm; input + attention + MLP)"
    elif m.parallel_block:
        block = "parallel (attention and MLP each with its own norm; input + attention + MLP)"
    else:
        block = "sequential (the MLP reads the attention block's output)"
    biases = [
        name
        for name, on in (
            ("q/k/v", m.attention_bias),
            ("o", m.has_o_proj_bias),
            ("mlp", m.mlp_bias),
            ("lm_head", m.lm_head_bias),
        )
        if on
    ]
    positions = "learned table" if m.learned_positions else f"rotary over {m.rotary_fraction:.0%} of each head"
    return [
        f"layer: {block}; {m.norms_per_layer} {m.norm} per layer; {m.mlp} MLP of width {m.intermediate_size}",
        f"positions: {positions}; context {m.max_position_embeddings}",
        f"biases: {', '.join(biases) or 'none'}; embeddings {'tied' if m.tied_embeddings else 'untied'}",
    ]


def run_hardware(args: argparse.Namespace) -> int:
    names = [args.name] if args.name else list_hardware()
    rows = []
    for name in names:
        h = load_hardware(name)
        kernels = h.mode + (f" from {h.calibration.inherits}" if h.mode == "derived" else "")
        rows.append(
            (
                h.name,
                kernels,
                f"{h.peak_tflops['fp16']:g}",
                f"{h.memory_bandwidth_gbps:g}",
                f"{h.memory_gb:g}",
                "-" if h.memory_visible_gib is None else f"{h.memory_visible_gib:g}",
                h.host_link.name,
                f"{h.host_link.h2d_gbps:g}/{h.host_link.d2h_gbps:g}",
                f"{h.overheads.iteration_us / 1e3:g} {h.overheads.state}",
            )
        )
    show_catalog(
        "hardware profiles",
        [
            "name",
            "kernels",
            "fp16 TFLOP/s",
            "HBM GB/s",
            "memory GB",
            "CUDA GiB",
            "host link",
            "H2D/D2H GB/s",
            "engine ms/iter",
        ],
        rows,
    )

    Console().print(
        "kernels: measured = fitted to measured kernel times; derived = a measured card's fits on this "
        "card's own peaks; datasheet = pure roofline (NAME:datasheet gives it for any profile); CUDA GiB = the "
        "total the driver reports, which the KV budget starts from (-: not measured, memory GB is used); engine ms/iter "
        "= the serving engine's own time per iteration at TP 1 (measured on this card's runs, derived = carried "
        "from a measured card, none = kernels only)",
        highlight=False,
        markup=False,
    )
    if args.name:
        print(f"source: {h.source}")
        print(overheads_line(h.overheads))
        if h.calibration is not None:
            c = h.calibration
            print(
                f"calibration: {c.status}"
                + (f", inherits {c.inherits}: {c.why}" if c.inherits else "")
                + (f"; {c.source}" if c.source else "")
            )
            shapes = c.gemm.measured_shapes if c.gemm is not None else None
            if shapes is not None:
                print(
                    f"measured GEMM shapes: {shapes.rows} (GEMMs of a measured N at a K within "
                    f"~{shapes.k_width_octaves} octave take their measured/model ratio; corrected MAPE "
                    f"{shapes.mape_pct:.1f}% on the fitted rows)"
                )
            elif c.gemm is not None and c.inherits:
                sms = f"{h.sm_count} SMs" if h.sm_count else "no SM count in the profile"
                print(
                    f"measured GEMM shapes: not inherited ({sms}, not {c.inherits}'s: "
                    "the staircase of kernel choices moves with the SM count); the fitted GEMM model alone"
                )
            cached = {k: e.cache_mb for k, e in c.elementwise.items() if e.cache_mb}
            if cached:
                l2 = f" of a {h.l2_cache_mb:g} MB L2" if h.l2_cache_mb else " (no datasheet L2 in the profile)"
                print(
                    "elementwise working set from cache (MB): "
                    + ", ".join(f"{k} {mb:.3g}" for k, mb in cached.items())
                    + l2
                    + (f"; {c.inherits}'s, scaled by the two L2 sizes" if c.inherits and h.l2_cache_mb else "")
                )
    return 0


def run_workloads(args: argparse.Namespace) -> int:
    if args.name:  # the file as written: its comments say where each number comes from
        _, path = load_workload(args.name)  # a typo gets its "did you mean"; a bad file its field
        print(f"# {args.name}: {path}")
        print(path.read_text(encoding="utf-8"), end="")
        return 0
    rows = []
    for name in list_workloads():
        spec, _ = load_workload(name)
        rows.append((name, spec.model, spec.hardware.profile, first_sentence(spec.description or "")))
    show_catalog(
        "built-in workloads (use by bare name: sim run --workload NAME)",
        ["name", "model", "hardware", "description"],
        rows,
    )
    return 0


def first_sentence(text: str) -> str:
    """The first sentence of a description, whole (the rest is in the workload file)."""
    return re.split(r"(?<=[.!?])\s+(?=[A-Z])", " ".join(text.split()), maxsplit=1)[0]


def show_catalog(
    title: str, columns: list[str], rows: list[tuple[str, ...]], *, numeric_from: int | None = None, console=None
) -> None:
    """A table when it fits the terminal with every cell whole (text wraps between words), else
    one stacked block per row: the name on its line, then `column value` pairs wrapped below.
    Names are never cut: at 80 columns `a100-80gb-pcie` and `a100-80gb-sxm` stay apart."""
    console = console or Console()
    longest_word = lambda text: max((len(w) for w in str(text).split()), default=0)
    # cells that must stay whole (names, numbers) set their column's minimum; text wraps between words
    whole = [i == 0 or (numeric_from is not None and i >= numeric_from) for i in range(len(columns))]
    widths = [
        max([longest_word(col)] + [len(r[i]) if whole[i] else longest_word(r[i]) for r in rows])
        for i, col in enumerate(columns)
    ]
    budget = console.width - (3 * len(columns) + 1)  # cell padding and rules of the default box
    if sum(widths) <= budget:
        fixed = _fit_widths(
            [max([len(col)] + [len(r[i]) for r in rows]) for i, col in enumerate(columns)], widths, budget
        )
        table = Table(title=title)
        for i, col in enumerate(columns):
            table.add_column(col, justify="right" if whole[i] and i else "left", overflow="fold", width=fixed[i])
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)
        return
    console.print(Text(title, style="bold"))
    for row in rows:
        console.print(Text(row[0], style="bold"), overflow="fold")
        pairs = Text("; ").join(Text.assemble((f"{col} ", "dim"), cell) for col, cell in zip(columns[1:], row[1:]))
        console.print(Padding(pairs, (0, 0, 0, 2)))


def run_schema(args: argparse.Namespace) -> int:
    model = {"workload": WorkloadSpec, "model": ModelSpec, "hardware": HardwareProfile}[args.kind]
    print(json.dumps(model.model_json_schema(), indent=2))
    return 0


def _fit_widths(natural: list[int], minimum: list[int], budget: int) -> list[int]:
    """Column widths within `budget`: natural widths, the widest columns narrowed first but
    never below their minimum (the caller checked that the minimums fit)."""
    widths = list(natural)
    while sum(widths) > budget:
        i = max(range(len(widths)), key=lambda j: widths[j] - minimum[j])
        widths[i] -= 1
    return widths


def overheads_line(o) -> str:
    """The engine overhead per iteration, its status and where it comes from, in one line."""
    if o.state == "none":
        return f"engine overhead: none ({o.source})" if o.source else "engine overhead: none"
    numbers = f"{o.iteration_us:g} us per iteration + {o.tp_worker_us:g} us per tensor-parallel worker beyond the first"
    if o.kernel_launch_us:
        numbers += f" + {o.kernel_launch_us:g} us per kernel"
    carried = f", the numbers of {o.inherits}: {o.why}" if o.inherits else ""
    return f"engine overhead: {numbers} ({o.state}{carried}); {o.source}"
