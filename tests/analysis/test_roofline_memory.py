"""`sim roofline` says which settings a card cannot hold: weights plus the KV cache per GPU,
checked against hand calculations on Llama-3 and Qwen2.5 models."""

import pandas as pd
import pytest

from infersim.analysis.roofline import Grid, build_cost_model, iteration_table, memory_fit_note
from infersim.cli.main import main

LLAMA3_70B_PARAMS = 70_553_706_496
LLAMA3_8B_PARAMS = 8_030_261_248


def test_memory_per_gpu_is_weights_share_plus_kv():
    cost = build_cost_model("llama-3-70b", "h100-sxm", tensor_parallel=4)
    it = iteration_table(cost, Grid(["prefill", "decode"], [64], [8192]))
    kv_per_token_per_gpu = 80 * 2 * 2 * 128 * 2  # layers x K,V x 2 of 8 KV heads x head dim x fp16: 80 KiB
    weights = LLAMA3_70B_PARAMS * 2 / 4
    by_phase = it.set_index("phase")["memory_bytes_per_gpu"]
    assert by_phase["prefill"] == pytest.approx(weights + kv_per_token_per_gpu * 64 * 8192)
    assert by_phase["decode"] == pytest.approx(weights + kv_per_token_per_gpu * 64 * 8193)
    assert memory_fit_note(cost, it) is None  # 78.2 GB: fits the card's 79.22 GiB (85.06 GB)


def test_note_names_the_settings_that_do_not_fit():
    cost = build_cost_model("llama-3-8b", "h100-sxm")
    it = iteration_table(cost, Grid(["decode"], [1, 80], [1024, 8192]))
    # 16.06 GB of weights + 80 x 8,193 tokens x 128 KiB = 102.0 GB > the 79.22 GiB (85.06 GB) the
    # driver reports; the other three fit
    note = memory_fit_note(cost, it)
    expected = (LLAMA3_8B_PARAMS * 2 + 80 * 8193 * 131072) / 1e9
    assert note.startswith(
        "note: 1 of 4 settings need more than h100-sxm's 79.22 GiB visible per GPU (16.1 GB of weights"
    )
    assert f"up to {expected:.1f} GB at decode batch 80 x seq 8192" in note


def test_weights_that_do_not_fit_are_said_once(capsys):
    assert main(["roofline", "--model", "llama-3-70b", "--hardware", "h100-sxm", "--batch", "1", "--seq", "128"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "note: llama-3-70b's weights alone take 141.1 GB per GPU (fp16, tp 1), more than h100-sxm's 79.22 GiB visible"
        in out
    )
    assert (
        main(
            [
                "roofline",
                "--model",
                "llama-3-70b",
                "--hardware",
                "h100-sxm",
                "--tp",
                "2",
                "--dtype",
                "fp8",
                "--batch",
                "1",
                "--seq",
                "128",
            ]
        )
        == 0
    )
    assert "note:" not in capsys.readouterr().out  # 35.3 GB of FP8 weights per GPU


def test_csv_has_the_memory_column(tmp_path, capsys):
    csv = tmp_path / "r.csv"
    args = ["roofline", "--model", "qwen2.5-72b", "--hardware", "a100-80gb-sxm", "--tp", "8", "--batch", "8"]
    assert main([*args, "--seq", "4096", "--csv", str(csv)]) == 0
    df = pd.read_csv(csv)
    # Qwen2.5-72B: 80 layers, 8 KV heads of 128, one per GPU at tp 8
    kv = 80 * 2 * 1 * 128 * 2
    weights = 72_706_203_648 * 2 / 8  # its published 72.7B parameters in fp16 over 8 GPUs
    assert df.set_index("phase").loc["decode", "memory_bytes_per_gpu"] == pytest.approx(weights + kv * 8 * 4097)
    capsys.readouterr()


def test_operator_table_fits_an_80_column_terminal(monkeypatch, capsys):
    """Piped or on an 80-column terminal, every number is whole: no column cut to '…', even for
    a 64 x 8,192-token prefill of Llama-3-70B (microseconds in the millions, petaFLOPs)."""
    monkeypatch.setenv("COLUMNS", "80")
    args = ["roofline", "--model", "llama-3-70b", "--hardware", "h100-sxm", "--tp", "4", "--all"]
    assert main([*args, "--batch", "1,64", "--seq", "128,8192", "--phase", "prefill,decode,verify"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "20.8P" in out  # the iteration's FLOPs at batch 64 x 8,192 tokens


def test_a_tp_degree_past_a_node_is_said_to_be_priced_inside_one(capsys):
    """`sim roofline --tp 16` prices one group in one node; on 8-GPU nodes the group spans 2,
    which `sim run` prices across nodes: the note says so, and --tp 8 has none."""
    args = ["roofline", "--model", "llama-3-70b", "--hardware", "h100-sxm", "--batch", "1", "--seq", "128"]
    assert main([*args, "--tp", "16"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "note: tp 16 is priced here as one group inside a node; on 8-GPU nodes the tensor-parallel group" in out
    assert main([*args, "--tp", "8"]) == 0
    assert "priced here as one group" not in capsys.readouterr().out
