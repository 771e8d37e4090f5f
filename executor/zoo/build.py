"""`sim zoo build`: train the zoo's tokenizer and models once, cache them on disk.

Layout: <root>/<key>/ with tokenizer/ and one Hugging Face checkpoint folder per model
(config.json, model.safetensors, generation_config.json, tokenizer.json, zoo.json), plus
zoo.json listing them all. root is $INFERSIM_ZOO or ~/.cache/infersim/zoo; key hashes the
corpus hash, the zoo spec and the torch / transformers / tokenizers versions, so anything that
could change the weights builds a new zoo beside the old one. Each model folder appears
atomically (built in a hidden folder, then renamed), so an interrupted build resumes with
what is missing."""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from infersim.simulator.errors import InfersimError
from infersim.simulator.metrics.rundir import staged_folder
from infersim.simulator.progress import log_line
from infersim.simulator.yamlio import write_atomic

from . import train as T
from .corpus import Corpus, files_sha256, load_corpus
from .shipped import install_shipped
from .spec import DEFAULT_ZOO, ModelRecipe, ZooSpec
from .train import SPECIAL

BUILDER_VERSION = 1
ZOO_ENV = "INFERSIM_ZOO"


def zoo_root() -> Path:
    env = os.environ.get(ZOO_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "infersim" / "zoo"


def _versions() -> dict:
    import tokenizers
    import transformers

    return {
        "torch": str(torch.__version__),
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


def corpus_for(spec: ZooSpec, corpus: Corpus | None = None) -> Corpus:
    c = corpus or load_corpus()
    if spec.max_files is not None and len(c.files) > spec.max_files:
        files = c.files[: spec.max_files]
        c = Corpus(c.root, files, *files_sha256(c.root, files), c.python)
    return c


def zoo_key(spec: ZooSpec, corpus: Corpus) -> str:
    return key_of(spec.for_host().to_dict(), corpus.sha256, _versions())


def key_of(spec: dict, corpus_sha256: str, versions: dict) -> str:
    """The build key: what could change the weights (spec as trained, corpus, library versions)."""
    payload = json.dumps(
        {"corpus_sha256": corpus_sha256, "spec": spec, "versions": versions, "builder": BUILDER_VERSION}, sort_keys=True
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def zoo_dir(spec: ZooSpec = DEFAULT_ZOO, root: Path | None = None, corpus: Corpus | None = None) -> Path:
    c = corpus_for(spec, corpus)
    return Path(root or zoo_root()) / zoo_key(spec, c)


def weights_sha256(model) -> str:
    """Hash of the weights themselves (names, dtypes, shapes, bytes), independent of file format."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _order(spec: ZooSpec, names) -> list[ModelRecipe]:
    """The recipes to build, teachers before their students."""
    want = set(names) if names else {r.name for r in spec.models}
    unknown = want - {r.name for r in spec.models}
    if unknown:
        raise InfersimError(f"unknown zoo model(s) {sorted(unknown)}; the zoo has {[r.name for r in spec.models]}")
    out: list[ModelRecipe] = []

    def add(name):
        r = spec.recipe(name)
        if r.distill_from:
            add(r.distill_from)
        if r not in out:
            out.append(r)

    for r in spec.models:
        if r.name in want:
            add(r.name)
    return out


def _hf_tokenizer(tok):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL, eos_token=SPECIAL, pad_token=SPECIAL)


def _load_model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype="float32").eval()


def is_complete(d: Path, recipes) -> bool:
    return (d / "tokenizer" / "tokenizer.json").exists() and all((d / r.name / "zoo.json").exists() for r in recipes)


def fill_from_shipped(d: Path) -> bool:
    """Copy the shipped weights into zoo folder `d` when its key is the shipped key (shipped.py)."""
    d.mkdir(parents=True, exist_ok=True)
    with _locked(d.parent / f"{d.name}.lock"):
        return install_shipped(d)


def build_zoo(
    spec: ZooSpec = DEFAULT_ZOO, root: Path | None = None, names=None, log=None, corpus: Corpus | None = None
) -> Path:
    """Build whatever of the zoo is missing (all models, or `names` and their teachers) and
    return the zoo folder. Cheap when everything is cached."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    log = log or log_line
    spec = spec.for_host()
    c = corpus_for(spec, corpus)
    d = Path(root or zoo_root()) / zoo_key(spec, c)
    recipes = _order(spec, names)
    if is_complete(d, recipes):
        return d
    fill_from_shipped(d)
    if is_complete(d, recipes):
        return d
    with _locked(d.parent / f"{d.name}.lock"):
        threads = torch.get_num_threads()
        torch.set_num_threads(spec.threads)
        try:
            _build_locked(spec, c, d, recipes, log)
        finally:
            torch.set_num_threads(threads)
    return d


def _build_locked(spec: ZooSpec, c: Corpus, d: Path, recipes: list[ModelRecipe], log) -> None:
    from tokenizers import Tokenizer

    t_start = time.perf_counter()
    train_files, held_files = c.split()
    tok_dir = d / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        _train_tokenizer(spec, c, train_files, tok_dir, log)
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    todo = [r for r in recipes if not (d / r.name / "zoo.json").exists()]
    if not todo:
        _write_manifest(spec, c, d)
        return
    data = _TokenizedCorpus(spec, c, tok, train_files, held_files)
    log(
        f"zoo: corpus {len(c.files)} files, {c.num_bytes / 1e6:.1f} MB, sha256 {c.sha256[:12]}; "
        f"{data.streams['all'].numel()} training and {data.held.numel()} held-out tokens"
    )
    models = _Models(d)
    for r in todo:
        model, meta = _train_model(r, spec, c, data, models, log)
        _save_model(model, meta, d / r.name, tok_dir)
        models.loaded[r.name] = model
    _write_manifest(spec, c, d)
    log(f"zoo: built in {time.perf_counter() - t_start:.0f} s: {d}")


def _train_tokenizer(spec: ZooSpec, c: Corpus, train_files, tok_dir: Path, log) -> None:
    """A byte-level BPE tokenizer trained on the training files, saved as a Hugging Face tokenizer."""
    from tokenizers import ByteLevelBPETokenizer

    log(f"zoo: training a byte-level BPE tokenizer ({spec.vocab_size} tokens) on {len(train_files)} stdlib files")
    t0 = time.perf_counter()
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        c.texts(train_files),
        vocab_size=spec.vocab_size,
        min_frequency=2,
        special_tokens=[T.SPECIAL],
        show_progress=False,
    )
    with staged_folder(tok_dir) as tmp:
        _hf_tokenizer(bpe._tokenizer).save_pretrained(str(tmp))
        (tmp / "zoo.json").write_text(
            json.dumps({"vocab_size": bpe.get_vocab_size(), "train_seconds": time.perf_counter() - t0}, indent=2) + "\n"
        )


class _TokenizedCorpus:
    """The corpus as token streams (files joined by token 0): the training stream of each data
    subset, made when a recipe first asks for it, and the held-out windows and prompts."""

    def __init__(self, spec: ZooSpec, c: Corpus, tok, train_files, held_files):
        self.c, self.tok, self.train_files = c, tok, train_files
        self.streams = {"all": self.stream(train_files)}
        self.held = held = self.stream(held_files)
        self.windows = T.eval_windows(held, spec.eval_windows, spec.eval_seq_len)
        self.prompts = T.eval_windows(held[len(held) // 7 :], spec.accept_prompts, spec.accept_prompt_len - 1)

    def stream(self, files) -> torch.Tensor:
        ids = []
        for enc in self.tok.encode_batch(self.c.texts(files)):
            ids.extend(enc.ids)
            ids.append(0)
        return torch.tensor(ids, dtype=torch.long)

    def training(self, data: str) -> torch.Tensor:
        """The training stream of `data`: 'all', or the 'even' or 'odd' files of the training set."""
        if data not in self.streams:
            sub = [f for i, f in enumerate(self.train_files) if (i % 2 == 0) == (data == "even")]
            self.streams[data] = self.stream(sub)
        return self.streams[data]


class _Models:
    """The zoo's models trained in this build, or loaded from zoo folder `d` when a student
    needs a teacher or target built before."""

    def __init__(self, d: Path):
        self.d, self.loaded = d, {}

    def get(self, name: str):
        if name not in self.loaded:
            self.loaded[name] = _load_model(self.d / name)
        return self.loaded[name]


def _train_model(r: ModelRecipe, spec: ZooSpec, c: Corpus, data: _TokenizedCorpus, models: _Models, log):
    """(model, its zoo.json) of recipe `r`: trained (distilled from its teacher), scored on the held-out windows."""
    train_ids = data.training(r.data)
    teacher = models.get(r.distill_from) if r.distill_from else None
    log(
        f"zoo: training {r.name} ({r.arch} {r.layers} x {r.hidden}, {r.steps} steps of {r.batch} x {r.seq_len}"
        f"{', distilled from ' + r.distill_from if teacher is not None else ''})"
    )
    model, stats = T.train(r, spec, train_ids, teacher=teacher, log=log)
    meta = {
        "name": r.name,
        "role": r.role,
        "arch": r.arch,
        "description": r.description,
        "recipe": r.__dict__,
        "parameters": sum(p.numel() for p in model.parameters()),
        **stats,
    }
    meta.update(_quality(model, r, spec, data, models))
    meta["weights_sha256"] = weights_sha256(model)
    meta.update(
        corpus_sha256=c.sha256,
        corpus_files=len(c.files),
        corpus_bytes=c.num_bytes,
        python=c.python,
        versions=_versions(),
        threads=spec.threads,
        autocast_bf16=spec.autocast_bf16,
    )
    acc = meta.get(f"greedy_acceptance_s{spec.accept_s}")
    log(
        f"zoo: {r.name}: {stats['train_seconds']:.0f} s, held-out loss {meta['heldout_loss']:.3f} "
        f"(perplexity {meta['heldout_perplexity']:.1f})"
        + (f", greedy acceptance at s={spec.accept_s} {acc['acceptance']:.3f}" if acc else "")
    )
    return model, meta


def _quality(model, r: ModelRecipe, spec: ZooSpec, data: _TokenizedCorpus, models: _Models) -> dict:
    """Held-out loss and perplexity; for a draft, its agreement with and greedy acceptance by its target."""
    loss = T.heldout_loss(model, data.windows)
    out = {
        "heldout_loss": loss,
        "heldout_perplexity": float(torch.tensor(loss).exp()),
        "heldout_tokens": int(data.windows[:, 1:].numel()),
    }
    target_name = r.distill_from or next((x.name for x in spec.models if x.role == "target"), None)
    if r.role != "target" and target_name:
        tgt = models.get(target_name)
        out["token_agreement_with_target"] = T.token_agreement(model, tgt, data.windows)
        out[f"greedy_acceptance_s{spec.accept_s}"] = T.greedy_acceptance(
            model, tgt, data.prompts, spec.accept_gen_len, spec.accept_s
        )
        out["acceptance_target"] = target_name
    return out


def _save_model(model, meta: dict, dest: Path, tok_dir: Path) -> None:
    """A Hugging Face checkpoint folder with the tokenizer's files and zoo.json, appearing at once."""
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 0
    model.generation_config.bos_token_id = 0
    with staged_folder(dest) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        for f in tok_dir.iterdir():
            if f.name != "zoo.json":
                shutil.copy2(f, tmp / f.name)
        (tmp / "zoo.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def _write_manifest(spec: ZooSpec, c: Corpus, d: Path) -> None:
    models = {}
    for r in spec.models:
        f = d / r.name / "zoo.json"
        if f.exists():
            models[r.name] = json.loads(f.read_text())
    data = {
        "key": d.name,
        "corpus_sha256": c.sha256,
        "python": c.python,
        "versions": _versions(),
        "spec": spec.to_dict(),
        "models": models,
    }
    write_atomic(d / "zoo.json", json.dumps(data, indent=2, sort_keys=True) + "\n")


def main(argv=None) -> int:
    """`python -m infersim.executor.zoo.build [--root DIR] [names...]`: build the default zoo."""
    ap = argparse.ArgumentParser(description="build the executor's model zoo")
    ap.add_argument("models", nargs="*")
    ap.add_argument("--root", default=None)
    args = ap.parse_args(argv)
    print(build_zoo(DEFAULT_ZOO, root=Path(args.root) if args.root else None, names=args.models or None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
