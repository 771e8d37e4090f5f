"""`python -m infersim.executor.speculative.record`: the zoo's acceptance table
(simulator/catalog/acceptance/zoo-target.yaml), recorded from real verification rounds of
each zoo draft by zoo-target on held-out prompts (acceptance.py has the recording and the
table format)."""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import numpy as np
from rich.progress import Progress

from ..prompts import make_prompts
from .acceptance import write_acceptance_table

ZOO_DRAFTS = ("zoo-draft-a", "zoo-draft-b", "zoo-draft-c", "zoo-opt")
DATASET = "stdlib-heldout"


def record_zoo(out: Path, *, s: int = 5, requests: int = 24, output: int = 96, seed: int = 0, quiet: bool = False):
    """Greedy acceptance of each zoo draft (and of the Minions ensemble of drafts a, b, c with
    fixed s) by zoo-target on held-out prompts, at speculation length s, as table entries."""
    import torch

    from ..models import load_model
    from .build import DecoderOptions, build_decoder, make_sequences

    torch.manual_seed(seed)
    target = load_model("zoo-target")
    rng = np.random.default_rng([seed, 5])
    lengths = rng.integers(32, 161, requests).tolist()
    prompts = make_prompts(lengths, tokenizer=target.tokenizer, vocab_size=target.vocab_size, seed=seed)
    runs = [(name, "draft", [name]) for name in ZOO_DRAFTS]
    runs.append(("minions(a+b+c)", "minions", list(ZOO_DRAFTS[:3])))
    entries = []
    how = (
        f"{requests} held-out prompts of 32-160 tokens (executor/prompts.py, seed {seed}), {output} output "
        f"tokens each, batch {requests}, greedy, s = {s}; rounds cut short by a request's end left out"
    )
    with Progress(transient=True, disable=quiet) as prog:
        task = prog.add_task("recording acceptance", total=len(runs))
        for label, method, names in runs:
            dec = build_decoder(
                target,
                [load_model(n) for n in names],
                DecoderOptions(method=method, s=s, gpu_blocks=2048, max_batch_size=requests, seed=seed),
            )
            dec.generate(make_sequences(prompts, output, len(names)))
            rec = dec.stats.recorder.at(s)
            entries.append(rec.entry(label, DATASET, source=f"measured: {rec.rounds} rounds; {how}"))
            prog.advance(task)
    drafts = {n: n for n in ZOO_DRAFTS}
    drafts["minions(a+b+c)"] = "zoo-draft-a"
    notes = (
        f"Recorded by `python -m infersim.executor.speculative.record` with torch {torch.__version__} on "
        f"{platform.machine()}. kind empirical: counts[k] = rounds in which exactly k of the s drafted tokens "
        f"were accepted (the simulator turns them into positional probabilities). The `drafts` map names "
        f"the zoo checkpoint each label's steps would cost (the simulator's catalog has no zoo models: a "
        f"workload gives a costable model in its draft's `model`). minions(a+b+c): the majority-voted draft "
        f"of zoo-draft-a/b/c with weights updated from their ACR (executor/speculative/minions.py), s fixed."
    )
    return write_acceptance_table(
        out,
        target="zoo-target",
        entries=entries,
        drafts=drafts,
        notes=notes,
        source="infersim executor, zoo models (executor/zoo), held-out stdlib text",
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="record the zoo's acceptance table (greedy, by position)")
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "simulator" / "catalog" / "acceptance" / "zoo-target.yaml",
    )
    ap.add_argument("--s", type=int, default=5)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--output", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    path = record_zoo(args.out, s=args.s, requests=args.requests, output=args.output, seed=args.seed)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
