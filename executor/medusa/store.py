"""Trained heads cached next to the zoo: <zoo folder>/medusa/<target>-<key>/ with
heads.safetensors + medusa.json. The key hashes the target's weight hash, the training recipe
and the heads' format version, so a retrained target (or a changed recipe) trains new heads
instead of reusing stale ones; the folder appears atomically, under a lock, so concurrent
callers train once."""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from infersim.simulator.errors import InfersimError
from infersim.simulator.paths import home_relative
from infersim.simulator.progress import log_line

from ..models import load_model
from ..zoo.build import _locked, weights_sha256
from .accuracy import measure
from .heads import FORMAT_VERSION, META_FILE, MedusaHeads, load_heads, save_heads
from .train import DEFAULT_RECIPE, MedusaRecipe, corpus_streams, train_heads


def _is_cpu_fp32(lm) -> bool:
    return lm.device.type == "cpu" and str(lm.dtype) == "torch.float32"


def _cpu_fp32_copy(lm):
    """The same checkpoint loaded on the CPU in fp32: what heads are trained on and keyed by."""
    return lm if _is_cpu_fp32(lm) else load_model(str(lm.path), "cpu", "fp32", build_zoo=False)


def _fp32_reference(lm):
    """(the hash of the target checkpoint's weights in fp32, the fp32 CPU model it was computed
    on, or None where a zoo model's recorded hash saved loading one)."""
    if _is_cpu_fp32(lm):
        return weights_sha256(lm.model), lm
    recorded = (lm.meta or {}).get("weights_sha256")
    if recorded:
        return recorded, None
    copy = _cpu_fp32_copy(lm)
    return weights_sha256(copy.model), copy


def target_sha256(lm) -> str:
    """The hash of the target checkpoint's weights in fp32 (the function the zoo records in
    zoo.json), whatever device and dtype `lm` is loaded in: heads trained for a checkpoint
    serve it in fp16 on a GPU as well. A zoo model's recorded hash saves loading an fp32 copy."""
    return _fp32_reference(lm)[0]


def heads_key(target_sha: str, recipe: MedusaRecipe) -> str:
    payload = f"{FORMAT_VERSION}|{target_sha}|{recipe.canonical_json()}"
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def heads_dir(
    lm, recipe: MedusaRecipe = DEFAULT_RECIPE, root: Path | None = None, target_sha: str | None = None
) -> Path:
    """Where the heads for this target and recipe live: beside the zoo's checkpoints (the
    target's parent folder) unless `root` says otherwise."""
    sha = target_sha or target_sha256(lm)
    base = Path(root) if root else Path(lm.path).parent / "medusa"
    return base / f"{Path(lm.path).name}-{heads_key(sha, recipe)}"


def _progress_callback():
    """A rich progress bar on a terminal; none otherwise (CI logs, tests)."""
    if not sys.stderr.isatty():
        return None, None

    prog = Progress(
        TextColumn("medusa {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        transient=True,
    )
    tasks: dict[str, int] = {}

    def cb(stage: str, advance: int, total: int):
        if stage not in tasks:
            tasks[stage] = prog.add_task(stage, total=total)
        prog.advance(tasks[stage], advance)

    return prog, cb


def ensure_heads(
    lm, recipe: MedusaRecipe = DEFAULT_RECIPE, root: Path | None = None, retrain: bool = False, log=None
) -> tuple[MedusaHeads, dict, Path]:
    """The cached heads for this target and recipe, trained (and their accuracies measured)
    first if missing. Returns (heads on the target's device, medusa.json, folder)."""
    if lm.family not in ("llama", "mistral"):
        raise InfersimError(f"Medusa heads are implemented for Llama-family targets, not {lm.family}")
    sha, reference = _fp32_reference(lm)
    folder = heads_dir(lm, recipe, root, sha)
    if (folder / META_FILE).exists() and not retrain:
        heads, meta = load_heads(folder, sha, lm.device)
        return heads, meta, folder
    log = log or log_line
    with _locked(folder.parent / f"{folder.name}.lock"):
        if (folder / META_FILE).exists() and not retrain:  # trained by someone else meanwhile
            heads, meta = load_heads(folder, sha, lm.device)
            return heads, meta, folder
        if lm.tokenizer is None:
            raise InfersimError(f"{lm.path}: no tokenizer.json: Medusa self-distillation needs the target's tokenizer")
        # heads train on the CPU in fp32 (the copy the hash was taken on, if one was loaded),
        # then serve on lm's device
        trainee = reference or _cpu_fp32_copy(lm)
        log(f"medusa: training {recipe.num_heads} heads on {lm.name} (self-distillation, {recipe.steps} steps)")
        t0 = time.perf_counter()
        train_stream, held_stream = corpus_streams(lm.tokenizer, recipe.files_every)
        prog, cb = _progress_callback()
        if prog:
            prog.start()
        try:
            heads, stats = train_heads(trainee.model, train_stream, recipe, log=log, progress=cb)
        finally:
            if prog:
                prog.stop()
        acc = measure(
            trainee.model,
            heads,
            held_stream,
            recipe.eval_prompts,
            recipe.eval_prompt_len,
            recipe.eval_gen_len,
            recipe.top_k,
        )
        meta = {
            "target": lm.name,
            "target_path": home_relative(lm.path),
            "target_sha256": sha,
            "recipe": recipe.__dict__,
            "key": folder.name,
            **stats,
            "total_seconds": time.perf_counter() - t0,
            "accuracies": acc,
        }
        save_heads(heads, folder, meta)
        log(f"medusa: heads saved to {folder} ({meta['total_seconds']:.0f} s)")
    heads, meta = load_heads(folder, sha, lm.device)
    return heads, meta, folder
