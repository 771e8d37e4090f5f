"""`sim medusa` as a user reads it: the answer line, and the notes `sim roofline` prints for the
same settings (a card that cannot hold them, a tensor-parallel group wider than a node)."""

import pandas as pd

from infersim.cli.main import main

SMALL = ["medusa", "--candidates", "1,4", "--batches", "1,2", "--seqs", "1024"]

# llama-7b: 32 layers x (K + V) x 4096 wide x 2 bytes (fp16) = 524,288 bytes of KV per token
KV_BYTES_PER_TOKEN = 2 * 32 * 4096 * 2


def test_the_best_candidate_count_is_one_line_and_the_csv_holds_memory_per_gpu(tmp_path, capsys):
    assert main([*SMALL, "--out", str(tmp_path / "m")]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal's width
    df = pd.read_csv(tmp_path / "m" / "medusa_study.csv")
    main_sweep = df[df["sweep"] == "candidates"]
    best = main_sweep.loc[main_sweep["speedup"].idxmax()]
    assert f"best at batch 1, seq 1024: {best['candidates']} candidates, speedup {best['speedup']:.3f}x" in out
    assert "note:" not in out  # llama-7b fits an A100 80GB at every setting
    # a second sequence adds its KV cache after verification: 1,024 cached + 4 candidate tokens
    batch = df[(df["sweep"] == "batch") & (df["candidates"] == 4)].set_index("batch")["memory_bytes_per_gpu"]
    assert batch[2] - batch[1] == (1024 + 4) * KV_BYTES_PER_TOKEN


def test_settings_the_card_cannot_hold_are_named(tmp_path, capsys):
    argv = [*SMALL, "--model", "llama-3-70b", "--hardware", "a100-40gb", "--out", str(tmp_path / "m")]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "note: llama-3-70b's weights alone take 141.1 GB per GPU (fp16, tp 1)" in out
    assert "none of these settings fits" in out


def test_a_tensor_parallel_group_wider_than_a_node_is_named(tmp_path, capsys):
    argv = [*SMALL, "--model", "llama-3-70b", "--hardware", "h100-sxm", "--tp", "16", "--out", str(tmp_path / "m")]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "note: tp 16 is priced here as one group inside a node" in out
