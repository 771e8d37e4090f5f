"""InfiniGen (Lee et al., OSDI 2024, arXiv:2406.19707) reproduced in the simulator.

OPT-13B on an RTX A6000 in a PCIe 3.0 x16 host, KV cache in CPU memory, 1,920 + 128 tokens,
batch 4 to 20, under five KV policies: FlexGen (full offload), INT4, H2O (20% budget),
InfiniGen (alpha 4, 20% cap) and Ideal (everything on the GPU). The experiments follow the
paper's section 5.3 and 6.2:

  block   Fig. 18: one transformer block's time and its data-transfer share (batch 8, 2,048)
  seqlen  Fig. 16(a): speedup over FlexGen at 512 / 1,024 / 1,536 / 2,048 tokens (batch 8)
  batch   Fig. 15: throughput at batch 4, 8, 12, 16, 20 (1,920 + 128) and Fig. 14 at batch 20
  models  Fig. 16(b): OPT-6.7B / 13B / 30B at batch 4 (30B with 30% of its weights on the CPU)
  proxy   relative KV size and attention mass kept per policy (quality proxies, not accuracy)
  serve   the capacity question in the serving simulator: Poisson arrivals on an A6000 with
          InfiniGen / FlexGen / no offload and on an A100-80GB without offload

under three settings of the model's free constants:

  model     our defaults: the paper's parameters (alpha 4, ratio 0.3, 20% cap, prediction from
            layer 1), every policy overlapping its loads with the FFN, KV stores at the link rate
  artifact  the settings of InfiniGen's reference scripts (speedup/scripts/*): baselines run
            with FlexGen --overlap false, InfiniGen with partial ratio 0.2, a cap of 20% of the
            final length and layers 0-1 loaded in full; FlexGen's INT4 op sequence (compression.py); KV stores at
            FlexGen's measured cache-store rate (0.97 GiB/s: pageable host memory)
  fitted    `artifact` with two constants fitted to two of the paper's numbers (InfiniGen's
            throughput at batch 4 and 20): the KV store rate and a fixed per-layer runtime
            cost; everything else it predicts is out of sample

Writes <out>/infinigen.md, infinigen.csv and infinigen_*.png.

    python -m infersim.analysis.reproduce.infinigen [--quick] [--out docs/findings]

--quick runs fewer points and no serving runs, writing <out>/infinigen_quick.* instead."""

from __future__ import annotations

import datetime as _dt
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd

from infersim.analysis.reproduce.command import reproduction_parser
from infersim.analysis.reproduce.moved import Headline, moved_section
from infersim.simulator.costmodel import BatchShape
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.metrics.plots import agg_pyplot, finish_figure
from infersim.simulator.metrics.summary import summarize
from infersim.simulator.models.catalog import load_model
from infersim.simulator.offload import OffloadSection, build_offload
from infersim.simulator.offload.sparsity import SparsityModel, load_sparsity
from infersim.simulator.simulation import simulate
from infersim.simulator.workload.builder import build_requests, load_workload
from infersim.simulator.yamlio import write_atomic

MODEL, HW, LINK = "opt-13b", "rtx-a6000", "pcie3x16"
PROMPT, GEN = 1920, 128
SCHEMES = ("flexgen", "int4", "h2o", "infinigen", "ideal")
LABEL = {"flexgen": "FlexGen", "int4": "INT4", "h2o": "H2O", "infinigen": "InfiniGen", "ideal": "Ideal"}
VARIANTS = ("model", "artifact", "fitted")
FLEXGEN_STORE_GBPS = (
    0.97 * 2**30 / 1e9
)  # FlexGen's fitted GPU->CPU cache rate (FMInference/FlexGen cost model), GiB -> GB

# ---- the paper's numbers (sections 5.3, 6.2) -----------------------------------------
PAPER = {
    "block_ms_flexgen": 28.0,  # Fig. 18 label of the clipped FlexGen bar (batch 8, 2,048)
    "transfer_share": {"flexgen": 0.969, "h2o": 0.918},
    "infinigen_over_ideal": 1.52,
    "others_over_ideal": (3.90, 18.55),
    "speedup_2048": {"int4": 1.92, "h2o": 3.40, "infinigen": 5.28},  # Fig. 16(a), "up to", batch 8
    "throughput": {"infinigen": (27.36, 41.99), "int4": (12.22, 14.02), "h2o": (21.31, 25.70)},  # batch 4 -> 20
    "b20_infinigen_over_h2o": 1.63,  # Fig. 14: 1.63x-32.93x over the baselines (UVM the 32.93x)
    "important_tokens": {512: 37, 1024: 60, 1536: 66, 2048: 73},
    "models_30b": {"infinigen": 1.34, "others": (1.18, 1.28)},  # Fig. 16(b), batch 4
    "infinigen_13b_over_6.7b": 1.17,
}


# ---- settings -------------------------------------------------------------------------------
def sections(variant: str, store_gbps: float | None = None, overhead_us: float = 0.0) -> dict[str, OffloadSection]:
    if variant == "model":
        d = {
            "flexgen": dict(policy="full"),
            "int4": dict(policy="int4"),
            "h2o": dict(policy="h2o"),
            "infinigen": dict(policy="infinigen"),
            "ideal": dict(policy="gpu"),
        }
    else:
        store = store_gbps or FLEXGEN_STORE_GBPS
        base = dict(kv_store_gbps=store, layer_overhead_us=overhead_us)
        d = {
            "flexgen": dict(policy="full", overlap="none", **base),
            "int4": dict(policy="int4", overlap="none", params={"kernels": "flexgen"}, **base),
            "h2o": dict(policy="h2o", overlap="none", **base),
            "infinigen": dict(
                policy="infinigen",
                overlap="ffn",
                **base,
                params={"partial_weight_ratio": 0.2, "cap_basis": "final", "start_layer": 2},
            ),
            "ideal": dict(policy="gpu", layer_overhead_us=overhead_us),
        }
    return {k: OffloadSection.model_validate({"sparsity": "opt-13b", **v}) for k, v in d.items()}


class Lab:
    """Cost models for one variant (cached per model and scheme)."""

    def __init__(self, secs: dict[str, OffloadSection]):
        self.secs = secs
        self.hw = load_hardware(HW, host_link=LINK)
        self._cms: dict = {}

    def cm(self, scheme: str, model: str = MODEL, weights_gpu_percent: float | None = None):
        key = (scheme, model, weights_gpu_percent)
        if key not in self._cms:
            sec = self.secs[scheme]
            if weights_gpu_percent is not None:
                sec = sec.model_copy(update={"weights_gpu_percent": weights_gpu_percent})
            self._cms[key] = build_offload(load_model(model), self.hw, sec).cost_model()
        return self._cms[key]

    def run(self, scheme: str, batch: int, prompt: int = PROMPT, gen: int = GEN, **kw) -> dict:
        """One offline batch as the paper measures it: prefill, then gen - 1 decode steps."""
        cm = self.cm(scheme, **kw)
        fin = [prompt + gen] * batch
        pre = cm.time_s(BatchShape.prefill([prompt] * batch), final=fin)
        dec = float(cm.decode_step_times_s([prompt] * batch, gen - 1, final_tokens=fin).sum())
        tot = pre + dec
        return {"prefill_s": pre, "decode_s": dec, "total_s": tot, "throughput": batch * gen / tot}

    def block(self, scheme: str, batch: int = 8, context: int = PROMPT + GEN // 2, layer: int = 20) -> dict:
        cm = self.cm(scheme)
        lb = cm.layer_breakdown(BatchShape.decode([context] * batch), final=[PROMPT + GEN] * batch)
        return {k: float(v[layer]) for k, v in lb.items() if k != "layer"}


def fit_fitted(quick: bool) -> tuple[float, float, dict]:
    """Store rate (GB/s) and per-layer overhead (us) such that InfiniGen's throughput under the
    artifact settings equals the paper's at batch 4 and 20. Nested bisection: for a store
    rate, the overhead matching batch 4; then the rate matching batch 20."""
    t4, t20 = PAPER["throughput"]["infinigen"]

    def thr(store, ov, b):
        secs = sections("artifact", store, ov)
        return Lab({"infinigen": secs["infinigen"]}).run("infinigen", b)["throughput"]

    def overhead_for(store):
        lo, hi = 0.0, 20000.0
        if thr(store, lo, 4) < t4:
            return lo
        for _ in range(30 if not quick else 22):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if thr(store, mid, 4) > t4 else (lo, mid)
        return 0.5 * (lo + hi)

    lo, hi = 0.3, 30.0  # GB/s; a faster store leaves more room for overhead, lowering batch-20 throughput
    for _ in range(24 if not quick else 16):
        mid = (lo * hi) ** 0.5
        ov = overhead_for(mid)
        if thr(mid, ov, 20) > t20:
            hi = mid
        else:
            lo = mid
    store = (lo * hi) ** 0.5
    ov = overhead_for(store)
    check = {"thr4": thr(store, ov, 4), "thr20": thr(store, ov, 20)}
    return store, ov, check


# ---- experiments ----------------------------------------------------------------------------------
def experiments(quick: bool) -> tuple[pd.DataFrame, dict]:
    rows: list[dict] = []
    meta: dict = {}
    store, ov, check = fit_fitted(quick)
    meta["fit"] = {"kv_store_gbps": store, "layer_overhead_us": ov, **check}
    labs = {
        "model": Lab(sections("model")),
        "artifact": Lab(sections("artifact")),
        "fitted": Lab(sections("artifact", store, ov)),
    }
    seqs = (512, 2048) if quick else (512, 1024, 1536, 2048)
    batches = (4, 20) if quick else (4, 8, 12, 16, 20)

    def add(exp, variant, scheme, x, metric, value, paper=np.nan):
        rows.append(
            {
                "experiment": exp,
                "variant": variant,
                "scheme": scheme,
                "x": x,
                "metric": metric,
                "value": float(value),
                "paper": float(paper),
            }
        )

    for v, lab in labs.items():
        # Fig. 18: one block (layer 20) at batch 8, mid-decode context
        for s in SCHEMES:
            blk = lab.block(s)
            for k in ("attention", "ffn", "prediction", "transfer", "block", "transfer_share"):
                add(
                    "block",
                    v,
                    s,
                    2048,
                    k,
                    blk[k] * (1e3 if k != "transfer_share" else 1.0),
                    PAPER["transfer_share"].get(s, np.nan)
                    if k == "transfer_share"
                    else (PAPER["block_ms_flexgen"] if (k == "block" and s == "flexgen") else np.nan),
                )
        ideal = lab.block("ideal")["block"]
        for s in SCHEMES:
            add(
                "block",
                v,
                s,
                2048,
                "over_ideal",
                lab.block(s)["block"] / ideal,
                PAPER["infinigen_over_ideal"]
                if s == "infinigen"
                else (PAPER["others_over_ideal"][1] if s == "flexgen" else np.nan),
            )
        # Fig. 16(a): speedup over FlexGen by sequence length, batch 8
        for L in seqs:
            res = {s: lab.run(s, 8, L - GEN) for s in SCHEMES}
            for s in SCHEMES:
                add(
                    "seqlen",
                    v,
                    s,
                    L,
                    "speedup",
                    res["flexgen"]["total_s"] / res[s]["total_s"],
                    PAPER["speedup_2048"].get(s, np.nan) if L == 2048 else np.nan,
                )
                add("seqlen", v, s, L, "total_s", res[s]["total_s"])
                add("seqlen", v, s, L, "prefill_s", res[s]["prefill_s"])
                add("seqlen", v, s, L, "decode_s", res[s]["decode_s"])
        # Fig. 15 / 14: throughput by batch, 1,920 + 128
        for b in batches:
            res = {s: lab.run(s, b) for s in SCHEMES}
            for s in SCHEMES:
                p = PAPER["throughput"].get(s)
                paper = np.nan if p is None else (p[0] if b == 4 else (p[1] if b == 20 else np.nan))
                add("batch", v, s, b, "throughput", res[s]["throughput"], paper)
                add("batch", v, s, b, "prefill_s", res[s]["prefill_s"])
                add("batch", v, s, b, "decode_s", res[s]["decode_s"])
                add("batch", v, s, b, "speedup", res["flexgen"]["total_s"] / res[s]["total_s"])
        if not quick:
            # Fig. 16(b): model sizes at batch 4; OPT-30B with 30% of its weights on the CPU
            for mname, wpct in (("opt-6.7b", None), ("opt-13b", None), ("opt-30b", 70.0)):
                res = {s: lab.run(s, 4, model=mname, weights_gpu_percent=wpct) for s in SCHEMES if s != "ideal"}
                for s in res:
                    paper = np.nan
                    if mname == "opt-30b":
                        paper = PAPER["models_30b"]["infinigen"] if s == "infinigen" else np.nan
                    add("models", v, s, mname, "speedup", res["flexgen"]["total_s"] / res[s]["total_s"], paper)

    # quality proxies (policy-level: the same in every variant but for InfiniGen's cap)
    sp = SparsityModel(load_sparsity("opt-13b"), 4.0)
    for L in (512, 1024, 1536, 2048):
        add(
            "important",
            "data",
            "infinigen",
            L,
            "important_tokens",
            float(sp.mean_tokens(L)),
            PAPER["important_tokens"][L],
        )
    for v in ("model", "artifact"):
        lab = labs[v]
        for s in SCHEMES:
            for L in seqs:
                ctx = L - GEN // 2
                p = lab.cm(s).proxies([ctx] * 8, [L] * 8)
                add("proxy", v, s, L, "relative_kv_size", p["relative_kv_size"])
                add("proxy", v, s, L, "attention_mass", p["attention_mass"])
    meta["labs"] = labs
    return pd.DataFrame(rows), meta


def serving(quick: bool) -> pd.DataFrame:
    """The capacity question: the example workloads, and variants, at a few Poisson rates."""
    root = Path(__file__).resolve().parents[2] / "examples" / "offload"
    a6000, _ = load_workload(str(root / "a6000-infinigen.yaml"))
    a100, _ = load_workload(str(root / "a100-no-offload.yaml"))
    setups = {
        "A6000 + InfiniGen": a6000,
        "A6000 + FlexGen": a6000.model_copy(
            update={"offload": a6000.offload.model_copy(update={"policy": "full", "params": {}})}
        ),
        "A6000, no offload": a6000.model_copy(update={"offload": None}),
        "A100-80GB, no offload": a100,
    }
    rates = (0.2, 0.5) if quick else (0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8)
    count = 40 if quick else 200
    rows = []
    for name, spec in setups.items():
        for r in rates:
            d = spec.model_dump(mode="json")
            d["requests"]["arrival"] = {"type": "poisson", "rate": r}
            d["requests"]["count"] = count
            sp = type(spec).model_validate(d)
            res = simulate(sp, build_requests(sp, "."))
            s = summarize(res)
            rows.append(
                {
                    "setup": name,
                    "rate": r,
                    "throughput_tok_s": s["throughput_output_tokens_per_s"],
                    "e2e_mean_s": s["e2e_s"]["mean"],
                    "e2e_p90_s": s["e2e_s"]["p90"],
                    "ttft_mean_s": s["ttft_s"]["mean"],
                    "tpot_mean_s": s["tpot_s"]["mean"],
                    "batch_mean": s["batch_size"]["mean_busy"],
                    "batch_max": s["batch_size"]["max"],
                    "kv_pool_tokens": res.memory.gpu_blocks * sp.serving.block_size,
                    "relative_kv_size": s.get("offload", {}).get("relative_kv_size", 1.0),
                    "attention_mass_kept": s.get("offload", {}).get("attention_mass_kept", 1.0),
                }
            )
    return pd.DataFrame(rows)


# ---- plots ---------------------------------------------------------------------------------------
def plots(df: pd.DataFrame, meta: dict, out: Path, stem: str) -> list[str]:
    plt = agg_pyplot()

    files = []
    colors = {"flexgen": "#d62728", "int4": "#9467bd", "h2o": "#ff7f0e", "infinigen": "#2ca02c", "ideal": "#7f7f7f"}

    # 1. per-layer timeline of one decode step, first layers (InfiniGen Fig. 3)
    lab = meta["labs"]["model"]
    fig, axes = plt.subplots(len(SCHEMES), 1, figsize=(10, 1.3 * len(SCHEMES) + 0.8), sharex=False)
    kind_col = {
        "attention": "#1f77b4",
        "ffn": "#17becf",
        "prediction": "#2ca02c",
        "load": "#d62728",
        "store": "#ff9896",
        "embedding": "#c7c7c7",
        "lm_head": "#c7c7c7",
        "overhead": "#dddddd",
    }
    lanes = {"compute": 2, "h2d": 1, "d2h": 0}
    batch = BatchShape.decode([PROMPT + GEN // 2] * 8)
    for ax, s in zip(axes, SCHEMES):
        ev = lab.cm(s).timeline(batch, final=[PROMPT + GEN] * 8)
        step = max(e["end"] for e in ev)
        ev = [e for e in ev if 0 <= e["layer"] <= 4 or e["kind"] in ("overhead", "embedding")]
        end = max(e["end"] for e in ev if e["stream"] == "compute")
        for e in ev:
            ax.barh(
                lanes[e["stream"]],
                (e["end"] - e["start"]) * 1e3,
                left=e["start"] * 1e3,
                height=0.8,
                color=kind_col.get(e["kind"], "#999"),
                edgecolor="white",
                linewidth=0.4,
            )
        ax.set_yticks([0, 1, 2], ["d2h", "h2d", "compute"], fontsize=7)
        ax.set_xlim(0, end * 1e3 * 1.02)
        ax.set_ylabel(LABEL[s], rotation=0, ha="right", va="center", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        ax.text(1.0, 0.5, f" step {step * 1e3:.0f} ms", transform=ax.transAxes, fontsize=7, va="center")
    axes[-1].set_xlabel(
        "ms from the start of one decode step, layers 0-4 (each panel its own scale): "
        "OPT-13B, batch 8, context 1,984, PCIe 3.0"
    )
    from matplotlib.patches import Patch

    axes[0].legend(
        handles=[Patch(color=kind_col[k], label=k) for k in ("attention", "prediction", "ffn", "load", "store")],
        ncol=5,
        fontsize=7,
        loc="lower right",
        bbox_to_anchor=(1.0, 1.02),
    )
    fig.suptitle("Per-layer pipeline (model settings): KV load for layer i+1 under layer i's FFN", fontsize=10, y=1.0)
    files.append(finish_figure(fig, out / f"{stem}_timeline.png", dpi=120).name)

    # 2. block breakdown (Fig. 18)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=False)
    for ax, v in zip(axes, ("model", "artifact")):
        b = df[(df.experiment == "block") & (df.variant == v)]
        x = np.arange(len(SCHEMES))
        bottom = np.zeros(len(SCHEMES))
        get = lambda m: np.array([b[(b.scheme == s) & (b.metric == m)].value.iloc[0] for s in SCHEMES])
        att, pred, ffn, tr, blk = get("attention"), get("prediction"), get("ffn"), get("transfer"), get("block")
        # what the block shows: attention and prediction, then the longer of FFN and the load under it
        hidden = np.where(np.array([s == "ideal" for s in SCHEMES]), ffn, np.maximum(0, blk - att - pred))
        for part, lab_, col in ((att, "attention", "#1f77b4"), (pred, "prediction", "#2ca02c")):
            ax.bar(x, part, bottom=bottom, color=col, label=lab_)
            bottom += part
        is_tr = tr > ffn
        ax.bar(x, np.where(is_tr, hidden, 0), bottom=bottom, color="#d62728", label="data transfer")
        ax.bar(x, np.where(is_tr, 0, hidden), bottom=bottom, color="#aec7e8", label="FFN")
        for i, val in enumerate(blk):
            ax.text(i, val, f"{val:.1f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x, [LABEL[s] for s in SCHEMES], fontsize=8)
        ax.set_title(f"{v} settings", fontsize=9)
        ax.set_ylabel("one transformer block (ms)")
    axes[0].legend(fontsize=7)
    fig.suptitle(
        "Block latency, OPT-13B, batch 8, sequence 2,048 (InfiniGen Fig. 18: FlexGen 28.0 ms, 96.9% " "transfer)",
        fontsize=9,
    )
    files.append(finish_figure(fig, out / f"{stem}_block.png", dpi=120).name)

    # 3. speedup by sequence length (Fig. 16a) and 4. throughput by batch (Fig. 15)
    for exp, metric, xlabel, ylabel, fname in (
        ("seqlen", "speedup", "sequence length (prompt + 128)", "speedup over FlexGen (batch 8)", "speedup_seq"),
        ("batch", "throughput", "batch size (1,920 + 128)", "throughput (tokens/s)", "throughput_batch"),
    ):
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), sharey=True)
        for ax, v in zip(axes, VARIANTS):
            d = df[(df.experiment == exp) & (df.variant == v) & (df.metric == metric)]
            for s in SCHEMES:
                if s in ("flexgen", "ideal") and exp == "seqlen":
                    continue
                ds = d[d.scheme == s]
                ax.plot(ds.x.astype(float), ds.value, "o-", color=colors[s], label=LABEL[s])
                dp = ds[np.isfinite(ds.paper)]
                ax.plot(dp.x.astype(float), dp.paper, "*", ms=12, color=colors[s], markeredgecolor="black")
            ax.set_title(f"{v} settings (stars: paper)", fontsize=9)
            ax.set_xticks(sorted({float(x) for x in d.x}))
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel(ylabel)
        axes[0].legend(fontsize=8)
        files.append(finish_figure(fig, out / f"{stem}_{fname}.png", dpi=120).name)
    return files


# ---- the report -----------------------------------------------------------------------------------
def _v(df, exp, variant, scheme, x, metric):
    d = df[(df.experiment == exp) & (df.variant == variant) & (df.scheme == scheme) & (df.metric == metric)]
    d = d[d.x.astype(str) == str(x)]
    return float(d.value.iloc[0]) if len(d) else float("nan")


def _result(*key):
    return lambda rows: _v(rows, *key)


def _top_throughput(setup: str):
    """The highest throughput a serving setup reached over the rates tried."""
    return lambda rows: float(rows[rows["setup"] == setup]["throughput_tok_s"].max())


# The quantities the datasheet-roofline comparison reports (moved.py).
HEADLINES = [
    Headline("FlexGen block, batch 8, 2,048 (ms), model", _result("block", "model", "flexgen", 2048, "block")),
    Headline("Ideal block (ms), model", _result("block", "model", "ideal", 2048, "block")),
    Headline("InfiniGen block / Ideal block, model", _result("block", "model", "infinigen", 2048, "over_ideal")),
    Headline("InfiniGen over FlexGen at 2,048, model", _result("seqlen", "model", "infinigen", 2048, "speedup")),
    Headline("InfiniGen over FlexGen at 2,048, artifact", _result("seqlen", "artifact", "infinigen", 2048, "speedup")),
    Headline("H2O over FlexGen at 2,048, model", _result("seqlen", "model", "h2o", 2048, "speedup")),
    Headline("InfiniGen throughput, batch 20 (tok/s), model", _result("batch", "model", "infinigen", 20, "throughput")),
    Headline(
        "serving: A100-80GB without offload, top tok/s",
        _top_throughput("A100-80GB, no offload"),
        "{:.0f}",
        "infinigen_serving",
    ),
    Headline(
        "serving: A6000 + InfiniGen, top tok/s", _top_throughput("A6000 + InfiniGen"), "{:.0f}", "infinigen_serving"
    ),
    Headline(
        "serving: A6000 without offload, top tok/s", _top_throughput("A6000, no offload"), "{:.0f}", "infinigen_serving"
    ),
]


def _shapes_note(cal) -> str:
    """' and measured GEMM shapes' when the inherited GEMM fit carries them."""
    return " and measured GEMM shapes" if cal.gemm is not None and cal.gemm.measured_shapes is not None else ""


def report(
    df: pd.DataFrame, meta: dict, serve: pd.DataFrame | None, files: list[str], quick: bool, elapsed: float
) -> str:
    V = lambda *a: _v(df, *a)
    fit = meta["fit"]
    seqs = sorted({int(x) for x in df[df.experiment == "seqlen"].x})
    batches = sorted({int(x) for x in df[df.experiment == "batch"].x})
    L = []
    w = L.append
    w("# InfiniGen in the simulator: KV offload with selective prefetch\n")
    w(
        f"Generated by `python -m infersim.analysis.reproduce.infinigen{' --quick' if quick else ''}` on "
        f"{_dt.date.today().isoformat()} ({platform.python_version()}, {elapsed:.0f} s). Paper: InfiniGen (Lee et al., "
        "OSDI 2024, arXiv:2406.19707) sections 5.3 and 6.2. Everything here is the cost model "
        "(`simulator/offload/`), not a GPU measurement.\n"
    )
    w("## Setup\n")
    cal = load_hardware(HW).calibration
    w(
        "OPT-13B (fp16, 25.7 GB of weights, all on the GPU), RTX A6000 profile (154.8 TFLOP/s, 768 GB/s; kernels "
        f"priced by the {cal.inherits} GEMM and elementwise fits{_shapes_note(cal)} the profile inherits, on its own peaks; "
        f"each step also pays the profile's engine overhead per iteration, "
        f"{load_hardware(HW).overheads.iteration_us / 1e3:g} ms, vLLM's, carried from the A100-80GB SXM) with the "
        "`pcie3x16` host link (12.6 GB/s each way: 80% of PCIe 3.0 x16), 96 GB host "
        "memory. A batch of sequences is prefilled and then decodes 127 steps (128 tokens), as FlexGen runs it; "
        "throughput is batch x 128 / (prefill + decode), as the paper's Fig. 15. Policies (`simulator/offload/"
        "policies.py`): FlexGen loads every layer's full fp16 KV; INT4 loads 4-bit groups of 64 plus an fp16 scale and "
        "minimum per group (0.281 of the bytes) and dequantizes on the GPU; H2O keeps 20% of the final length "
        "(409 tokens at 2,048) for good; InfiniGen loads, per layer, the tokens whose predicted score is above "
        "max - 4 (the count from `simulator/catalog/sparsity/opt-13b.yaml`: 37 / 60 / 66 / 73 at 512 / 1,024 / "
        "1,536 / 2,048, the paper's section 5.3), at most 20% of the KV, after a partial-weight prediction in the "
        "layer before; Ideal keeps everything on the GPU (it would not fit at batch 20; the cost model does not "
        "care).\n"
    )
    w("Three settings of the constants the paper does not pin down:\n")
    w("| setting | pipeline | KV store (d2h) | InfiniGen | INT4 kernels | per-layer runtime cost |")
    w("|---|---|---|---|---|---|")
    w(
        "| **model** (our defaults) | every policy: load of layer i+1 under layer i's FFN | 12.6 GB/s (link) | "
        "ratio 0.3, cap 20%, predicted from layer 1 | one fused pass | 0 |"
    )
    w(
        f"| **artifact** (InfiniGen's scripts) | baselines `--overlap false` (load, compute, store in turn); "
        f"InfiniGen prefetch under the FFN | {FLEXGEN_STORE_GBPS:.2f} GB/s (FlexGen's fitted cache store, 0.97 GiB/s; "
        "the artifact's KV home is pageable) | ratio 0.2, cap 20% of the final length (409 tokens at 2,048), layers 0-1 in full | FlexGen's PyTorch "
        "ops (13 B/element to dequantize) | 0 |"
    )
    w(
        f"| **fitted** | as artifact | {fit['kv_store_gbps']:.2f} GB/s (fitted) | as artifact | as artifact | "
        f"{fit['layer_overhead_us'] / 1e3:.2f} ms (fitted) |\n"
    )
    w(
        f"The fitted setting takes two constants from two of the paper's numbers, InfiniGen's throughput at batch 4 "
        f"and 20 (27.36 and 41.99 tokens/s; the fit gives {fit['thr4']:.2f} and {fit['thr20']:.2f}); every other "
        "fitted-setting number below is out of sample. Source of each artifact constant: `speedup/scripts/figure15/"
        "run.sh` and `figure16a/run.sh` (`--overlap false`, `--partial-weight-ratio 0.2`, `--max-num-kv 409` "
        "in figure 15 and `(prompt + 128) / 5` in figure 16a, for H2O and InfiniGen alike), `speedup/flexgen/infinigen/flex_opt.py` (attention layers 0 and 1 "
        "load the full cache; the prefetch for the next attention layer is issued after the attention and overlaps "
        "the MLP), FlexGen `compression.py` (the dequantize op sequence) and FlexGen's cost-model constants "
        "(FlexGen's fitted cost model, https://github.com/FMInference/FlexGen).\n"
    )

    # ---- headline table
    def thr(v, s, b):
        return V("batch", v, s, b, "throughput")

    b_lo, b_hi = batches[0], batches[-1]
    w("## Key numbers beside the paper's\n")
    w("| quantity | paper | model | artifact | fitted |")
    w("|---|---|---|---|---|")
    rowsk = [
        ("FlexGen block, batch 8, 2,048 (ms)", "28.0", lambda v: f"{V('block', v, 'flexgen', 2048, 'block'):.1f}"),
        (
            "FlexGen block: data-transfer share",
            "96.9%",
            lambda v: f"{100 * V('block', v, 'flexgen', 2048, 'transfer_share'):.1f}%",
        ),
        (
            "H2O block: data-transfer share",
            "91.8%",
            lambda v: f"{100 * V('block', v, 'h2o', 2048, 'transfer_share'):.1f}%",
        ),
        ("InfiniGen block / Ideal block", "1.52x", lambda v: f"{V('block', v, 'infinigen', 2048, 'over_ideal'):.2f}x"),
        (
            "speedup over FlexGen at 2,048, batch 8: InfiniGen",
            "5.28x",
            lambda v: f"{V('seqlen', v, 'infinigen', seqs[-1], 'speedup'):.2f}x",
        ),
        ("... H2O", "3.40x", lambda v: f"{V('seqlen', v, 'h2o', seqs[-1], 'speedup'):.2f}x"),
        ("... INT4", "1.92x", lambda v: f"{V('seqlen', v, 'int4', seqs[-1], 'speedup'):.2f}x"),
        (
            f"throughput batch {b_lo} -> {b_hi} (tok/s): InfiniGen",
            "27.36 -> 41.99",
            lambda v: f"{thr(v, 'infinigen', b_lo):.2f} -> {thr(v, 'infinigen', b_hi):.2f}",
        ),
        ("... H2O", "21.31 -> 25.70", lambda v: f"{thr(v, 'h2o', b_lo):.2f} -> {thr(v, 'h2o', b_hi):.2f}"),
        ("... INT4", "12.22 -> 14.02", lambda v: f"{thr(v, 'int4', b_lo):.2f} -> {thr(v, 'int4', b_hi):.2f}"),
        (
            f"InfiniGen over H2O at batch {b_hi}",
            "1.63x",
            lambda v: f"{thr(v, 'infinigen', b_hi) / thr(v, 'h2o', b_hi):.2f}x",
        ),
    ]
    for name, paper, f in rowsk:
        w(f"| {name} | {paper} | " + " | ".join(f(v) for v in VARIANTS) + " |")
    w(
        "\nFitted: the two InfiniGen throughputs are matched by construction; the rest is out of sample. The "
        "model setting is the simulator's prediction with no knowledge of the paper's measurements.\n"
    )

    # ---- finding 1
    w("## Finding 1: with the full KV offloaded, a block is almost all data transfer\n")
    w("One transformer block (layer 20) in a decode step, batch 8, context 1,984 (mid-way through 1,920 + 128):\n")
    w("| | " + " | ".join(LABEL[s] for s in SCHEMES) + " |")
    w("|---|" + "---|" * len(SCHEMES))
    for v in ("model", "artifact", "fitted"):
        w(f"| block ms, {v} | " + " | ".join(f"{V('block', v, s, 2048, 'block'):.2f}" for s in SCHEMES) + " |")
    w("| block ms, paper | 28.0 | - | - | 2.29 (1.52 x Ideal) | 1.51 (28.0 / 18.55) |")
    for v in ("model", "artifact"):
        w(
            f"| transfer share, {v} | "
            + " | ".join(f"{100 * V('block', v, s, 2048, 'transfer_share'):.1f}%" for s in SCHEMES)
            + " |"
        )
    w("| transfer share, paper | 96.9% | - | 91.8% | - | - |")
    for v in ("model", "artifact"):
        w(f"| x Ideal, {v} | " + " | ".join(f"{V('block', v, s, 2048, 'over_ideal'):.2f}" for s in SCHEMES) + " |")
    w("| x Ideal, paper | 18.55 | 3.90-18.55 | 3.90-18.55 | 1.52 | 1 |\n")
    fs = V("block", "model", "flexgen", 2048, "transfer_share")
    tlb = 2.0 * 5120 * 2  # OPT-13B: K and V of one token in one layer, fp16
    ctx = PROMPT + GEN // 2
    over = {s: V("block", "model", s, 2048, "over_ideal") for s in ("flexgen", "int4", "h2o")}
    ideal_ms = V("block", "model", "ideal", 2048, "block")
    w(
        f"**Holds.** FlexGen's block is {V('block', 'model', 'flexgen', 2048, 'block'):.1f} ms, "
        f"{100 * fs:.1f}% of it loading {8 * ctx * tlb / 1e6:.0f} MB of KV at 12.6 GB/s (paper: 28.0 ms, 96.9%); "
        f"H2O's block is {100 * V('block', 'model', 'h2o', 2048, 'transfer_share'):.1f}% transfer (paper 91.8%). "
        f"The other methods run {min(over.values()):.2f}-{max(over.values()):.2f}x slower than Ideal "
        "(paper 3.90-18.55x), H2O the least. InfiniGen comes out "
        f"{'faster than Ideal' if V('block', 'model', 'infinigen', 2048, 'over_ideal') < 1 else 'closer to Ideal'} "
        "where the paper measures 1.52x "
        f"({V('block', 'model', 'infinigen', 2048, 'over_ideal'):.2f}x model, "
        f"{V('block', 'artifact', 'infinigen', 2048, 'over_ideal'):.2f}x artifact): its attention reads 73 of "
        f"{ctx:,} tokens per sequence where Ideal's reads all of them; at 73 tokens x 8 sequences a "
        f"layer loads {8 * 73 * tlb / 1e6:.0f} MB, about as long as the FFN it hides under, and the cost model charges "
        f"the prediction (a 0.3 x 5,120 x 5,120 partial projection and scores over 8 x {ctx:,} partial keys) "
        f"{1e3 * V('block', 'model', 'infinigen', 2048, 'prediction'):.0f} us. The real prediction is a dozen eager "
        "PyTorch kernels (projection, score matmul, max, threshold, count, mean over heads, top-k) followed by a gather "
        "of the chosen rows from CPU memory: costs a per-kernel cost model does not see. The paper's Ideal block "
        f"(1.51 ms) is {1.51 / ideal_ms:.2f}x the model's ({ideal_ms:.2f} ms), whose GEMM and elementwise times are "
        f"fitted to measured kernels (the datasheet roofline's is in the last section). Plot: `{files[1] if len(files) > 1 else ''}`; the per-layer pipeline (Fig. 3) of one "
        f"decode step is `{files[0] if files else ''}`.\n"
    )

    # ---- finding 2
    w("## Finding 2: InfiniGen's speedup over FlexGen grows with sequence length; H2O's and INT4's flatten\n")
    w("Speedup over FlexGen (end to end: prefill + 127 decode steps), batch 8, prompt + 128 tokens:\n")
    w("| setting | scheme | " + " | ".join(str(x) for x in seqs) + " | growth, last step | paper (max, at 2,048) |")
    w("|---|---|" + "---|" * len(seqs) + "---|---|")
    growth = {}
    for v in VARIANTS:
        for s in ("int4", "h2o", "infinigen"):
            vals = [V("seqlen", v, s, x, "speedup") for x in seqs]
            g = vals[-1] / vals[-2] - 1 if len(vals) > 1 else float("nan")
            growth[(v, s)] = g
            w(
                f"| {v} | {LABEL[s]} | " + " | ".join(f"{x:.2f}" for x in vals) + f" | {100 * g:+.1f}% | "
                f"{PAPER['speedup_2048'][s]:.2f} |"
            )
    w("")
    ok_model = growth[("model", "infinigen")] > 2 * max(growth[("model", "h2o")], growth[("model", "int4")])
    w(
        f"**{'Holds' if ok_model else 'Does not hold'} in the model setting**: from "
        f"{seqs[-2]} to {seqs[-1]} tokens InfiniGen's speedup still grows "
        f"{100 * growth[('model', 'infinigen')]:.0f}% while H2O's grows {100 * growth[('model', 'h2o')]:.0f}% and "
        f"INT4's {100 * growth[('model', 'int4')]:.0f}%. The mechanism is the paper's: FlexGen's load grows "
        "linearly with the context, INT4 loads a constant 28% of it and H2O a constant 20% of the final length, so "
        "both speedups tend to a constant, while InfiniGen loads 37 -> 73 tokens for 4x the context (the "
        "important-token count grows ~c^0.5). The levels are higher than the paper's because the model setting "
        "has no runtime overhead and overlaps every policy's loads.\n"
    )
    ga = growth[("artifact", "infinigen")]
    pre = V("seqlen", "artifact", "infinigen", seqs[-1], "prefill_s")
    dec = V("seqlen", "artifact", "infinigen", seqs[-1], "decode_s")
    w(
        f"In the artifact setting the separation fades (last step: InfiniGen {100 * ga:+.1f}%, H2O "
        f"{100 * growth[('artifact', 'h2o')]:+.1f}%, INT4 {100 * growth[('artifact', 'int4')]:+.1f}%); the fitted "
        f"setting sits between (InfiniGen {100 * growth[('fitted', 'infinigen')]:+.1f}%, H2O "
        f"{100 * growth[('fitted', 'h2o')]:+.1f}%, INT4 {100 * growth[('fitted', 'int4')]:+.1f}%). With the artifact's "
        f"slow KV store, InfiniGen's prefill ({pre:.1f} s at {seqs[-1]:,} tokens: the fp16 KV of 8 x "
        f"{seqs[-1] - GEN:,} tokens written to CPU memory at ~1 GB/s) is as long as its whole decode ({dec:.1f} s), and "
        "it grows with the prompt for InfiniGen exactly as for FlexGen, whereas H2O stores only its 20% budget. "
        "The levels at 2,048 are close to the paper's in both the artifact setting (InfiniGen "
        f"{V('seqlen', 'artifact', 'infinigen', seqs[-1], 'speedup'):.2f} vs 5.28, H2O "
        f"{V('seqlen', 'artifact', 'h2o', seqs[-1], 'speedup'):.2f} vs 3.40, INT4 "
        f"{V('seqlen', 'artifact', 'int4', seqs[-1], 'speedup'):.2f} vs 1.92) and the fitted one (InfiniGen "
        f"{V('seqlen', 'fitted', 'infinigen', seqs[-1], 'speedup'):.2f}, H2O "
        f"{V('seqlen', 'fitted', 'h2o', seqs[-1], 'speedup'):.2f}, INT4 "
        f"{V('seqlen', 'fitted', 'int4', seqs[-1], 'speedup'):.2f}, all out of sample), which suggests the store and "
        "the fixed per-layer cost of the paper's machine are of that order. The paper states the shape (InfiniGen keeps "
        "rising, INT4 and H2O saturate) but gives Fig. 16(a)'s values only at their maximum, and its prefill/decode "
        "split only as bars (Fig. 14); so its text cannot tell whether its H2O curve is as flat as our model "
        "setting's or rises like our artifact setting's. Where they differ, the difference is the prefill's KV store. "
        "Plot: "
        f"`{files[2] if len(files) > 2 else ''}`.\n"
    )

    # ---- finding 3
    w("## Finding 3: throughput rises with batch size for InfiniGen much more than for H2O and INT4\n")
    w("Throughput (tokens/s), 1,920 + 128 tokens:\n")
    w("| setting | scheme | " + " | ".join(f"b={b}" for b in batches) + f" | b={batches[-1]} / b={batches[0]} |")
    w("|---|---|" + "---|" * len(batches) + "---|")
    gain = {}
    for v in VARIANTS + ("paper",):
        for s in ("flexgen", "int4", "h2o", "infinigen"):
            if v == "paper":
                if s not in PAPER["throughput"]:
                    continue
                lo, hi = PAPER["throughput"][s]
                cells = [f"{lo:.2f}" if b == 4 else (f"{hi:.2f}" if b == 20 else "-") for b in batches]
                gain[(v, s)] = hi / lo
            else:
                vals = [V("batch", v, s, b, "throughput") for b in batches]
                cells = [f"{x:.2f}" for x in vals]
                gain[(v, s)] = vals[-1] / vals[0]
            w(f"| {v} | {LABEL[s]} | " + " | ".join(cells) + f" | {gain[(v, s)]:.2f}x |")
    w("")
    holds3 = gain[("model", "infinigen")] > max(gain[("model", "h2o")], gain[("model", "int4")])
    w(
        f"**{'Holds' if holds3 else 'Does not hold'} in the model setting, weaker than in the paper**: "
        f"InfiniGen gains {gain[('model', 'infinigen')]:.2f}x from batch {batches[0]} to {batches[-1]}, H2O "
        f"{gain[('model', 'h2o')]:.2f}x, INT4 {gain[('model', 'int4')]:.2f}x (paper 1.53x, 1.21x, 1.15x); FlexGen "
        f"stays flat ({gain[('model', 'flexgen')]:.2f}x: its latency grows linearly with batch, as the paper says). "
        "Batching helps only what does not scale with the batch: the weights read once per layer and the fixed "
        "per-layer costs. InfiniGen's loads are small enough for those to matter; FlexGen's, INT4's and H2O's "
        "loads grow with the batch and keep them transfer-bound. In the artifact setting InfiniGen gains only "
        f"{gain[('artifact', 'infinigen')]:.2f}x (H2O {gain[('artifact', 'h2o')]:.2f}x): its slow full-KV prefill "
        "store grows with the batch too. The fitted setting matches the paper's InfiniGen end points by "
        f"construction, and predicts H2O at {V('batch', 'fitted', 'h2o', 4, 'throughput'):.1f} -> "
        f"{V('batch', 'fitted', 'h2o', batches[-1], 'throughput'):.1f} (paper 21.31 -> 25.70) and INT4 at "
        f"{V('batch', 'fitted', 'int4', 4, 'throughput'):.1f} -> {V('batch', 'fitted', 'int4', batches[-1], 'throughput'):.1f}"
        " (paper 12.22 -> 14.02).\n"
    )
    w(
        f"What the fit says: to turn InfiniGen's batch-4 and batch-20 throughput into the paper's, the artifact "
        f"setting needs a fixed {fit['layer_overhead_us'] / 1e3:.2f} ms per layer per step that does not grow "
        f"with batch or context, and KV stores at {fit['kv_store_gbps']:.1f} GB/s (between FlexGen's fitted "
        "0.97 GiB/s and the link's 12.6). A fixed cost of that size is what an eager PyTorch runtime pays in kernel "
        "launches, Python dispatch and the per-layer synchronisations of FlexGen's loop (an InfiniGen layer issues "
        "dozens of kernels plus a CPU-side gather of the chosen rows). It is the main thing the per-kernel cost model "
        "lacks for this system, and the executor's profiler should measure it. The same overhead would put the "
        f"Ideal block at {V('block', 'fitted', 'ideal', 2048, 'block'):.2f} ms where Fig. 18 shows 1.51 ms: either "
        "Fig. 18 times kernels rather than wall clock, or the fixed cost belongs to the offloading path "
        "(synchronisations, the CPU gather) more than to the layer itself; the paper does not say how Fig. 18 was "
        "timed.\n"
    )
    b20 = {s: V("batch", v, s, batches[-1], "throughput") for v in ("model",) for s in SCHEMES}
    w(
        f"At batch {batches[-1]} (Fig. 14) InfiniGen is {b20['infinigen'] / b20['h2o']:.2f}x faster than H2O in the "
        f"model setting, {V('batch', 'artifact', 'infinigen', batches[-1], 'throughput') / V('batch', 'artifact', 'h2o', batches[-1], 'throughput'):.2f}x "
        f"in the artifact setting and {V('batch', 'fitted', 'infinigen', batches[-1], 'throughput') / V('batch', 'fitted', 'h2o', batches[-1], 'throughput'):.2f}x fitted "
        f"(paper 1.63x). Plot: `{files[3] if len(files) > 3 else ''}`.\n"
    )

    # ---- model sizes
    if not quick and (df.experiment == "models").any():
        w("## Model size (Fig. 16(b)), batch 4, 1,920 + 128\n")
        w(
            "OPT-30B keeps 70% of its weights on the GPU and streams the rest every layer (the paper offloads 30%). "
            "The sparsity data of OPT-13B stands in for 6.7B and 30B (none published).\n"
        )
        w("| setting | scheme | OPT-6.7B | OPT-13B | OPT-30B |")
        w("|---|---|---|---|---|")
        for v in VARIANTS:
            for s in ("int4", "h2o", "infinigen"):
                w(
                    f"| {v} | {LABEL[s]} | "
                    + " | ".join(f"{V('models', v, s, m, 'speedup'):.2f}" for m in ("opt-6.7b", "opt-13b", "opt-30b"))
                    + " |"
                )
        w("| paper | InfiniGen / others | - | - | 1.34 / 1.18, 1.28 |\n")
        r = V("models", "model", "infinigen", "opt-13b", "speedup") / V(
            "models", "model", "infinigen", "opt-6.7b", "speedup"
        )
        rf = V("models", "fitted", "infinigen", "opt-13b", "speedup") / V(
            "models", "fitted", "infinigen", "opt-6.7b", "speedup"
        )
        w30 = 0.3 * load_model("opt-30b").weight_bytes("fp16") / 1e9
        w(
            f"From 6.7B to 13B InfiniGen's speedup changes {r:.2f}x in the model setting and {rf:.2f}x in the fitted "
            "one (paper: grows 1.17x). The paper attributes its growth to the larger model's more layers, each loading "
            "fewer tokens with InfiniGen than with H2O; in the model both models have the same per-layer token counts "
            "(OPT-13B's sparsity data stands in for 6.7B), so the ratio to FlexGen hardly moves"
            + (" - it does not reproduce without per-model sparsity data. " if r < 1.05 else ". ")
            + f"At 30B the weight stream ({w30:.0f} GB per decode step over 12.6 GB/s) dominates every policy and all "
            "speedups fall to 1.3-1.6x, as in the paper (InfiniGen 1.34x, the others 1.18x and 1.28x).\n"
        )

    # ---- proxies
    w("## Quality proxies beside speed\n")
    w(
        "Relative KV size = the KV a decoding query attends over, in bytes, relative to all tokens in fp16 (the "
        "x-axis of the paper's Fig. 11); attention mass kept = the mass a best-case selection of that many tokens "
        "keeps when the important tokens hold 0.9 of it (`important_mass` in the sparsity data) and the rest is "
        "spread evenly. **These are proxies, not accuracy**: they cannot see H2O's permanent eviction (its mass is an "
        "upper bound), InfiniGen's mispredictions, or quantization error (INT4's mass is 1 by construction).\n"
    )
    w(
        "| setting | scheme | "
        + " | ".join(f"KV size @{x}" for x in seqs)
        + " | "
        + " | ".join(f"mass @{x}" for x in seqs)
        + " |"
    )
    w("|---|---|" + "---|" * (2 * len(seqs)))
    for v in ("model", "artifact"):
        for s in SCHEMES:
            w(
                f"| {v} | {LABEL[s]} | "
                + " | ".join(f"{100 * V('proxy', v, s, x, 'relative_kv_size'):.1f}%" for x in seqs)
                + " | "
                + " | ".join(f"{V('proxy', v, s, x, 'attention_mass'):.3f}" for x in seqs)
                + " |"
            )
    w("")
    w(
        f"InfiniGen attends over {100 * V('proxy', 'model', 'infinigen', seqs[-1], 'relative_kv_size'):.1f}% of the KV "
        "at 2,048 averaged over layers (layer 0 in full, 73 tokens elsewhere): the paper's 'less than 10% of the KV "
        "cache on average across layers' at alpha 4.\n"
    )
    w("| context | important tokens, data | paper (OPT-13B, alpha 4) |")
    w("|---|---|---|")
    for x in (512, 1024, 1536, 2048):
        w(
            f"| {x} | {V('important', 'data', 'infinigen', x, 'important_tokens'):.0f} | "
            f"{PAPER['important_tokens'][x]} |"
        )
    w("")

    # ---- serving
    if serve is not None and len(serve):
        w("## The capacity question in the serving simulator\n")
        w(
            "`examples/offload/a6000-infinigen.yaml` against `examples/offload/a100-no-offload.yaml` (they differ "
            "only in `hardware` and `offload`), plus the A6000 with FlexGen and without offload: OPT-13B, prompts "
            "uniform in 1,024-1,920 tokens, 128 generated, Poisson arrivals, continuous batching (FCFS, recompute), "
            "max batch 64, model settings.\n"
        )
        w(
            "| setup | KV pool (tokens) | rate (req/s) | throughput (tok/s) | mean e2e (s) | p90 e2e (s) | "
            "mean TPOT (s) | mean batch | KV size | mass |"
        )
        w("|---|---|---|---|---|---|---|---|---|---|")
        for _, r in serve.iterrows():
            w(
                f"| {r.setup} | {int(r.kv_pool_tokens):,} | {r.rate:g} | {r.throughput_tok_s:.1f} | "
                f"{r.e2e_mean_s:.1f} | {r.e2e_p90_s:.1f} | {r.tpot_mean_s:.3f} | {r.batch_mean:.1f} | "
                f"{100 * r.relative_kv_size:.0f}% | {r.attention_mass_kept:.2f} |"
            )
        w("")
        w(_serving_text(serve))
    w("## What is not modelled\n")
    w(
        "- UVM (the paper's 32.93x baseline): page-fault behaviour is not in the cost model.\n"
        "- Accuracy: only the two proxies above. Perplexity and the important-token counts per layer of a real "
        "model are measured by the executor (infinigen-executor.md, on zoo-target); OPT-13B's sparsity data has "
        "no `layer_scale`.\n"
        "- CPU-side work: the gather of InfiniGen's chosen rows, H2O's score bookkeeping and the counter/LRU/FIFO "
        "victim updates of a limited CPU pool cost nothing here; the pool limit changes capacity and the mass proxy "
        "only.\n"
        "- Prefill attention is costed as a fused kernel; FlexGen's prefill materialises the score matrix.\n"
        "- The per-layer breakdown is of a single block at a mid-decode context; end-to-end numbers integrate every "
        "step exactly.\n"
    )
    w("## Files\n")
    w(
        f"`infinigen{'_quick' if quick else ''}.csv` (every number above, long form: experiment, variant, scheme, x, "
        "metric, value, paper), "
        + ("`infinigen_serving.csv` (the serving runs), " if serve is not None else "")
        + ", ".join(f"`{f}`" for f in files)
        + ".\n"
    )
    return "\n".join(L)


def _serving_text(serve: pd.DataFrame) -> str:
    def best(setup):
        d = serve[serve.setup == setup]
        return float(d.throughput_tok_s.max()), d

    out = []
    tops = {s: best(s)[0] for s in serve.setup.unique()}
    a6k, a100 = tops.get("A6000 + InfiniGen", float("nan")), tops.get("A100-80GB, no offload", float("nan"))
    noff, flex = tops.get("A6000, no offload", float("nan")), tops.get("A6000 + FlexGen", float("nan"))
    pool = {s: int(serve[serve.setup == s].kv_pool_tokens.iloc[0]) for s in serve.setup.unique()}
    per_seq = (1024 + 1920) / 2 + 128
    ig_pool, no_pool = pool.get("A6000 + InfiniGen", 0), pool.get("A6000, no offload", 1)
    out.append(
        f"Highest throughput reached over the rates tried: A100 without offload {a100:.0f} tokens/s, A6000 "
        f"with InfiniGen {a6k:.0f}, A6000 without offload {noff:.0f}, A6000 with FlexGen {flex:.0f}. "
        f"For this workload one A100-80GB does the work of about {a100 / a6k:.1f} A6000s with InfiniGen. "
        f"Offload lets the A6000 hold {ig_pool / no_pool:.1f}x more tokens ({ig_pool:,} instead of "
        f"{no_pool:,}: the pool is host memory, bounded here by InfiniGen's partial key cache on the GPU), "
        "but every decode step then loads layer 0's full KV and ~70 tokens per sequence of every other layer "
        "over PCIe 3.0, so a large batch buys less than it costs; "
        + (
            f"the A6000 without offload, limited to about {no_pool / per_seq:.0f} sequences of this workload, "
            "still serves more tokens per second than with InfiniGen in this model. "
            if noff > a6k
            else "with InfiniGen the A6000 serves more than without offload. "
        )
        + "Where offload wins is where the batch or the context does not fit at all (longer contexts, "
        "bigger models), which this workload does not reach on the A100.\n"
    )
    return "".join(out)


def main(argv=None) -> int:
    ap = reproduction_parser(
        "infersim.analysis.reproduce.infinigen", __doc__, "fewer points, no serving runs (a few seconds)"
    )
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "infinigen_quick" if args.quick else "infinigen"
    t0 = time.time()
    df, meta = experiments(args.quick)
    serve = None if args.quick else serving(args.quick)
    files = plots(df, meta, out, stem)
    write_atomic(out / f"{stem}.csv", df.to_csv(index=False))
    if serve is not None:
        write_atomic(out / f"{stem}_serving.csv", serve.to_csv(index=False))
    text = report(df, meta, serve, files, args.quick, time.time() - t0)
    if serve is not None:
        text += "\n" + moved_section({stem: df, f"{stem}_serving": serve}, out, HEADLINES)
    write_atomic(out / f"{stem}.md", text)
    print(f"wrote {out / (stem + '.md')} ({time.time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
