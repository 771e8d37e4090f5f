"""InfiniGen's KV selection on a real model: teacher-forced perplexity
and attention mass kept under the full cache, INT4, H2O and InfiniGen (with ablations and a
limited host pool with FIFO / LRU / counter eviction), plus the important-token counts by
context length and layer that the simulator reads as sparsity data.

Model: zoo-target (Llama 3 x 192, 6 query / 2 KV heads, RoPE, trained on 256-token windows of
the Python stdlib). Held-out windows of `--window-tokens` tokens (default 256: the model's
training length; beyond it its perplexity rises from ~24 to ~40, and a policy that attends to
fewer tokens can then look *better* than the full cache); the first `--prefill` tokens are
the prompt, the rest is decoded position by position so the selection acts on every step.

    python -m infersim.analysis.reproduce.infinigen_executor [--quick] [--out docs/findings]
        [--sparsity-out simulator/catalog/sparsity/zoo-target.yaml]

Writes <out>/infinigen-executor.csv (one row per policy), infinigen-executor-sparsity.csv
(count and mass by alpha, layer and context), infinigen-executor-meta.json and
infinigen-executor-{quality,mass,sparsity}.png, and the sparsity YAML. Another window length
names the files infinigen-executor-w<tokens>.* and writes no YAML (the counts come from the
same 1,024-token windows either way); --quick: fewer windows and policies, files *-quick.*,
no YAML.

    python -m infersim.analysis.reproduce.infinigen_executor --window-tokens 512 --prefill 64 --windows 16"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from infersim.executor.models import load_model
from infersim.executor.offload import DenseLlama, evaluate_policy
from infersim.executor.offload.model import full_forward
from infersim.executor.offload.policies import H2O, FullCache, InfiniGen, Int4KV
from infersim.executor.offload.skew import apply_skew, partial_columns, skew_matrices
from infersim.executor.offload.sparsity import at_contexts, important_counts, sparsity_spec
from infersim.executor.zoo.corpus import held_out_windows
from infersim.simulator.metrics.plots import agg_pyplot, finish_figure
from infersim.simulator.metrics.rundir import json_clean
from infersim.simulator.offload.policies import Int4Params
from infersim.simulator.yamlio import atomic_path, write_atomic

ALPHAS = (2.0, 3.0, 4.0, 5.0, 6.0)
CONTEXTS = (16, 32, 64, 128, 256, 512, 1024)
TRAINED_TOKENS = 256
PAPER_OPT13B = {512: 37, 1024: 60, 1536: 66, 2048: 73}  # InfiniGen 5.3, alpha 4


def policy_set(skew, quick: bool):
    """(kind, policy) pairs in report order; every parameter name is the simulator's."""
    out = [
        ("baseline", FullCache()),
        ("baseline", Int4KV()),
        ("baseline", H2O({"budget": 0.2})),
        ("infinigen", InfiniGen({}, skew)),
    ]
    if quick:
        return out + [("pool", InfiniGen({"pool_limit": 0.5, "victim": v}, skew)) for v in ("fifo", "counter")]
    out.insert(3, ("baseline", H2O({"budget": 0.1})))
    out += [
        ("infinigen", InfiniGen({"alpha": 5}, skew)),
        ("infinigen", InfiniGen({"max_fetch_fraction": 0.1}, skew)),
        ("infinigen", InfiniGen({"max_fetch_fraction": 1.0}, skew)),
        ("infinigen", InfiniGen({"start_layer": 2}, skew)),  # the reference code: layers 0-1 in full
        ("ablation", InfiniGen({}, None)),
        ("ablation", InfiniGen({}, skew, lookahead=False)),
        ("ablation", InfiniGen({}, None, lookahead=False)),
        ("ablation", InfiniGen({}, skew, oracle=True)),
        ("ablation", InfiniGen({"max_fetch_fraction": 1.0}, skew, oracle=True)),
    ]
    out += [
        ("pool", InfiniGen({"pool_limit": lim, "victim": v}, skew))
        for lim in (0.8, 0.5)
        for v in ("fifo", "lru", "counter")
    ]
    return out


def skew_stats(model, ids, skew, ratio: float) -> dict:
    """Exactness of the skew (max |Q~K~^T - QK^T| / max |QK^T|) and the query energy in the
    top r columns with and without it, per layer (the skew exists to raise the latter)."""
    s = model.shape
    r = partial_columns(s.head_dim, ratio)
    with torch.inference_mode():
        _, trace = full_forward(model, ids)
    rows = []
    for i, t in enumerate(trace):
        q, k = t["q"].double(), t["k"].double()
        a = skew[i].to(q.device).double()
        qs, ks = apply_skew(q, a.repeat_interleave(s.group, dim=0)), apply_skew(k, a)
        ref = model.scores(q, k)
        err = (model.scores(qs, ks) - ref).abs().max() / ref.abs().max()

        def top_energy(x):
            e = (x**2).sum(dim=(0, 2))  # [heads, d]
            return float((e.sort(dim=-1, descending=True).values[:, :r].sum(-1) / e.sum(-1)).mean())

        rows.append(
            {
                "layer": i,
                "max_rel_error": float(err),
                "energy_top_r_plain": top_energy(q),
                "energy_top_r_skewed": top_energy(qs),
            }
        )
    return {"columns": r, "layers": rows}


def input_similarity(model, ids) -> list[dict]:
    """InfiniGen Table 1 on this model: cosine similarity of the block inputs of consecutive
    layers, and of layer i's attention input with layer i-1's input under layer i's norm (what
    the prediction uses)."""
    out = []
    with torch.inference_mode():
        _, trace = full_forward(model, ids)
        for i in range(1, model.shape.layers):
            a, b = trace[i - 1]["h_in"], trace[i]["h_in"]
            cos_block = torch.nn.functional.cosine_similarity(a, b, dim=-1).mean()
            na, nb = model.input_norm(i, a), model.input_norm(i, b)
            cos_attn = torch.nn.functional.cosine_similarity(na, nb, dim=-1).mean()
            out.append({"layer": i, "cos_block_in": float(cos_block), "cos_attn_in": float(cos_attn)})
    return out


def plots(df: pd.DataFrame, sp: pd.DataFrame, out: Path, stem: str, layers: int) -> list[str]:
    from matplotlib.patches import Patch

    plt = agg_pyplot()

    files = []
    colors = {"baseline": "tab:gray", "infinigen": "tab:blue", "ablation": "tab:green", "pool": "tab:orange"}
    fig, ax = plt.subplots(1, 2, figsize=(12, 0.32 * len(df) + 1.6), sharey=True)
    full = df[df.policy == "full"].perplexity.iloc[0]
    y = np.arange(len(df))[::-1]
    names = [f"{r.label}  (KV {100 * r.relative_kv_size:.0f}%)" for r in df.itertuples()]
    col = [colors[k] for k in df.kind]
    ax[0].barh(y, df.perplexity / full, color=col)
    ax[0].set_xlim(0.95, max(1.1, float((df.perplexity / full).max()) * 1.03))
    ax[0].axvline(1.0, color="k", lw=0.8)
    ax[0].set_xlabel("perplexity / full cache (lower is better)")
    ax[1].barh(y, df.mass_kept, color=col)
    ax[1].set_xlim(0.5, 1.0)
    ax[1].set_xlabel("attention mass kept (mean over layers)")
    ax[0].set_yticks(y, names, fontsize=8)
    for a in ax:
        a.grid(axis="x", alpha=0.3)
    fig.legend(handles=[Patch(color=c, label=k) for k, c in colors.items()], fontsize=8, loc="upper right", ncol=4)
    fig.suptitle("zoo-target, held-out stdlib windows: quality against KV attended", x=0.35)
    files.append(finish_figure(fig, out / f"{stem}-quality.png", dpi=110).name)

    fig, ax = plt.subplots(figsize=(12, 4.5))
    w = 0.8 / layers
    x = np.arange(len(df))
    for i in range(layers):
        ax.bar(x + i * w, df[f"mass_l{i}"], w, label=f"layer {i}")
    ax.set_xticks(x + w * (layers - 1) / 2, df.label, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("attention mass kept")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title("attention mass kept per layer (full-attention probability of the tokens attended)")
    files.append(finish_figure(fig, out / f"{stem}-mass.png", dpi=110).name)

    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    for i in range(layers):
        d = sp[(sp.alpha == 4.0) & (sp.layer == i)]
        ax[0].plot(d.context, d.tokens, "o-", label=f"zoo-target layer {i}")
    d = sp[(sp.alpha == 4.0)].groupby("context").tokens.mean()
    ax[0].plot(d.index, d.values, "k--", label="zoo-target mean")
    ax[0].plot(list(PAPER_OPT13B), list(PAPER_OPT13B.values()), "s:", color="tab:red", label="OPT-13B (paper)")
    ax[0].axvline(TRAINED_TOKENS, color="gray", lw=0.8, ls=":")
    ax[0].set_xscale("log")
    ax[0].set_yscale("log")
    ax[0].set_xlabel("context (tokens)")
    ax[0].set_ylabel("tokens above max - 4 (mean over heads)")
    ax[0].legend(fontsize=7)
    for a in sorted(sp.alpha.unique()):
        d = sp[sp.alpha == a].groupby("context").tokens.mean()
        ax[1].plot(d.index, d.values / d.index, "o-", label=f"alpha {a:g}")
    ax[1].axvline(TRAINED_TOKENS, color="gray", lw=0.8, ls=":")
    ax[1].set_xscale("log")
    ax[1].set_xlabel("context (tokens)")
    ax[1].set_ylabel("important fraction of the context")
    ax[1].legend(fontsize=7)
    fig.suptitle("important tokens (dotted line: the model's training length)")
    files.append(finish_figure(fig, out / f"{stem}-sparsity.png", dpi=110).name)
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs/findings")
    ap.add_argument("--sparsity-out", default="simulator/catalog/sparsity/zoo-target.yaml")
    ap.add_argument("--windows", type=int, default=24, help="held-out windows (one per file)")
    ap.add_argument("--window-tokens", type=int, default=TRAINED_TOKENS)
    ap.add_argument("--prefill", type=int, default=32, help="prompt tokens; the rest is decoded")
    ap.add_argument("--sparsity-windows", type=int, default=16, help="1,024-token windows for the counts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    t_start = time.perf_counter()
    if args.quick:
        args.windows, args.sparsity_windows = min(args.windows, 6), min(args.sparsity_windows, 4)
    stem = "infinigen-executor" + ("" if args.window_tokens == TRAINED_TOKENS else f"-w{args.window_tokens}")
    stem += "-quick" if args.quick else ""
    out = Path(args.out)
    loaded = load_model("zoo-target", device=args.device)
    model = DenseLlama(loaded)
    tok = loaded.tokenizer
    ids = held_out_windows(tok, args.windows, args.window_tokens, args.seed)
    sample = held_out_windows(tok, 4, args.window_tokens, args.seed, split="train")  # offline skewing input
    skew = skew_matrices(model, sample.to(model.device))
    long_ids = held_out_windows(tok, args.sparsity_windows, max(CONTEXTS), args.seed + 1)
    pols = policy_set(skew, args.quick)
    steps = args.window_tokens - 1 - args.prefill

    rows, results = [], {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
        task = bar.add_task("policies", total=len(pols) * steps)
        for kind, pol in pols:
            bar.update(task, description=f"[cyan]{pol.label()}")
            r = evaluate_policy(model, pol, ids, args.prefill, progress=lambda: bar.advance(task))
            results[r.label] = r
            bytes_ratio = 1.0
            if pol.name == "int4":
                p = Int4Params.model_validate(pol.params.model_dump())
                bytes_ratio = (p.bits / 8 + 4 / p.group_size) / 2.0  # packed + fp16 scale/min per group
            row = {
                "label": r.label,
                "kind": kind,
                "policy": pol.name,
                "params": json.dumps(pol.params.model_dump() if pol.params is not None else {}, sort_keys=True),
                "perplexity": r.perplexity,
                "mass_kept": r.mass_kept(),
                "kv_fraction": r.kv_fraction(),
                "relative_kv_size": r.kv_fraction() * bytes_ratio,
                "seconds": r.seconds,
            }
            for i in range(model.shape.layers):
                row[f"mass_l{i}"] = r.mass_kept(i)
                row[f"kv_fraction_l{i}"] = r.kv_fraction(i)
            if getattr(pol, "pools", None):
                row["pool_evictions"] = sum(pl.evictions for pl in pol.pools)
                sel_layers = pol.pools[pol.params.start_layer :]
                row["evicted_previous_share"] = sum(pl.evicted_previous for pl in sel_layers) / max(
                    1, sum(pl.evictions for pl in sel_layers)
                )
            rows.append(row)
        bar.update(task, description="[cyan]important-token counts")
        counts = important_counts(model, long_ids, ALPHAS)
    df = pd.DataFrame(rows)
    full = df[df.policy == "full"].perplexity.iloc[0]
    df.insert(5, "ppl_vs_full", df.perplexity / full)

    ca, ma = at_contexts(counts["count"], CONTEXTS), at_contexts(counts["mass"], CONTEXTS)
    sp = pd.DataFrame(
        [
            {
                "alpha": a,
                "layer": i,
                "context": c,
                "tokens": ca[ai, i, ci],
                "mass": ma[ai, i, ci],
                "fraction": ca[ai, i, ci] / c,
            }
            for ai, a in enumerate(ALPHAS)
            for i in range(model.shape.layers)
            for ci, c in enumerate(CONTEXTS)
        ]
    )
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / f"{stem}.csv") as p:
        df.to_csv(p, index=False, float_format="%.6g")
    with atomic_path(out / f"{stem}-sparsity.csv") as p:
        sp.to_csv(p, index=False, float_format="%.6g")
    files = plots(df, sp, out, stem, model.shape.layers)

    date = _dt.date.today().isoformat()
    source = (
        f"measured by analysis/reproduce/infinigen_executor.py on {date}: zoo-target with the full cache, "
        f"{args.sparsity_windows} held-out stdlib windows of {max(CONTEXTS)} tokens; tokens whose true "
        f"attention score is above the row's max - alpha, averaged over heads, windows and the query "
        f"positions within +-10% of each context; the model was trained on {TRAINED_TOKENS}-token windows, "
        f"so the points above {TRAINED_TOKENS} are the model extrapolating"
    )
    spec = sparsity_spec("zoo-target", "zoo-target", ALPHAS, CONTEXTS, ca, ma, 4.0, source)
    meta = {
        "date": date,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": __import__("os").cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(model.device),
        "threads": args.threads,
        "windows": args.windows,
        "window_tokens": args.window_tokens,
        "prefill": args.prefill,
        "decode_steps": steps,
        "sparsity_windows": args.sparsity_windows,
        "seed": args.seed,
        "skew": skew_stats(model, sample.to(model.device), skew, 0.3),
        "input_similarity": input_similarity(model, ids[:8].to(model.device)),
        "seconds": time.perf_counter() - t_start,
        "files": [f"{stem}.csv", f"{stem}-sparsity.csv", *files],
    }
    write_atomic(out / f"{stem}-meta.json", json.dumps(json_clean(meta), indent=2, sort_keys=True) + "\n")
    if not args.quick and args.sparsity_out and args.window_tokens == TRAINED_TOKENS:
        head = (
            "# Attention sparsity of zoo-target (the executor's Llama 3 x 192), measured on the real model.\n"
            "# Written by `python -m infersim.analysis.reproduce.infinigen_executor`; see docs/findings/"
            "infinigen-executor.md.\n"
        )
        write_atomic(
            args.sparsity_out, head + yaml.safe_dump(json_clean(spec.model_dump()), sort_keys=False, width=100)
        )
    pd.set_option("display.width", 200)
    print(df[["label", "perplexity", "ppl_vs_full", "mass_kept", "relative_kv_size"]].to_string(index=False))
    print(
        f"wrote {out}/{stem}.* ({time.perf_counter() - t_start:.0f} s)"
        + (f" and {args.sparsity_out}" if not args.quick and args.window_tokens == TRAINED_TOKENS else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
