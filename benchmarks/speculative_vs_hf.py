"""Speculative decoding on the zoo's real models against Hugging Face on the same prompts,
models and machine: HF plain greedy `generate`, HF assisted generation
(`generate(assistant_model=...)`, batch 1 only: HF does not batch it), the executor's plain
decoding (the same runner and loop with nothing drafted), the executor's speculative decoding
with one draft at s = 1..6, and Minions (three drafts, majority vote, adaptive s; coupled and
pipelined). Batch 1 (requests one after another) and batch B (all requests at once, continuous
batching). Greedy, EOS ignored; every method's output is checked against HF greedy.

Acceleration rate = tokens per target forward pass per sequence (1.0 for plain decoding): for
the executor from its own counters, for HF assisted by counting the target's forward calls.
Each method runs `--repeats` times, methods taking turns; tokens/s use each method's best run
(the least disturbed by the other processes on the machine), the median is shown too.

    python benchmarks/speculative_vs_hf.py [--requests 16] [--output 64] [--batch 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DRAFTS = ("zoo-draft-a", "zoo-draft-b", "zoo-draft-c")


class CallCounter:
    """Counts a torch module's forward calls (HF assisted generation's target steps)."""

    def __init__(self, module):
        self.n = 0
        module.register_forward_pre_hook(lambda *a: self._hit())

    def _hit(self):
        self.n += 1


def hf_one(lm, prompt, out, assistant=None):
    import torch

    kw = {}
    if assistant is not None:
        kw = {"assistant_model": assistant}
    with torch.inference_mode():
        g = lm.model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=out,
            min_new_tokens=out,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            **kw,
        )
    return g[0, len(prompt) :].tolist()


def step_costs(target_lm, draft_lm, batch: int, verify_q=(2, 4, 7), reps: int = 200) -> dict:
    """Median time of one forward pass, interleaved: the target decoding (q=1), the target
    verifying q tokens per sequence, one draft step (q=1), for `batch` sequences of 100 cached
    tokens. Ratios of these bound what speculation can gain on this machine."""
    from infersim.executor.runner import plan_batch
    from infersim.executor.speculative.draft import DraftModel
    from infersim.executor.speculative.sequence import Track
    from infersim.executor.speculative.target import TargetModel

    tm = TargetModel(target_lm, gpu_blocks=batch * 8 * (1 + len(verify_q)) + 1, block_size=16)
    dm = DraftModel(draft_lm, gpu_blocks=batch * 8 + 1, block_size=16)
    plans = {}
    for key, model, q in [("target_decode", tm, 1), ("draft_step", dm, 1)] + [
        (f"verify_q{q}", tm, q) for q in verify_q
    ]:
        trs = []
        for b in range(batch):
            tr = Track()
            tr.tokens = [(7 * b + i) % 1000 + 1 for i in range(100 + q)]
            model.cache.grow_to(tr, 100 + q)
            tr.computed = 100
            trs.append((tr, q))
        plans[key] = (model, trs, q > 1)
    times = {k: [] for k in plans}
    for _ in range(reps):
        for key, (model, trs, allq) in plans.items():
            t0 = time.process_time()
            model.runner.forward(plan_batch(model.cache, trs, "cpu", all_logits=allq), model.cache).argmax(-1).tolist()
            times[key].append(time.process_time() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--output", type=int, default=64, help="output tokens per request")
    ap.add_argument("--batch", type=int, default=16, help="batch size of the batched runs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--s-values", default="1,2,3,4,5,6")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS-speculative.md")
    args = ap.parse_args(argv)

    import torch
    import transformers
    from rich.progress import Progress

    from infersim.executor.models import hf_greedy_generate, load_model
    from infersim.executor.prompts import make_prompts
    from infersim.executor.speculative.build import DecoderOptions, build_decoder, make_sequences
    from infersim.executor.speculative.pipeline import PipelinedDecoder
    from infersim.simulator.speculative.selector import AdaptiveLengthSelector

    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    target = load_model("zoo-target")
    drafts = {n: load_model(n) for n in DRAFTS}
    rng = np.random.default_rng(args.seed)
    lengths = rng.integers(32, 129, args.requests).tolist()
    prompts = make_prompts(lengths, tokenizer=target.tokenizer, vocab_size=target.vocab_size, seed=args.seed)
    outs = [args.output] * args.requests
    total = sum(outs)
    ref = hf_greedy_generate(target.model, prompts, outs)
    counter = CallCounter(target.model)
    s_values = [int(x) for x in args.s_values.split(",")]
    ds_minions = [drafts[n] for n in DRAFTS]

    def ours(method, dlist, s, batch, *, selector=False, pipeline=False, temperature=0.0):
        def run():
            sel = AdaptiveLengthSelector(s=s, decision_threshold=8, s_min=1, s_max=6) if selector else None
            dec = build_decoder(
                target,
                dlist,
                DecoderOptions(
                    method=method,
                    s=s,
                    selector=sel,
                    gpu_blocks=1024,
                    max_batch_size=batch,
                    seed=args.seed,
                    temperature=temperature,
                ),
            )
            runner = PipelinedDecoder(dec, llm_batch_size=max(1, batch // 2)) if pipeline else dec
            res = []
            if batch == 1:
                for p, o in zip(prompts, outs):
                    res.extend(runner.generate(make_sequences([p], [o], max(1, len(dlist)))))
            else:
                res = runner.generate(make_sequences(prompts, outs, max(1, len(dlist))))
            st = dec.stats
            info = {
                "acc_rate": st.acceleration_rate(),
                "acceptance": st.recorder.mean_acceptance(),
                "target_steps": dec.target.steps,
                "s_series": list(dec.s_series),
            }
            if hasattr(dec.proposer, "summary"):
                info["ssm"] = dec.proposer.summary()
            return res, info

        return run

    def hf_plain():
        return [hf_one(target, p, o) for p, o in zip(prompts, outs)], {"acc_rate": 1.0}

    def hf_assisted():
        c0 = counter.n
        res = [hf_one(target, p, o, drafts["zoo-draft-a"].model) for p, o in zip(prompts, outs)]
        steps = counter.n - c0
        # every request: one prefill call, then each call yields >= 1 token; the prefill's token
        # is not speculative, so tokens per step = (tokens - requests) / (calls - requests)
        return res, {"acc_rate": (total - len(prompts)) / max(1, steps - len(prompts)), "target_steps": steps}

    methods = [
        ("b1", "HF generate, greedy", hf_plain),
        ("b1", "HF assisted generation (zoo-draft-a)", hf_assisted),
        ("b1", "executor, plain decoding", ours("none", [], 0, 1)),
    ]
    methods += [
        ("b1", f"executor, speculative zoo-draft-a, s={s}", ours("draft", [drafts["zoo-draft-a"]], s, 1))
        for s in s_values
    ]
    methods += [
        (
            "b1",
            "executor, Minions a+b+c, adaptive s (start 3), coupled",
            ours("minions", ds_minions, 3, 1, selector=True),
        ),
        ("b1", "executor, plain sampling, T=1", ours("none", [], 0, 1, temperature=1.0)),
        (
            "b1",
            "executor, speculative zoo-draft-a, s=3, rejection sampling T=1",
            ours("draft", [drafts["zoo-draft-a"]], 3, 1, temperature=1.0),
        ),
    ]
    B = args.batch
    methods += [(f"b{B}", f"executor, plain decoding, batch {B}", ours("none", [], 0, B))]
    methods += [
        (f"b{B}", f"executor, speculative zoo-draft-a, s={s}, batch {B}", ours("draft", [drafts["zoo-draft-a"]], s, B))
        for s in s_values
    ]
    methods += [
        (
            f"b{B}",
            f"executor, Minions a+b+c, adaptive s, coupled, batch {B}",
            ours("minions", ds_minions, 3, B, selector=True),
        ),
        (
            f"b{B}",
            f"executor, Minions a+b+c, adaptive s, pipelined (2 threads), batch {B}",
            ours("minions", ds_minions, 3, B, selector=True, pipeline=True),
        ),
        (
            f"b{B}",
            f"executor, speculative zoo-draft-a, s=3, pipelined (2 threads), batch {B}",
            ours("draft", [drafts["zoo-draft-a"]], 3, B, pipeline=True),
        ),
        (f"b{B}", f"executor, plain sampling, T=1, batch {B}", ours("none", [], 0, B, temperature=1.0)),
        (
            f"b{B}",
            f"executor, speculative zoo-draft-a, s=3, rejection sampling T=1, batch {B}",
            ours("draft", [drafts["zoo-draft-a"]], 3, B, temperature=1.0),
        ),
    ]
    times = {m[1]: [] for m in methods}
    cpu = {m[1]: [] for m in methods}
    infos, equal = {}, {}
    with Progress(transient=True) as prog:
        task = prog.add_task("benchmark", total=args.repeats * len(methods))
        for rep in range(args.repeats):
            for group, name, fn in methods:
                t0, c0 = time.perf_counter(), time.process_time()
                res, info = fn()
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
                infos[name] = info
                # sampled outputs are not expected to equal greedy ones
                equal[name] = None if "sampling" in name else sum(a == b for a, b in zip(res, ref))
                prog.advance(task)
    costs = {b: step_costs(target, drafts["zoo-draft-a"], b) for b in (1, B)}
    load_end = os.getloadavg()[0]
    best = {n: min(v) for n, v in times.items()}
    med = {n: statistics.median(v) for n, v in times.items()}
    tps = {n: total / best[n] for n in best}
    cbest = {n: min(v) for n, v in cpu.items()}
    ctps = {n: total / cbest[n] for n in cbest}
    hf_g, hf_a, our_plain_1 = methods[0][1], methods[1][1], methods[2][1]
    our_plain_b = f"executor, plain decoding, batch {B}"

    lines = ["# Speculative decoding vs Hugging Face (CPU)", ""]
    lines.append(
        f"Written by `python benchmarks/speculative_vs_hf.py --requests {args.requests} --output {args.output} "
        f"--batch {B} --threads {args.threads} --repeats {args.repeats}` on {time.strftime('%Y-%m-%d')}. "
        f"Target `zoo-target` (Llama 3 x 192, 1.57M parameters), drafts {', '.join(DRAFTS)} "
        f"(0.42-0.46M parameters), fp32 on {platform.processor() or platform.machine()} with "
        f"{os.cpu_count()} cores, {args.threads} torch thread(s); torch {torch.__version__}, "
        f"transformers {transformers.__version__}. The machine is shared with other jobs: 1-minute load "
        f"average {load_start:.1f} at the start, {load_end:.1f} at the end."
    )
    lines.append("")
    lines.append(
        f"{args.requests} requests, prompts {min(lengths)}-{max(lengths)} tokens cut from the held-out "
        f"stdlib files (executor/prompts.py), {args.output} output tokens each ({total} in all), greedy, "
        f"EOS ignored. Each method ran {args.repeats} times, taking turns. The machine is shared, so "
        f"wall-clock times swing with the other jobs; the ratios therefore use each method's CPU time "
        f"(`time.process_time`, best run), which the other processes disturb far less. CPU time counts "
        f"every thread of the process: for the pipelined rows (two threads) only the wall-clock "
        f"columns tell whether the overlap paid off. Acceleration rate = tokens per target forward pass per "
        f"sequence (plain decoding: 1). Acceptance = accepted / drafted tokens. "
        f"`= HF` = requests whose output equals HF greedy generate token for token (sampling rows: "
        f"compare with the plain sampling row; their outputs are random draws)."
    )
    lines.append("")
    hdr = (
        "| method | CPU best (s) | tokens per CPU-s | vs HF greedy | vs HF assisted | vs executor plain "
        "| wall best (s) | wall median (s) | wall tokens/s | wall vs executor plain "
        "| acceleration rate | acceptance | = HF |"
    )
    sep = "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for group, title, plain in (
        ("b1", "Batch 1 (requests one after another)", our_plain_1),
        (f"b{B}", f"Batch {B} (all requests at once; HF assisted cannot batch)", our_plain_b),
    ):
        lines += [f"## {title}", "", hdr, sep]
        for g, name, _ in methods:
            if g != group:
                continue
            i = infos[name]
            acc = i.get("acceptance")
            lines.append(
                f"| {name} | {cbest[name]:.2f} | {ctps[name]:.0f} | "
                f"{ctps[name] / ctps[hf_g]:.2f}x | {ctps[name] / ctps[hf_a]:.2f}x | {ctps[name] / ctps[plain]:.2f}x | "
                f"{best[name]:.2f} | {med[name]:.2f} | {tps[name]:.0f} | {tps[name] / tps[plain]:.2f}x | "
                f"{i['acc_rate']:.2f} | {'-' if acc is None or acc != acc else f'{acc:.2f}'} | "
                f"{'-' if equal[name] is None else f'{equal[name]}/{len(prompts)}'} |"
            )
        lines.append("")

    # ---- reading: computed from the numbers above ----
    def best_of(group, key):
        cands = [n for g, n, _ in methods if g == group and key in n and "sampling" not in n and "pipelined" not in n]
        return max(cands, key=lambda n: ctps[n])

    b1 = best_of("b1", "speculative zoo-draft-a")
    bB = best_of(f"b{B}", "speculative zoo-draft-a")
    pipe_d = f"executor, speculative zoo-draft-a, s=3, pipelined (2 threads), batch {B}"
    coup_d = f"executor, speculative zoo-draft-a, s=3, batch {B}"
    pipe_m = f"executor, Minions a+b+c, adaptive s, pipelined (2 threads), batch {B}"
    coup_m = f"executor, Minions a+b+c, adaptive s, coupled, batch {B}"
    lines += [
        "## Reading",
        "",
        f"- HF assisted generation runs at {ctps[hf_a] / ctps[hf_g]:.2f}x HF greedy here (acceleration "
        f"{infos[hf_a]['acc_rate']:.2f} tokens per target call, but every call pays HF's per-call overhead "
        f"for the target and for each assistant step).",
        f"- Batch 1, best single draft: {b1.split(', ', 1)[1]}: {ctps[b1] / ctps[hf_g]:.2f}x HF greedy, "
        f"{ctps[b1] / ctps[hf_a]:.2f}x HF assisted, {ctps[b1] / ctps[our_plain_1]:.2f}x the executor's own "
        f"plain decoding (which is {ctps[our_plain_1] / ctps[hf_g]:.2f}x HF greedy).",
        f"- Batch {B}, best single draft: {bB.split(', ', 1)[1]}: {ctps[bB] / ctps[our_plain_b]:.2f}x the "
        f"executor's plain batched decoding; speculation loses more as the batch grows because verifying "
        f"s+1 tokens per sequence costs more relative to a decode step (table below).",
        f"- Pipelining (drafting thread + verifying thread) against the coupled loop, wall clock, batch {B}: "
        f"one draft s=3 {best[coup_d] / best[pipe_d]:.2f}x, Minions {best[coup_m] / best[pipe_m]:.2f}x "
        f"(> 1: the pipeline is faster).",
        f"- Minions (three drafts per round, coupled, batch {B}): acceptance "
        f"{infos[coup_m]['acceptance']:.2f} and {infos[coup_m]['acc_rate']:.2f} tokens per step against one "
        f"draft's {infos[coup_d]['acceptance']:.2f} / {infos[coup_d]['acc_rate']:.2f} at s=3, for three "
        f"drafts' steps per round: {ctps[coup_m] / ctps[coup_d]:.2f}x the single draft's tokens per CPU-s.",
        "",
    ]
    lines += [
        "## Where the time goes: one forward pass (CPU time, median of 200, interleaved)",
        "",
        "| batch | target decode (ms) | zoo-draft-a step (ms) | draft / target | verify 2 tokens | verify 4 | "
        "verify 7 | break-even tokens per step, s=1 / 3 / 6 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b, c in costs.items():
        td = c["target_decode"]
        # a round of s costs s draft steps + one verification of s+1 tokens; it beats plain decoding
        # when it yields more than (s * draft + verify(s+1)) / decode tokens per sequence
        be = [(s * c["draft_step"] + c[f"verify_q{s + 1}"]) / td for s in (1, 3, 6)]
        lines.append(
            f"| {b} | {1e3 * td:.3f} | {1e3 * c['draft_step']:.3f} | {c['draft_step'] / td:.2f} | "
            f"{c['verify_q2'] / td:.2f}x | {c['verify_q4'] / td:.2f}x | {c['verify_q7'] / td:.2f}x | "
            f"{' / '.join(f'{x:.2f}' for x in be)} |"
        )
    lines += [
        "",
        "Verification times are relative to the target's decode step. Speculation with s drafted tokens "
        "is faster than plain decoding only when its acceleration rate (tokens per step, tables above) "
        "exceeds the break-even value in the last column: (s x draft step + verification of s+1 tokens) / "
        "decode step. The zoo's draft is small in arithmetic but not in per-call overhead, which is most of "
        "a step on a CPU at these sizes, so a draft step costs a large fraction of a target step.",
        "",
    ]
    lines += ["## Minions details (last run)", ""]
    for g, name, _ in methods:
        if "Minions" in name:
            i = infos[name]
            lines.append(
                f"- {name}: s over time (round, s): {i['s_series'][:12]}{' ...' if len(i['s_series']) > 12 else ''}"
            )
            for ssm, d in i["ssm"].items():
                acr = d["acr_when_voted"]
                lines.append(
                    f"  - {ssm}: voted {d['voted']} times ({100 * d['voted_share']:.0f}%), ACR when voted "
                    f"{'-' if acr is None else f'{acr:.2f}'}, agreement rate {d['agreement_rate']:.2f}, "
                    f"final weight {d['weight']:.2f}"
                )
    lines.append("")
    text = "\n".join(lines) + "\n"
    from infersim.simulator.yamlio import write_atomic

    write_atomic(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
