"""The model zoo: pinned corpus, deterministic training, recorded quality numbers.

The default zoo is built once (a few minutes on 2 cores) and cached in ~/.cache/infersim/zoo
($INFERSIM_ZOO overrides); every executor test uses its trained models, never random weights."""

import dataclasses
import json

import pytest

import infersim.executor  # noqa: E402,F401  (before torch: OpenMP threads wait passively, see executor/__init__.py)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytestmark = pytest.mark.torch

from infersim.executor.zoo import DEFAULT_ZOO, TINY_ZOO, resolve_zoo_model, zoo_names  # noqa: E402
from infersim.executor.zoo import corpus as corpus_mod  # noqa: E402
from infersim.executor.zoo.build import build_zoo  # noqa: E402
from infersim.simulator.errors import InfersimError  # noqa: E402


def test_corpus_is_the_pinned_stdlib():
    c = corpus_mod.load_corpus()
    assert c.sha256 == corpus_mod.PINNED_SHA256.get(c.python, c.sha256)
    assert c.num_bytes > 5_000_000 and len(c.files) > 300
    assert list(c.files) == sorted(c.files)
    assert not any("/test/" in f or f.startswith("test/") or "site-packages" in f for f in c.files)
    train, held = c.split()
    assert held and not set(train) & set(held)


def test_corpus_hash_mismatch_is_a_clear_error(monkeypatch):
    c = corpus_mod.load_corpus()
    monkeypatch.setitem(corpus_mod.PINNED_SHA256, c.python, "0" * 64)
    monkeypatch.delenv(corpus_mod.ALLOW_UNPINNED_ENV, raising=False)
    with pytest.raises(InfersimError, match=corpus_mod.ALLOW_UNPINNED_ENV):
        corpus_mod.load_corpus.__wrapped__()
    monkeypatch.setenv(corpus_mod.ALLOW_UNPINNED_ENV, "1")
    assert corpus_mod.load_corpus.__wrapped__().sha256 == c.sha256


def test_tiny_zoo_is_deterministic(tmp_path):
    """Same spec and seeds -> bit-identical tokenizer and weights (a tiny config, built twice)."""
    a = build_zoo(TINY_ZOO, root=tmp_path / "a", log=lambda m: None)
    b = build_zoo(TINY_ZOO, root=tmp_path / "b", log=lambda m: None)
    assert a.name == b.name  # same cache key
    assert (a / "tokenizer" / "tokenizer.json").read_bytes() == (b / "tokenizer" / "tokenizer.json").read_bytes()
    for name in zoo_names(TINY_ZOO):
        ma = json.loads((a / name / "zoo.json").read_text())
        mb = json.loads((b / name / "zoo.json").read_text())
        assert ma["weights_sha256"] == mb["weights_sha256"]
        assert (a / name / "model.safetensors").read_bytes() == (b / name / "model.safetensors").read_bytes()
    # cached: a second call trains nothing
    logs = []
    build_zoo(TINY_ZOO, root=tmp_path / "a", log=logs.append)
    assert not logs


def test_bf16_autocast_only_where_the_cpu_has_bf16_instructions(monkeypatch):
    """A CPU without bf16 instructions trains the zoo in fp32 (torch would emulate bf16, ~13x
    slower), in a zoo folder of its own; a spec that asked for fp32 is left alone."""
    from infersim.executor.zoo import spec as spec_mod
    from infersim.executor.zoo.build import corpus_for, zoo_key

    c = corpus_for(TINY_ZOO)
    monkeypatch.setattr(spec_mod, "native_bf16", lambda: True)
    assert TINY_ZOO.for_host() is TINY_ZOO and TINY_ZOO.autocast_bf16
    key_native = zoo_key(TINY_ZOO, c)
    monkeypatch.setattr(spec_mod, "native_bf16", lambda: False)
    assert TINY_ZOO.for_host().autocast_bf16 is False
    assert zoo_key(TINY_ZOO, c) != key_native
    fp32 = dataclasses.replace(TINY_ZOO, autocast_bf16=False)
    assert fp32.for_host() is fp32 and zoo_key(fp32, c) == zoo_key(TINY_ZOO, c)


def test_zoo_models_and_their_numbers(zoo_dir):
    manifest = json.loads((zoo_dir / "zoo.json").read_text())
    models = manifest["models"]
    assert set(models) == set(zoo_names(DEFAULT_ZOO))
    assert manifest["corpus_sha256"] == corpus_mod.load_corpus().sha256
    assert manifest["versions"]["torch"] == str(torch.__version__)
    target = models["zoo-target"]
    drafts = {k: v for k, v in models.items() if v["role"] == "draft"}
    assert len(drafts) >= 3
    # a real language model of Python source: far below the 1,024-token uniform perplexity
    assert target["heldout_perplexity"] < 40
    for name, m in drafts.items():
        assert (zoo_dir / name / "config.json").exists() and (zoo_dir / name / "model.safetensors").exists()
        assert m["heldout_perplexity"] > target["heldout_perplexity"]
        acc = m["greedy_acceptance_s4"]["acceptance"]
        assert 0.15 < acc < 0.95, (name, acc)
    sizes = {(m["recipe"]["layers"], m["recipe"]["hidden"], m["recipe"]["data"]) for m in drafts.values()}
    assert len(sizes) == len(drafts)  # drafts differ in size or data
    assert models["zoo-opt"]["arch"] == "opt"


def test_zoo_names_resolve(zoo_dir):
    p = resolve_zoo_model("zoo-draft-a")
    assert p == zoo_dir / "zoo-draft-a" and (p / "tokenizer.json").exists()
    with pytest.raises(InfersimError, match="unknown zoo model"):
        resolve_zoo_model("zoo-nonexistent")


# ---- the weights shipped with the package (executor/zoo/shipped.py) ------------------------------
def test_shipped_zoo_is_a_build_of_the_current_spec():
    """The shipped key is the build key of DEFAULT_ZOO as it stands (with the corpus and library
    versions it was trained on): a spec changed without `sim zoo ship` fails here."""
    from infersim.executor.zoo.build import corpus_for, key_of, zoo_key
    from infersim.executor.zoo.shipped import shipped_manifest

    man = shipped_manifest()
    assert man, "no shipped zoo: run `sim zoo ship`"
    assert man["spec"] == json.loads(json.dumps(DEFAULT_ZOO.for_host().to_dict()))
    assert man["key"] == key_of(DEFAULT_ZOO.for_host().to_dict(), man["corpus_sha256"], man["versions"])
    # the test extra pins the versions the weights were trained with, on the pinned Python
    assert man["versions"]["torch"] == str(torch.__version__)
    assert man["key"] == zoo_key(DEFAULT_ZOO, corpus_for(DEFAULT_ZOO))
    assert {n for n in zoo_names(DEFAULT_ZOO)} <= {f.split("/")[0] for f in man["files"]}
    assert any(f.startswith("medusa/zoo-target-") for f in man["files"])


def test_shipped_files_match_their_checksums():
    from infersim.executor.zoo.shipped import MANIFEST, shipped_dir, shipped_manifest
    from infersim.simulator.costmodel.calibration_file import sha256_file

    d, files = shipped_dir(), shipped_manifest()["files"]
    on_disk = {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()}
    assert on_disk == set(files) | {MANIFEST, "zoo.json"}
    for rel, sha in files.items():
        assert sha256_file(d / rel) == sha, rel


def test_an_empty_cache_is_filled_from_the_shipped_weights(tmp_path):
    """A zoo folder under the shipped key gets the shipped files, byte for byte, without
    training; a model already in the cache is left as it is; another key gets nothing."""
    from infersim.executor.zoo.build import zoo_dir
    from infersim.executor.zoo.shipped import install_shipped, shipped_dir

    path = resolve_zoo_model("zoo-draft-b", root=tmp_path)
    d = zoo_dir(DEFAULT_ZOO, tmp_path)
    assert path == d / "zoo-draft-b" and d.name == json.loads((shipped_dir() / "SHIPPED.json").read_text())["key"]
    for rel in ("zoo-draft-b/model.safetensors", "tokenizer/tokenizer.json", "zoo.json"):
        assert (d / rel).read_bytes() == (shipped_dir() / rel).read_bytes()
    assert any((d / "medusa").iterdir())
    mine = d / "zoo-opt" / "model.safetensors"
    mine.write_bytes(b"a user's own weights")
    assert install_shipped(d) and mine.read_bytes() == b"a user's own weights"
    assert not install_shipped(tmp_path / "0123456789abcdef")
    assert not (tmp_path / "0123456789abcdef").exists()


@pytest.mark.parametrize("machine", ["other torch", "unpinned Python"])
def test_a_machine_of_another_build_key_serves_the_shipped_weights_without_training(machine, tmp_path, monkeypatch):
    """A GPU machine's torch ('2.11.0+cu130'), or a Python whose stdlib corpus has no pinned
    hash, builds under another key (or none): zoo names still resolve, to the shipped weights
    under the shipped key, with one line saying so, and nothing is trained."""
    from infersim.executor.zoo import build as build_mod
    from infersim.executor.zoo import ensure_zoo, own_zoo_dir, shipped_zoo_dir
    from infersim.executor.zoo.shipped import shipped_manifest

    if machine == "other torch":
        versions = build_mod._versions()
        monkeypatch.setattr(build_mod, "_versions", lambda: {**versions, "torch": "2.11.0+cu130"})
    else:
        monkeypatch.setitem(corpus_mod.PINNED_SHA256, corpus_mod.load_corpus().python, "0" * 64)
        monkeypatch.delenv(corpus_mod.ALLOW_UNPINNED_ENV, raising=False)
        corpus_mod.load_corpus.cache_clear()

    def no_training(*a, **k):
        raise AssertionError("trained a zoo")

    monkeypatch.setattr(build_mod, "_build_locked", no_training)
    key = shipped_manifest()["key"]
    own = own_zoo_dir(DEFAULT_ZOO, tmp_path)
    assert (own is None) == (machine == "unpinned Python") and (own is None or own.name != key)
    lines = []
    path = resolve_zoo_model("zoo-target", build=True, root=tmp_path, log=lines.append)
    assert path == tmp_path / key / "zoo-target" and (path / "model.safetensors").exists()
    assert ensure_zoo(root=tmp_path, log=lines.append) == tmp_path / key
    assert shipped_zoo_dir(tmp_path, log=lines.append) == tmp_path / key
    assert len([m for m in lines if "shipped weights" in m]) <= 1


def test_a_corrupted_shipped_file_is_refused_naming_it(tmp_path):
    import shutil

    from infersim.executor.zoo.shipped import install_shipped, shipped_dir, shipped_manifest

    src = tmp_path / "shipped"
    shutil.copytree(shipped_dir(), src)
    f = src / "zoo-draft-a" / "config.json"
    f.write_text(f.read_text() + " ")
    d = tmp_path / "cache" / shipped_manifest()["key"]
    with pytest.raises(InfersimError, match="zoo-draft-a/config.json"):
        install_shipped(d, src)
    assert not (d / "zoo-draft-a").exists()
