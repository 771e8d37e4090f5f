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

from infersim.executor.zoo import DEFAULT_ZOO, TINY_ZOO, ensure_zoo, resolve_zoo_model, zoo_names  # noqa: E402
from infersim.executor.zoo import corpus as corpus_mod  # noqa: E402
from infersim.executor.zoo.build import build_zoo  # noqa: E402
from infersim.simulator.errors import InfersimError  # noqa: E402


@pytest.fixture(scope="session")
def zoo_dir():
    return ensure_zoo()


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
