"""`sim models`, `sim hardware`, `sim workloads` stay readable in a narrow terminal or a pipe:
every name whole, no cell cut mid-word, no line wider than the terminal."""

import re

import pytest

from infersim.cli.catalog import _fit_widths, first_sentence
from infersim.cli.main import main


def _names(command: str) -> list[str]:
    if command == "models":
        from infersim.simulator.models.catalog import list_models, load_model

        return [load_model(n).name for n in list_models()]
    if command == "hardware":
        from infersim.simulator.hardware.catalog import list_hardware, load_hardware

        return [load_hardware(n).name for n in list_hardware()]
    from infersim.simulator.workload.builder import list_workloads

    return list_workloads()


@pytest.mark.parametrize("width", [80, 60, 200])
@pytest.mark.parametrize("command", ["models", "hardware", "workloads"])
def test_catalog_keeps_every_name_whole(monkeypatch, capsys, command, width):
    monkeypatch.setenv("COLUMNS", str(width))
    assert main([command]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= width
    tokens = set(re.split(r"[\s│┃|;]+", out))
    for name in _names(command):
        assert name in tokens, name


def test_workload_descriptions_are_whole_sentences(monkeypatch, capsys):
    from infersim.simulator.workload.builder import list_workloads, load_workload

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["workloads"]) == 0
    words = set(re.split(r"[\s│┃]+", capsys.readouterr().out))
    for name in list_workloads():
        sentence = first_sentence(load_workload(name)[0].description or "")
        assert sentence.endswith((".", "!", "?")) or not sentence
        assert set(sentence.split()) <= words, name


def test_first_sentence_and_widths():
    assert first_sentence("One  thing,\n e.g. two. Then more. ") == "One thing, e.g. two."
    assert _fit_widths([30, 10, 12], [10, 10, 4], 40) == [18, 10, 12]
    assert sum(_fit_widths([30, 10, 12], [10, 10, 4], 30)) == 30


def test_one_model_shows_its_layer_layout(capsys):
    assert main(["models", "microsoft/phi-2"]) == 0
    out = capsys.readouterr().out
    assert "layer: parallel (attention and MLP read one input norm" in out and "1 layernorm per layer" in out
    assert "rotary over 40% of each head; context 2048" in out and "biases: q/k/v, o, mlp, lm_head" in out
    assert main(["models", "qwen-72b"]) == 0
    out = capsys.readouterr().out
    assert "2 rmsnorm per layer; gated MLP of width 24576" in out and "biases: q/k/v;" in out


def test_workloads_name_prints_that_workloads_file(capsys, tmp_path):
    """`sim workloads NAME` as `sim models NAME` and `sim hardware NAME`: the file, its sources."""
    from infersim.simulator.workload.builder import load_workload

    assert main(["workloads", "chatbot"]) == 0
    out = capsys.readouterr().out
    _, path = load_workload("chatbot")
    assert out == f"# chatbot: {path}\n" + path.read_text(encoding="utf-8")
    assert "source:" in out
    assert main(["workloads", "chatbto"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'chatbot'?" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: llama-2-7b\nserving: {max_batch_sise: 4}\n")
    assert main(["workloads", str(bad)]) == 2
    assert "field 'serving.max_batch_sise'" in capsys.readouterr().err
