"""Mistakes a new user makes with the commands that run real models (exec, validate, profile,
medusa-train), each refused in one line naming the flag or field, with exit 2, before any
measuring or training, and with every file left as it was (no output folder made)."""

from __future__ import annotations

import pytest
from fuzz_harness import TINY_WORKLOAD, refused, refused_untouched, write_yaml

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch


@pytest.fixture
def wl(tmp_path, zoo_dir):
    return write_yaml(tmp_path / "wl.yaml", TINY_WORKLOAD)


def _exec(wl, tmp_path, *extra):
    return ["exec", "-w", wl, "-m", "zoo-target", "-o", tmp_path / "e", "--fast", "-n", "2", "-q", *extra]


def test_exec_unknown_device(wl, tmp_path):
    refused_untouched(_exec(wl, tmp_path, "--device", "gpu"), tmp_path, "--device gpu: unknown device")


@pytest.mark.parametrize("value", ["0", "nan", "-4"])
def test_exec_device_memory_must_be_positive(wl, tmp_path, value):
    refused_untouched(_exec(wl, tmp_path, "--device-memory-gb", value), tmp_path, "--device-memory-gb", "> 0")


@pytest.mark.parametrize(
    "broken, needle",
    [
        ("model.safetensors", "the weights do not load: SafetensorError"),
        ("tokenizer.json", "tokenizer.json: does not load: JSONDecodeError"),
    ],
)
def test_exec_a_checkpoint_with_a_broken_file(wl, tmp_path, zoo_dir, broken, needle):
    """A truncated download or a file that is not what its name says: one line naming the
    checkpoint folder, not the reader's traceback."""
    import shutil

    from infersim.executor.models import resolve_model_path

    ckpt = tmp_path / "ckpt"
    shutil.copytree(resolve_model_path("zoo-target"), ckpt)
    (ckpt / broken).write_text("not what its name says\n")
    argv = ["exec", "-w", wl, "-m", ckpt, "-o", tmp_path / "e", "--fast", "-n", "2", "-q"]
    assert refused_untouched(argv, tmp_path, f"{ckpt}", needle)


def test_exec_device_memory_is_refused_where_the_run_would_ignore_it(wl, tmp_path):
    """A pool given in blocks wins over --device-memory-gb, and CUDA plans from the GPU's own
    memory: the flag was silently dropped in both."""
    argv = _exec(wl, tmp_path, "--device-memory-gb", "8", "--gpu-blocks", "64")
    refused_untouched(argv, tmp_path, "--device-memory-gb sizes the KV pool from memory, but --gpu-blocks (64)")
    blocks = write_yaml(
        tmp_path / "blocks.yaml", dict(TINY_WORKLOAD, serving={**TINY_WORKLOAD["serving"], "gpu_blocks": 96})
    )
    argv = _exec(blocks, tmp_path, "--device-memory-gb", "8")
    refused_untouched(argv, tmp_path, f"but {blocks}'s serving.gpu_blocks (96) already gives it in blocks")
    argv = _exec(wl, tmp_path, "--device-memory-gb", "8", "--device", "cuda")
    refused_untouched(argv, tmp_path, "--device-memory-gb is for --device cpu")


def test_exec_pools_larger_than_the_machine(wl, tmp_path):
    line = refused_untouched(
        _exec(wl, tmp_path, "--device-memory-gb", "1e9"), tmp_path, f"{wl}: the KV pools", "--device-memory-gb"
    )
    assert "exceed this machine's" in line
    huge_swap = write_yaml(
        tmp_path / "swap.yaml", dict(TINY_WORKLOAD, serving={**TINY_WORKLOAD["serving"], "swap_space_gb": 100000})
    )
    refused_untouched(_exec(huge_swap, tmp_path), tmp_path, "swap.yaml: the KV pools", "serving.swap_space_gb")


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["-m", "zoo-targt"], "--model: unknown zoo model 'zoo-targt' (did you mean 'zoo-target'?)"),
        (["--device", "tpu"], "--device tpu"),
        (["--cost-model", "roofline", "--profile", "cpu-referenc"], "--profile: unknown hardware profile"),
        (["--calibration", "missing.json"], "missing.json"),
        (["--dtype", "fp8"], "--dtype: the executor runs fp32, fp16 or bf16, got 'fp8'"),  # before calibrating
    ],
)
def test_validate_refuses_names_before_making_its_folder(wl, tmp_path, extra, needle):
    refused_untouched(["validate", "-w", wl, "-o", tmp_path / "v", "-q", *extra], tmp_path, needle)


def test_profile_refuses_an_unknown_model_and_an_existing_profile(tmp_path, zoo_dir):
    out = tmp_path / "mine.yaml"
    refused_untouched(["profile", "--quick", "--model", "zoo-targt", "--out", out], tmp_path, "--model", "zoo-targt")
    # more threads than the machine's CPUs: refused up front, not a traceback from the thread pool
    refused_untouched(["profile", "--quick", "--threads", "100000", "--out", out], tmp_path, "--threads", "100000")
    out.write_text("name: mine\n")
    refused_untouched(["profile", "--quick", "--out", out], tmp_path, f"--out {out}: exists", "--force")


@pytest.mark.parametrize("flag,value", [("--device", "cuda"), ("--dtype", "bf16"), ("--name", "other")])
def test_profile_refit_refuses_what_it_would_ignore(tmp_path, flag, value):
    """A refit keeps the profile's device, dtype and name; it used to drop these flags silently."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("name: mine\n")
    argv = ["profile", "--refit", mine, flag, value]
    refused_untouched(argv, tmp_path, f"{flag} is for a new profile; --refit keeps {mine}'s own device, dtype and name")


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--threads", "-1"], "--threads: expected a whole number from 1 to"),
        (["--threads", "100000"], "--threads: expected a whole number from 1 to"),
        (["--root", "notes.txt"], "--root notes.txt: is a file; name a folder"),
        (["--catalog-out", "notes.yaml"], "--catalog-out notes.yaml: exists"),
        (["--catalog-out", "folder"], "--catalog-out folder: is a folder"),
    ],
)
def test_medusa_train_refuses_before_training(tmp_path, monkeypatch, zoo_dir, extra, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine\n")
    (tmp_path / "notes.yaml").write_text("mine: 1\n")
    (tmp_path / "folder").mkdir()
    refused_untouched(["medusa-train", "--model", "zoo-target", *extra], tmp_path, needle)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["zoo", "ship", "--out", "mine"], "--out mine: folder exists and was not written by infersim"),
        (["zoo", "ship", "--out", "notes.txt"], "--out notes.txt: is a file"),
        (["zoo", "build", "--root", "notes.txt"], "--root notes.txt: is a file; name a folder"),
        (["zoo", "list", "--root", "notes.txt"], "--root notes.txt: is a file; name a folder"),
    ],
)
def test_zoo_never_replaces_a_folder_of_the_users(tmp_path, monkeypatch, argv, needle):
    """`sim zoo ship --out` replaces its folder whole: one that holds no shipped zoo is refused
    before the build, not deleted after it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work\n")
    (tmp_path / "notes.txt").write_text("mine\n")
    refused_untouched(argv, tmp_path, needle)


def test_validate_refused_after_claiming_its_folder_leaves_none(tmp_path, zoo_dir):
    """A refusal that comes only once the validation runs (here the executor's KV pools, larger
    than the machine) removes the folder the command had made."""
    huge_swap = write_yaml(
        tmp_path / "swap.yaml", dict(TINY_WORKLOAD, serving={**TINY_WORKLOAD["serving"], "swap_space_gb": 100000})
    )
    refused_untouched(["validate", "-w", huge_swap, "-o", tmp_path / "v", "-q"], tmp_path, "the KV pools")
    (tmp_path / "v").mkdir()  # a folder that was there stays, with its files
    (tmp_path / "v" / "notes.txt").write_text("mine\n")
    refused(["validate", "-w", huge_swap, "-o", tmp_path / "v", "-q", "--force"], "the KV pools")
    assert (tmp_path / "v" / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize("quiet", [False, True])
def test_profile_refit_shows_its_progress_unless_quiet(tmp_path, monkeypatch, quiet):
    """The refit's measurements (--model predictors) had no progress bar even without -q."""
    from infersim.cli.main import main

    seen = []
    monkeypatch.setattr("infersim.cli.profile.refit_profile", lambda path, opts: seen.append(opts) or {})
    monkeypatch.setattr("infersim.cli.profile.print_report", lambda result: None)
    mine = tmp_path / "mine.yaml"
    mine.write_text("name: mine\n")
    assert main(["profile", "--refit", str(mine), *(["-q"] if quiet else [])]) == 0
    assert seen[0].quiet is quiet
