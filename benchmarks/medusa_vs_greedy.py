"""Medusa decoding against plain greedy decoding on the same runner, model, prompts and CPU,
in one run, the methods taking turns (interleaved) so that the machine's load hits them alike.

For every batch size and tree (choice list / Cartesian / greedy from the heads' measured
accuracies, at a few node budgets) it measures:
- acceleration rate: mean tokens per sequence per decoding step (Medusa's definition);
- overhead: mean Medusa step time / mean plain decode step time (same batch size);
- speedup: plain decode time / Medusa decode time for the same requested tokens (the prefill,
  identical for both but for the heads' one proposal, is left out; end-to-end is shown too);
- the simulator's prediction of the acceleration rate from the measured accuracies
  (simulator.speculative.medusa_tree.expected_length) beside the measured one;
- that greedy Medusa's output equals plain greedy's, token for token.
Writes benchmarks/RESULTS-medusa.md and benchmarks/RESULTS-medusa.png.

    python benchmarks/medusa_vs_greedy.py [--prompts 8] [--new 128] [--batches 1,4,8] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from infersim.simulator.machine import cpu_model
from infersim.simulator.metrics.plots import agg_pyplot, finish_figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def tree_set(acc: np.ndarray, heads: int, quick: bool):
    """(kind, layout) pairs: Medusa's own choice list (mc_sim_7b_63, tuned for Vicuna-7B; its
    prefixes are trees), Cartesian products and greedy trees from the measured accuracies."""
    from infersim.executor.medusa.tree import build_tree
    from infersim.simulator.speculative.medusa_heads import load_accuracies

    mc = [list(c) for c in load_accuracies("vicuna-7b").tree]
    out = []
    budgets = (8, 16) if quick else (4, 8, 16, 32, 64)
    for n in budgets:
        out.append(("greedy", build_tree("greedy", heads=heads, nodes=n, accuracies=acc)))
    for n in (16,) if quick else (8, 16, 32, 64):
        t = build_tree("choices", heads=heads, choices=mc[: n - 1])
        t.name = f"mc_sim_7b_63[:{n - 1}]"
        out.append(("choices", t))
    for sizes in ([2, 2, 1, 1],) if quick else ([1, 1, 1, 1], [2, 2, 1, 1], [3, 2, 2, 1]):
        out.append(("cartesian", build_tree("cartesian", heads=heads, sizes=sizes)))
    return out


def run_group(method, runner, heads, ps, new, device):
    """One group of prompts decoded together; returns (outputs, DecodeStats)."""
    from infersim.executor.medusa.decode import greedy_decode, make_cache, medusa_decode

    kind, tree, acc = method
    cache = make_cache(runner, ps, new, tree.nodes if tree is not None else 1, device)
    if kind == "plain":
        return greedy_decode(runner, cache, ps, new, device)
    return medusa_decode(runner, heads, tree, cache, ps, new, acc, device)


def cpu_time(st, device) -> float:
    """Decode time on the work clock: this thread's CPU time on cpu, wall time on cuda."""
    return st.decode_time_s if str(device).startswith("cuda") else st.decode_cpu_s


def step_times(st, device) -> list[float]:
    return st.step_times_s if str(device).startswith("cuda") else st.step_cpu_s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer trees (a smoke run)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS-medusa.md"))
    args = ap.parse_args(argv)

    import torch
    from rich.progress import Progress

    import infersim.executor  # noqa: F401
    from infersim.executor.medusa.acceptance import Acceptance
    from infersim.executor.medusa.store import ensure_heads
    from infersim.executor.medusa.train import DEFAULT_RECIPE
    from infersim.executor.medusa.tree import build_tree
    from infersim.executor.models import load_model, select_device
    from infersim.executor.prompts import make_prompts
    from infersim.executor.runner import build_runner
    from infersim.executor.zoo import ensure_zoo
    from infersim.simulator.speculative.medusa_tree import expected_length

    torch.set_num_threads(args.threads)
    ensure_zoo()
    device = select_device(args.device)
    lm = load_model("zoo-target", "cpu", "fp32")
    heads, meta, folder = ensure_heads(lm)  # trained on cpu; moved below
    shared, meta_s, _ = ensure_heads(lm, dataclasses.replace(DEFAULT_RECIPE, shared_lm_head=True))
    lm = load_model("zoo-target", str(device))
    heads, shared = heads.to(device), shared.to(device)
    runner = build_runner(lm)
    acc = np.array(meta["accuracies"]["greedy"]["per_rank"])
    prompts = make_prompts(
        [args.prompt_len] * args.prompts, tokenizer=lm.tokenizer, vocab_size=lm.vocab_size, seed=args.seed
    )
    batches = [int(b) for b in args.batches.split(",")]
    greedy_acc, typical = Acceptance("greedy"), Acceptance("typical", temperature=0.7, epsilon=0.09, delta=0.3)
    trees = tree_set(acc, heads.num_heads, args.quick)
    methods = [("plain", "plain greedy", None, None, None)]  # methods[0]: the baseline every other is paired with
    methods += [(k, t.name, t, greedy_acc, heads) for k, t in trees]
    typ_tree = next(t for k, t in trees if k == "greedy" and t.nodes == 16)
    methods.append(("typical", f"{typ_tree.name}, typical (T 0.7, eps 0.09, delta 0.3)", typ_tree, typical, heads))
    acc_s = np.array(meta_s["accuracies"]["greedy"]["per_rank"])
    for n in (8,) if args.quick else (4, 8, 16):
        t = build_tree("greedy", heads=shared.num_heads, nodes=n, accuracies=acc_s)
        methods.append(("greedy, shared LM head", f"{t.name}, heads sharing the LM head", t, greedy_acc, shared))
    method_acc = {name: (acc_s if h is shared else acc) for _, name, _, _, h in methods}
    load0 = os.getloadavg()[0]
    # Pairs: every Medusa run of a prompt group is paired with a plain greedy run of the same
    # group right beside it (order alternating between repeats), and the speedup is the median
    # of the paired ratios: on a shared machine the load changes within seconds, and a ratio of
    # two runs taken far apart measures the load, not the method.
    rec: dict = {}
    outputs: dict = {}
    t_start = time.perf_counter()
    plain = ("plain", None, None)
    with Progress() as prog:
        groups = sum(-(-len(prompts) // b) for b in batches)
        task = prog.add_task("benchmark", total=groups * args.repeats * (len(methods) - 1))
        for b in batches:
            for g0 in range(0, len(prompts), b):
                ps = prompts[g0 : g0 + b]
                for rep in range(args.repeats):
                    for _, name, tree, acc_mode, hd in methods[1:]:
                        pair = [("plain greedy", plain), (name, ("medusa", tree, acc_mode))]
                        if rep % 2:
                            pair.reverse()
                        got = {}
                        for label, m in pair:
                            o, st = run_group(m, runner, hd, ps, args.new, device)
                            got[label] = st
                            outputs.setdefault((b, label), {})[g0] = o
                        r = rec.setdefault(
                            (b, name),
                            {
                                "rep": {},
                                "tokens": 0,
                                "seq_steps": 0,
                                "steps": 0,
                                "plain_seq_steps": 0,
                                "plain_steps": 0,
                                "cpu": 0.0,
                                "plain_cpu": 0.0,
                                "wall": 0.0,
                                "plain_wall": 0.0,
                                "verify_s": 0.0,
                                "heads_s": 0.0,
                            },
                        )
                        m_st, p_st = got[name], got["plain greedy"]
                        per = r["rep"].setdefault(rep, [0.0, 0.0])
                        per[0] += cpu_time(p_st, device)
                        per[1] += cpu_time(m_st, device)
                        r["tokens"] += m_st.decode_tokens
                        r["seq_steps"] += m_st.seq_steps
                        r["steps"] += m_st.steps
                        r["plain_seq_steps"] += p_st.seq_steps
                        r["plain_steps"] += p_st.steps
                        r["cpu"] += cpu_time(m_st, device)
                        r["plain_cpu"] += cpu_time(p_st, device)
                        r["wall"] += m_st.decode_time_s
                        r["plain_wall"] += p_st.decode_time_s
                        r["verify_s"] += m_st.verify_time_s
                        r["heads_s"] += m_st.heads_time_s
                        prog.advance(task)
    wall = time.perf_counter() - t_start
    load1 = os.getloadavg()[0]

    def flat(b, label):
        return [t for g0 in sorted(outputs[(b, label)]) for t in outputs[(b, label)][g0]]

    rows = []
    for b in batches:
        ref = flat(b, "plain greedy")
        for kind, name, tree, acc_mode, _ in methods[1:]:
            r = rec[(b, name)]
            got = flat(b, name)
            rate = r["tokens"] / r["seq_steps"]
            per_rep = [p / m for p, m in r["rep"].values()]
            # overhead per sequence-step: at batch 1 the step-time ratio; at batch b Medusa's batch
            # thins out as its sequences finish at different steps, so whole-step times of the two
            # methods would compare different batch sizes. speedup = rate / overhead exactly.
            overhead = (r["cpu"] / r["seq_steps"]) / (r["plain_cpu"] / r["plain_seq_steps"])
            rows.append(
                {
                    "batch": b,
                    "kind": kind,
                    "name": name,
                    "nodes": tree.nodes,
                    "rate": rate,
                    "pred": expected_length(tree.paths, method_acc[name]),
                    "step_ms": r["cpu"] / r["steps"] * 1e3,
                    "plain_step_ms": r["plain_cpu"] / r["plain_steps"] * 1e3,
                    "overhead": overhead,
                    "speedup": r["plain_cpu"] / r["cpu"],
                    "speedup_lo": min(per_rep),
                    "speedup_hi": max(per_rep),
                    "wall": r["plain_wall"] / r["wall"],
                    "verify_share": r["verify_s"] / r["cpu"],
                    "heads_share": r["heads_s"] / r["cpu"],
                    "same": sum(int(x == y) for x, y in zip(got, ref)),
                    "n": len(ref),
                }
            )
    measured = Measured(rows, lm, meta, meta_s, folder, device, load0, load1, wall)
    write_report(args, measured)
    plot(rows, Path(args.out).with_suffix(".png"))
    print(Path(args.out).read_text())
    return 0


@dataclasses.dataclass(frozen=True)
class Measured:
    """What one benchmark run measured, and on what: the report's inputs besides the command line."""

    rows: list[dict] = dataclasses.field(metadata={"help": "one row per batch size and method"})
    lm: Any = dataclasses.field(metadata={"help": "the target model's runner"})
    meta: dict = dataclasses.field(metadata={"help": "the Medusa heads' training record"})
    meta_s: dict = dataclasses.field(metadata={"help": "the record of the heads sharing the LM head"})
    folder: Path = dataclasses.field(metadata={"help": "the heads' folder"})
    device: str = dataclasses.field(metadata={"help": "torch device"})
    load0: float = dataclasses.field(metadata={"help": "1-minute load average at the start"})
    load1: float = dataclasses.field(metadata={"help": "1-minute load average at the end"})
    wall: float = dataclasses.field(metadata={"help": "wall time of the whole run (s)"})


def write_report(args, measured: Measured) -> None:
    import datetime

    import torch

    from infersim.executor.medusa.accuracy import top_i

    rows, lm, meta, meta_s, folder = measured.rows, measured.lm, measured.meta, measured.meta_s, measured.folder
    device, load0, load1, wall = measured.device, measured.load0, measured.load1, measured.wall
    today = datetime.date.today().isoformat()
    cpu = cpu_model()
    g = top_i(meta["accuracies"]["greedy"]["per_rank"])
    L = [
        "# Medusa vs plain greedy decoding (real heads, tree attention, CPU)",
        "",
        f"Written by `python benchmarks/medusa_vs_greedy.py --prompts {args.prompts} --new {args.new} "
        f"--batches {args.batches} --repeats {args.repeats} --threads {args.threads}"
        f"{' --quick' if args.quick else ''}` on {today}. Target `zoo-target` "
        f"({sum(p.numel() for p in lm.model.parameters()) / 1e6:.2f}M parameters, fp32) on {cpu} "
        f"({os.cpu_count()} cores, {args.threads} torch thread(s), device {device}); torch {torch.__version__}. "
        f"The machine is shared: 1-minute load average {load0:.1f} at the start, {load1:.1f} at the end; "
        f"the whole run took {wall:.0f} s.",
        "",
        f"Heads: {meta['num_heads']} Medusa-1 heads (`{Path(folder).name}`), self-distilled on the target's greedy "
        f"continuations of training-file prompts. Top-1 accuracy per head on the target's greedy continuation "
        f"of held-out prompts: "
        + ", ".join(f"{row[0]:.2f}" for row in g)
        + "; top-10: "
        + ", ".join(f"{row[-1]:.2f}" for row in g)
        + " (`simulator/catalog/medusa/zoo-target.yaml`); "
        f"{meta['parameters_per_head'] / 1e3:.0f}k parameters per head. The rows *heads sharing the LM head* use "
        f"a second set of {meta_s['num_heads']} heads trained the same way but projecting through the target's "
        f"own (frozen) LM head ({meta_s['parameters_per_head'] / 1e3:.0f}k parameters per head); their top-1: "
        + ", ".join(f"{row[0]:.2f}" for row in top_i(meta_s["accuracies"]["greedy"]["per_rank"]))
        + ".",
        "",
        f"Workload: {args.prompts} prompts of {args.prompt_len} tokens cut from held-out stdlib text "
        f"(seed {args.seed}), {args.new} new tokens each, EOS ignored. Batch b: the prompts in groups of b, each "
        f"group decoded together (one verification pass per step for the whole group). Every method ran "
        f"{args.repeats} times per prompt group, each Medusa run paired with a plain greedy run of the same group "
        "right beside it (which goes first alternates).",
        "",
        "Columns: **rate** = acceleration rate (tokens per sequence per step), **predicted** = the simulator's "
        "expected tokens per step for this tree from the measured accuracies (the product of per-head "
        "accuracies along each path: it assumes the heads are right independently), **step** = mean time of "
        "one decoding step (plain greedy's beside it), **overhead** = Medusa's time per sequence per step / "
        "plain greedy's (at batch 1 the step-time ratio; at batch b Medusa's batch thins out as its sequences "
        "finish at different steps, so it is taken per sequence-step), **speedup** = plain greedy decode time / "
        "Medusa decode time for the same tokens over all paired runs (= rate / overhead; in brackets the "
        "lowest and highest of the repeats, each over all prompt groups), **verify / heads** = share of Medusa's step time in the verification forward pass (plan "
        "included) and in the heads' proposals (the rest: acceptance, KV compaction, bookkeeping), "
        "**= greedy** = requests whose output equals plain greedy's, token for token.",
        "",
        "Times are this thread's **CPU time** (one torch thread: every kernel runs inline in it), not wall "
        "time: at a load average of 7 on 2 cores the scheduler takes ~10 ms slices from a 1 ms decode step "
        "every few steps, and wall-time ratios measured mostly that. CPU time is what the step costs on an idle "
        "core; **wall** gives the paired wall-time speedup of the same runs for comparison.",
        "",
    ]
    for b in sorted({r["batch"] for r in rows}):
        L += [
            f"## Batch {b}",
            "",
            "| tree | kind | nodes | rate | predicted | step (ms) | plain step (ms) | overhead | speedup | wall "
            "| verify / heads | = greedy |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in (x for x in rows if x["batch"] == b):
            L.append(
                f"| {r['name']} | {r['kind']} | {r['nodes']} | {r['rate']:.2f} | {r['pred']:.2f} | "
                f"{r['step_ms']:.2f} | {r['plain_step_ms']:.2f} | {r['overhead']:.2f} | "
                f"**{r['speedup']:.2f}x** [{r['speedup_lo']:.2f}-{r['speedup_hi']:.2f}] | {r['wall']:.2f}x | "
                f"{r['verify_share']:.0%} / {r['heads_share']:.0%} | {r['same']}/{r['n']} |"
            )
        L.append("")
    L += ["![speedup and acceleration rate by tree size](RESULTS-medusa.png)", ""]
    Path(args.out).write_text("\n".join(L) + "\n")


def plot(rows, path: Path) -> None:
    plt = agg_pyplot()

    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    marks = {"greedy": "o-", "choices": "s--", "cartesian": "^:", "greedy, shared LM head": "D-."}
    for b, color in zip(batches, ["C0", "C1", "C2", "C3", "C4"]):
        for kind, m in marks.items():
            rs = sorted((r for r in rows if r["batch"] == b and r["kind"] == kind), key=lambda r: r["nodes"])
            if not rs:
                continue
            x = [r["nodes"] for r in rs]
            lab = f"{kind}, batch {b}"
            axes[0].plot(x, [r["rate"] for r in rs], m, color=color, label=lab)
            axes[1].plot(x, [r["overhead"] for r in rs], m, color=color, label=lab)
            axes[2].plot(x, [r["speedup"] for r in rs], m, color=color, label=lab)
            if b == batches[0]:
                axes[0].plot(x, [r["pred"] for r in rs], m, color="gray", alpha=0.5)
    for ax, t in zip(
        axes,
        [
            "acceleration rate (gray: predicted; same at every batch size)",
            "overhead (time per sequence-step vs plain)",
            "speedup over plain greedy",
        ],
    ):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tree nodes (root included)")
        ax.set_title(t)
        ax.grid(alpha=0.3)
    axes[2].axhline(1.0, color="k", lw=0.8)
    axes[1].legend(fontsize=7, loc="upper left")  # the overhead panel has room there
    finish_figure(fig, path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
