"""`sim roofline`: per-operator FLOPs, bytes, intensity and time of a model on a GPU
(Medusa Appendix G.1, Figs. 9-17), as a terminal table, CSV/JSON and a roofline plot."""

from __future__ import annotations

import argparse

from rich import box
from rich.console import Console
from rich.table import Table

from infersim.analysis.roofline import (
    PHASES,
    Grid,
    base_of,
    batch_shape,
    build_layout_cost_model,
    check_batch_memory,
    iteration_table,
    layout_label,
    memory_fit_note,
    operator_table,
    overlap_table,
    plot_roofline,
    stage_table,
    tp_node_note,
)
from infersim.simulator.costmodel.moe import check_expert_parallel
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.allreduce import ALL_REDUCE_CHOICES
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.hardware.quantization import require_weight_dtype
from infersim.simulator.metrics.rundir import check_out_file, staged_files
from infersim.simulator.models.catalog import load_model
from infersim.simulator.models.dtypes import kv_dtype_for, normalize_dtype
from infersim.simulator.parallel.cost import PipelineCostModel
from infersim.simulator.parallel.dp_attention import DataParallelAttentionCostModel
from infersim.simulator.validation import check_tensor_parallel, in_field, positive_int

from .commands import COMMANDS
from .run import add_memory_flag, no_exponent

POW2_BATCHES = "1,2,4,8,16,32,64"
POW2_SEQ_LENS = "128,256,512,1024,2048,4096,8192"


def parse_ints(text: str, what: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; every value a positive integer."""
    try:
        values = [int(v) for v in str(text).replace(" ", "").split(",") if v != ""]
    except ValueError:
        raise InfersimError(f"--{what}: expected comma-separated integers, got '{text}'") from None
    if not values or min(values) < 1:
        raise InfersimError(f"--{what}: expected positive integers, got '{text}'")
    return list(dict.fromkeys(values))


def add_cost_options(p: argparse.ArgumentParser) -> None:
    """Options shared with `sim medusa`: what is costed and how."""
    p.add_argument("--model", default="llama-7b", help="model name, alias or YAML/config.json (default llama-7b)")
    p.add_argument(
        "--hardware",
        default="a100-80gb-pcie",
        help="hardware profile name or YAML (default a100-80gb-pcie); NAME:datasheet for the pure "
        "datasheet roofline of a calibrated profile",
    )
    p.add_argument("--dtype", default="fp16", help="weight dtype: fp32, fp16, bf16, fp8, int8, int4 (default fp16)")
    p.add_argument(
        "--kv-dtype",
        default=None,
        help="KV cache dtype (default: the weight dtype; 16-bit under fp8, int8 and int4 weights, as vLLM's auto)",
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree; > 1 adds all-reduce rows (default 1)")
    add_memory_flag(p)


def resolve_cost_options(args: argparse.Namespace) -> dict:
    """The options of add_cost_options loaded and checked, each error naming its flag: keyword
    arguments for build_cost_model (and the studies built on it)."""
    model = in_field("", "--model", load_model, args.model)
    hardware = in_field("", "--hardware", load_hardware, args.hardware)
    dtype = in_field("", "--dtype", normalize_dtype, args.dtype)
    kv_dtype = None if args.kv_dtype is None else in_field("", "--kv-dtype", normalize_dtype, args.kv_dtype)
    require_weight_dtype(hardware, dtype, "--dtype", model)
    hardware.require_dtype(kv_dtype_for(dtype, kv_dtype), "--kv-dtype" if kv_dtype else "--dtype")
    return {
        "model": model,
        "hardware": hardware,
        "dtype": dtype,
        "kv_dtype": kv_dtype,
        "tensor_parallel": check_tensor_parallel(model, args.tp, "--tp"),
    }


def add_parser(sub) -> None:
    p = sub.add_parser(
        "roofline",
        help=COMMANDS["roofline"].help,
        description="Per-operator FLOPs, bytes, operational intensity, bound and time of one engine iteration, "
        "for every (phase, batch, sequence length, candidates) of a sweep. The terminal shows the "
        "operators of one representative setting (the first batch and sequence length; --all for "
        "every setting) and the whole-iteration time of every setting. The default sweep is Medusa's: "
        "batch 1..64 x sequence length 128..8192, powers of two. --pp shows each pipeline stage's operators "
        "and hand-off, --dp-attention one rank of a data-parallel-attention group with its all-to-alls, each "
        "priced as `sim run` prices the layout.",
    )
    add_cost_options(p)
    p.add_argument(
        "--ep",
        type=int,
        default=1,
        help="expert-parallel degree of a mixture of experts: 1 or --tp; > 1 spreads whole experts over the GPUs (default 1)",
    )
    p.add_argument(
        "--all-reduce",
        default=None,
        choices=ALL_REDUCE_CHOICES,
        help="kernel of the tensor-parallel all-reduces: nccl (measured NCCL fits), custom (vLLM's custom "
        "all-reduce, measured; refused where it cannot run), auto (custom where vLLM runs it, NCCL elsewhere) "
        "(default: the profile's: auto in a100-80gb-sxm, h100-sxm and h200, nccl in the others)",
    )
    p.add_argument(
        "--pp",
        type=int,
        default=1,
        help="pipeline-parallel stages, each a --tp group on 8-GPU nodes: one operator table per stage (its "
        "layers, the hand-off to the next stage) and the iteration of one batch through every stage, as "
        "`sim run` times it (default 1)",
    )
    p.add_argument(
        "--dp-attention",
        type=int,
        default=None,
        metavar="N",
        help="data-parallel attention over a group of N GPUs that share the experts (expert parallel N, tp 1, "
        "8-GPU nodes): --batch is each rank's; rows of the dispatch and combine all-to-alls and of the experts "
        "on the group's N x batch tokens (default off)",
    )
    p.add_argument(
        "--two-batch-overlap",
        choices=("off", "on", "auto"),
        default="off",
        help="with --dp-attention: split each rank's batch into two micro-batches whose all-to-alls overlap "
        "the other's compute (on: every step that can split, as SGLang; auto: where it prices faster); "
        "a table shows what overlaps (default off)",
    )
    p.add_argument(
        "--phase",
        default="prefill,decode",
        help="comma list of prefill (batch prompts of seq tokens), decode (1 new token over seq cached), "
        "verify (q candidates over seq cached) (default prefill,decode)",
    )
    p.add_argument("--batch", default=POW2_BATCHES, help=f"comma list of batch sizes (default {POW2_BATCHES})")
    p.add_argument(
        "--seq",
        default=POW2_SEQ_LENS,
        help=f"comma list of sequence lengths: prompt length for prefill, cached context otherwise "
        f"(default {POW2_SEQ_LENS})",
    )
    p.add_argument(
        "--candidates",
        default="1,4,16,64",
        help="comma list of candidate tokens per sequence for the verify phase (default 1,4,16,64)",
    )
    p.add_argument(
        "--attention",
        choices=("fused", "unfused"),
        default="fused",
        help="fused: the score matrix stays on chip (FlashAttention, paged attention); unfused: QK^T "
        "writes it and softmax/PV read it back, as Medusa's Table 5 counts (default fused)",
    )
    p.add_argument(
        "--projections",
        choices=("fused", "unfused"),
        default="fused",
        help="fused: one Q/K/V GEMM and one gate+up GEMM per layer, as vLLM, TensorRT-LLM and SGLang run "
        "them; unfused: a GEMM per weight matrix (default fused)",
    )
    p.add_argument("--all", action="store_true", help="show the operators of every setting, not just the first")
    p.add_argument(
        "--per-operator",
        action="store_true",
        help="write one CSV/JSON row per operator and setting (default: one row per setting with the "
        "whole-iteration time)",
    )
    p.add_argument("--csv", metavar="PATH", help="write the table as CSV")
    p.add_argument("--json", metavar="PATH", help="write the table as JSON (a list of records)")
    p.add_argument("--plot", metavar="PATH", help="write a log-log roofline plot (PNG, PDF or SVG by suffix)")
    p.add_argument("--force", action="store_true", help="replace --csv, --json or --plot files that exist")
    p.set_defaults(func=run)


def _si(x: float) -> str:
    """1.23e9 -> '1.23G' (decimal prefixes)."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{prefix}"
    return f"{x:.3g}"


def _us(seconds: float) -> str:
    return no_exponent(seconds * 1e6, 4, thousands="")


def _operator_name(r) -> str:
    """The operator, and a communication's link ("net": between nodes) so that the table fits 80 columns."""
    return f"{r['operator']} ({r['link'].replace('network', 'net')})" if r["link"] else r["operator"]


def _operator_tables(cost, ops, shown, attention: str, wide: bool) -> list:
    """Rich tables of the operators of each setting in `shown`, each ending with its total: one
    table with phase/batch/seq/q (and stage) columns on a wide terminal, else one per setting
    and stage. A stage's total is its time and its hand-off; the iteration is the cost model's
    (the stages' sum is in the stage table; two-batch overlap in the overlap table)."""
    base = base_of(cost)
    key = ["phase", "batch", "seq_len", "candidates"]
    staged = isinstance(cost, PipelineCostModel) and cost.placement.pp > 1
    overlap = isinstance(cost, DataParallelAttentionCostModel) and cost.two_batch_overlap
    per_rank = " per rank" if isinstance(cost, DataParallelAttentionCostModel) else ""
    head = (
        f"{base.model.name} on {base.hardware.name} ({base.weight_dtype} weights, {base.kv_dtype} KV cache, "
        f"{layout_label(cost)}, {attention} attention)"
    )

    def new_table(title: str) -> Table:
        # one space between columns: the per-setting table then fits an 80-column terminal whole
        t = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False)
        for col in (
            ["operator"]
            + (["phase", "batch", "seq", "q"] if wide else [])
            + (["stage"] if wide and staged else [])
            + ["×", "FLOPs", "bytes", "FLOP/B", "bound", "µs/op", "µs tot", "%"]
        ):
            t.add_column(
                col,
                justify="left" if col in ("operator", "phase", "bound") else "right",
                no_wrap=True,
                min_width=4 if col == "%" else None,
            )
        return t

    one = "stage" if staged else ("rank's iteration (batch per rank)" if per_rank else "iteration")
    tables = [new_table(f"{head}: operators of one {one}")] if wide else []
    for _, it in shown.iterrows():
        rows = ops[(ops[key] == it[key].to_numpy()).all(axis=1)]
        for stage, part in rows.groupby("stage", sort=True):
            where = f", stage {stage} of {cost.placement.pp}" if staged else ""
            if wide:
                table = tables[0]
                if table.row_count:
                    table.add_section()
            else:
                table = new_table(
                    f"{head}\n{it['phase']}: batch {it['batch']}{per_rank}, seq {it['seq_len']}, "
                    f"q {it['candidates']}{where}"
                )
                tables.append(table)
            setting = ([str(it[k]) for k in key] + ([str(stage)] if staged else [])) if wide else []
            summed = part["total_time_s"].sum()
            whole = summed if staged or overlap else it["iteration_time_s"]
            for _, r in part.iterrows():
                table.add_row(
                    _operator_name(r),
                    *setting,
                    str(r["count"]),
                    _si(r["flops"]),
                    _si(r["bytes"]),
                    "-" if r["intensity"] != r["intensity"] else no_exponent(r["intensity"], 3, thousands=""),
                    r["bound"],
                    _us(r["time_s"]),
                    _us(r["total_time_s"]),
                    f"{100.0 * r['total_time_s'] / whole:.1f}",
                )
            label = f"stage {stage}" if staged else ("without overlap" if overlap else "iteration")
            table.add_row(
                f"[b]{label}[/b]",
                *setting,
                "",
                _si(part["flops"].mul(part["count"]).sum()),
                _si(part["bytes"].mul(part["count"]).sum()),
                "",
                "",
                "",
                f"[b]{_us(whole)}[/b]",
                "100",
            )
    return tables


def _small_table(title: str, columns: tuple[str, ...], left: tuple[str, ...]) -> Table:
    t = Table(title=title, box=box.SIMPLE_HEAD)
    for col in columns:
        t.add_column(col, justify="left" if col in left else "right", no_wrap=True)
    return t


def _stage_tables(cost, shown) -> list:
    """Per shown setting, each stage's time and hand-off, and one batch through them all."""
    out = []
    for _, it in shown.iterrows():
        shape = batch_shape(it["phase"], it["batch"], it["seq_len"], it["candidates"])
        st = stage_table(cost, shape)
        t = _small_table(
            f"{it['phase']}: batch {it['batch']}, seq {it['seq_len']}, q {it['candidates']}: "
            f"one batch through {len(st)} stages",
            ("stage", "layers", "sparse", "µs stage", "µs hand-off", "link"),
            left=("layers", "link"),
        )
        for _, r in st.iterrows():
            hand = "" if r["stage"] == len(st) - 1 else _us(r["handoff_time_s"])
            t.add_row(
                str(r["stage"]), r["layers"], str(r["sparse_layers"]), _us(r["stage_time_s"]), hand, r["handoff_link"]
            )
        t.add_row("[b]iteration[/b]", "", "", f"[b]{_us(it['iteration_time_s'])}[/b]")
        slowest = st.loc[st["stage_time_s"].idxmax()]
        out += [
            t,
            f"one batch alone takes every stage and hand-off in turn; with {len(st)} batches in flight (vLLM's "
            f"virtual engines) stage {slowest['stage']}, the slowest, sets the pace: a batch every "
            f"{_us(slowest['stage_time_s'])} µs at best",
        ]
    return out


def _overlap_tables(cost, shown) -> list:
    """Per shown setting, the parts of the two-batch-overlap step and what the simulator charges."""
    out = []
    for _, it in shown.iterrows():
        tokens = int(it["new_tokens"])
        charged = f"the iteration is {_us(it['iteration_time_s'])} µs"
        if tokens < 2:
            out.append(
                f"{it['phase']}: batch {it['batch']} per rank: a rank of one token cannot split into two "
                f"micro-batches: the step runs without overlap; {charged}"
            )
            continue
        shape = batch_shape(it["phase"], it["batch"], it["seq_len"], it["candidates"])
        ov = overlap_table(cost, shape)
        t = _small_table(
            f"{it['phase']}: batch {it['batch']} per rank: two-batch overlap, micro-batches of "
            f"{tokens // 2} and {tokens - tokens // 2} tokens",
            ("part", "×", "µs", "µs tot"),
            left=("part",),
        )
        for _, r in ov.iterrows():
            tot = "" if r["total_time_s"] != r["total_time_s"] else _us(r["total_time_s"])
            t.add_row(r["part"], str(r["count"]), _us(r["time_s"]), tot)
        overlapped = cost.overlapped_step_s(shape)
        t.add_row("[b]overlapped step[/b]", "", "", f"[b]{_us(overlapped)}[/b]")
        out.append(t)
        compute, comm = ov["time_s"].iloc[2], ov["time_s"].iloc[3]
        hidden = (
            "the all-to-alls hide under the compute" if comm <= compute else "the compute hides under the all-to-alls"
        )
        if it["iteration_time_s"] == overlapped:
            out.append(f"the group splits this step; per sparse layer {hidden}; {charged}")
        else:
            out.append(f"auto: the step runs without overlap, which prices faster; {charged}")
    return out


def _dp_attention(args: argparse.Namespace) -> int:
    """The data-parallel-attention group size (0: off); --ep, when given, must be the same."""
    if args.dp_attention is None:
        if args.two_batch_overlap != "off":
            raise InfersimError(
                "--two-batch-overlap: overlaps the expert all-to-alls of data-parallel attention: give --dp-attention N"
            )
        return 0
    n = positive_int(args.dp_attention, "--dp-attention")
    if args.ep not in (1, n):
        raise InfersimError(
            f"--ep: {args.ep} with --dp-attention {n}: the group's ranks are its expert-parallel degree "
            f"(give --ep {n} or leave it out)"
        )
    return n


def run(args: argparse.Namespace) -> int:
    for option, suffixes in (("csv", (".csv",)), ("json", (".json",)), ("plot", (".png", ".pdf", ".svg"))):
        if getattr(args, option) is not None:
            check_out_file(getattr(args, option), suffixes, option=f"--{option}", force=args.force)
    phases = [p.strip().lower() for p in args.phase.split(",") if p.strip()]
    if not phases:
        raise InfersimError(f"--phase: empty; name one or more of {', '.join(PHASES)}")
    for ph in phases:
        if ph not in PHASES:
            raise InfersimError(f"--phase: unknown phase '{ph}'; known: {', '.join(PHASES)}")
    batches = parse_ints(args.batch, "batch")
    seqs = parse_ints(args.seq, "seq")
    cands = parse_ints(args.candidates, "candidates")
    check_batch_memory(batches, "--batch", args.no_memory_check)
    options = resolve_cost_options(args)
    if args.all_reduce is not None:
        options["hardware"] = options["hardware"].model_copy(update={"all_reduce": args.all_reduce})
    dp = _dp_attention(args)
    if not dp:
        check_expert_parallel(options["model"], args.tp, args.ep, "--ep")
    cost = build_layout_cost_model(
        **options,
        fused_attention=args.attention == "fused",
        fused_projections=args.projections == "fused",
        expert_parallel=args.ep,
        pipeline_parallel=positive_int(args.pp, "--pp"),
        dp_attention=dp,
        two_batch_overlap={"off": False, "on": True, "auto": "auto"}[args.two_batch_overlap],
    )
    grid = Grid(phases, batches, seqs, cands)
    ops = operator_table(cost, grid)
    iters = iteration_table(cost, grid)

    console = Console()
    shown = iters if args.all else iters.drop_duplicates("phase")
    for table in _operator_tables(cost, ops, shown, args.attention, wide=console.width >= 120):
        console.print(table)
    if isinstance(cost, PipelineCostModel) and cost.placement.pp > 1:
        for item in _stage_tables(cost, shown):
            console.print(item)
    if isinstance(cost, DataParallelAttentionCostModel) and cost.two_batch_overlap:
        for item in _overlap_tables(cost, shown):
            console.print(item)
    if not args.all and iters["phase"].duplicated().any():
        console.print("(operators of the first setting of each phase; --all shows every setting)")

    # whole-iteration time of every setting: one grid (seq x batch) per phase and candidate count
    for phase in phases:
        sub = iters[iters["phase"] == phase]
        for q in cands if phase == "verify" else [None]:
            grid = sub if q is None else sub[sub["candidates"] == q]
            label = {"prefill": "prefill", "decode": "decode"}.get(phase, f"verify q={q}")
            t = Table(title=f"{label}: iteration ms")
            t.add_column("seq \\ batch", justify="right")
            for b in batches:
                t.add_column(str(b), justify="right")
            for s in seqs:
                cells = [grid[(grid["seq_len"] == s) & (grid["batch"] == b)]["iteration_time_s"] for b in batches]
                t.add_row(str(s), *[f"{c.iloc[0] * 1e3:.3g}" for c in cells])
            console.print(t)
    for note in (memory_fit_note(cost, iters), tp_node_note(cost)):
        if note:
            console.print(note, style="yellow")

    out = ops if args.per_operator else iters
    # the table and the figure of one grid, moved into place together after the slow plot
    with staged_files(args.csv, args.json, args.plot) as staged:
        if args.csv:
            out.to_csv(staged.path(args.csv), index=False)
        if args.json:
            staged.path(args.json).write_text(out.to_json(orient="records", indent=1))
        if args.plot:
            plot_roofline(ops, base_of(cost).hardware, staged.path(args.plot), compute_dtype=base_of(cost).act_dtype)
    for path, what in ((args.csv, f" ({len(out)} rows)"), (args.json, f" ({len(out)} records)"), (args.plot, "")):
        if path:
            console.print(f"wrote {path}{what}")
    return 0
