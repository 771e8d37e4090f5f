"""Output folders and files: nothing the user had is lost. A folder is replaced only when
infersim wrote it (its marker) or with --force; files, the current folder and its ancestors,
wrong suffixes and unwritable places are refused up front in one line with exit 2; SIGINT and
SIGTERM at any moment leave the previous run byte-identical and nothing temporary."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from infersim.cli.main import main
from infersim.simulator.metrics.rundir import MARKER, PAUSE_ENV
from tests.utils import folder_digest

RUN = ["run", "-w", "chatbot", "-n", "30", "-q", "--no-plots"]


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def test_foreign_folder_is_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "D"
    out.mkdir()
    (out / "notes.txt").write_text("x\n")
    assert main([*RUN, "-o", str(out)]) == 2
    _one_line_error(capsys, str(out), "--force")
    assert folder_digest(out) == {"notes.txt": hashlib.sha256(b"x\n").hexdigest()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["D"]


def test_force_replaces_a_foreign_folder(tmp_path):
    out = tmp_path / "D"
    out.mkdir()
    (out / "notes.txt").write_text("x\n")
    assert main([*RUN, "-o", str(out), "--force"]) == 0
    assert not (out / "notes.txt").exists() and (out / "summary.json").is_file()


def test_a_run_folder_is_marked_and_replaced_by_the_next_run(tmp_path):
    out = tmp_path / "r"
    assert main([*RUN, "-o", str(out)]) == 0
    marker = json.loads((out / MARKER).read_text())
    assert marker["command"] == "run" and marker["infersim"]
    assert main([*RUN[:-2], "-o", str(out), "-n", "40", "--no-plots"]) == 0
    assert json.loads((out / "summary.json").read_text())["requests"] == 40
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_empty_folder_is_used(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    assert main([*RUN, "-o", str(out)]) == 0
    assert (out / "summary.json").is_file()


def test_file_as_out_is_refused_untouched(tmp_path, capsys):
    f = tmp_path / "some_file.txt"
    f.write_text("mine\n")
    assert main([*RUN, "-o", str(f), "--force"]) == 2
    _one_line_error(capsys, "is a file")
    assert f.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["some_file.txt"]


@pytest.mark.parametrize("out", [".", "", "/", "CWD", ".."])
def test_current_folder_and_its_ancestors_are_refused(tmp_path, monkeypatch, capsys, out):
    work = tmp_path / "work"
    work.mkdir()
    (work / "my.yaml").write_text("keep\n")
    monkeypatch.chdir(work)
    assert main([*RUN, "-o", str(work) if out == "CWD" else out, "--force"]) == 2
    _one_line_error(capsys, "--out")
    assert sorted(p.name for p in work.iterdir()) == ["my.yaml"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_unwritable_place_is_refused_up_front(tmp_path, monkeypatch, capsys):
    # a read-only file system answers access(W_OK) with False, root included
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == tmp_path else real(p, mode, **kw))
    assert main([*RUN, "-o", str(tmp_path / "r")]) == 2
    _one_line_error(capsys, "cannot write")
    assert list(tmp_path.iterdir()) == []


def test_failure_to_create_the_folder_is_one_line(tmp_path, monkeypatch, capsys):
    import tempfile

    def erofs(*a, **kw):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", erofs)
    assert main([*RUN, "-o", str(tmp_path / "r")]) == 2
    _one_line_error(capsys, "Read-only file system")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--plot", "out.xyz"], "unsupported extension '.xyz'"),
        (["--csv", "TMP"], "is a folder"),
        (["--json", "t.csv"], "unsupported extension '.csv'"),
    ],
)
def test_roofline_file_outputs_are_checked_first(tmp_path, monkeypatch, capsys, args, needle):
    monkeypatch.chdir(tmp_path)
    args = [str(tmp_path) if a == "TMP" else a for a in args]
    assert main(["roofline", "--batch", "1", "--seq", "128", *args]) == 2
    _one_line_error(capsys, needle)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "command",
    [
        ["plan", "-w", "chatbot", "--slo", "ttft_p99=2s", "-q"],
        ["medusa", "--batch", "1"],
    ],
)
def test_other_folder_commands_refuse_a_foreign_folder(tmp_path, capsys, command):
    out = tmp_path / "D"
    out.mkdir()
    (out / "notes.txt").write_text("x\n")
    assert main([*command, "--out", str(out)]) == 2
    _one_line_error(capsys, "--force")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def _sim(args, cwd, pause=None):
    env = {**os.environ, "MPLBACKEND": "Agg"}
    env.pop(PAUSE_ENV, None)
    if pause:
        env[PAUSE_ENV] = pause
    return subprocess.Popen(
        [sys.executable, "-m", "infersim.cli.main", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def previous_run(tmp_path_factory):
    """A finished `sim run` folder (prev/), made once for the tests that interrupt a later run
    into it: each copies it, so each starts from the same bytes."""
    cwd = tmp_path_factory.mktemp("previous-run")
    done = _sim(["run", "-w", "chatbot", "-n", "40", "-q", "-o", "prev"], cwd)
    assert done.wait(timeout=300) == 0, done.stderr.read()
    return cwd / "prev"


@pytest.mark.parametrize("sig,code,word", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
@pytest.mark.parametrize("stage", ["simulating", "writing"])
def test_signal_keeps_previous_run_and_leaves_nothing_temporary(tmp_path, previous_run, sig, code, word, stage):
    prev = tmp_path / "prev"
    shutil.copytree(previous_run, prev)
    before = folder_digest(prev)
    proc = _sim(["run", "-w", "chatbot", "-n", "300", "-q", "-o", "prev"], tmp_path, pause=stage)
    line = proc.stderr.readline()  # blocks until the process stands at the stage
    assert line.strip() == f"infersim: paused at {stage}", line + proc.stderr.read()
    assert any(p.name.startswith(".prev.tmp-") for p in tmp_path.iterdir())  # it was mid-run
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == code
    err = proc.stderr.read()
    assert word in err and "Traceback" not in err, err
    assert folder_digest(prev) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prev"]


def test_signal_on_a_first_run_leaves_nothing(tmp_path):
    proc = _sim(["run", "-w", "chatbot", "-n", "300", "-q", "-o", "new"], tmp_path, pause="simulating")
    assert proc.stderr.readline().strip() == "infersim: paused at simulating"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143
    assert list(tmp_path.iterdir()) == []


def test_a_killed_runs_staging_folder_goes_at_the_next_run(tmp_path):
    """SIGKILL (the OOM killer) runs no clean-up: the staging folder stays. The next run into the
    same place writes its folder and removes that leftover, whose process is gone; a live run's
    folder and a folder not named as infersim names them stay."""
    proc = _sim(["run", "-w", "chatbot", "-n", "300", "-q", "-o", "prev"], tmp_path, pause="simulating")
    assert proc.stderr.readline().strip() == "infersim: paused at simulating"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=120) == -signal.SIGKILL
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".prev.tmp-") and f"-{proc.pid}-" in left[0]
    alive = _sim(["run", "-w", "chatbot", "-n", "300", "-q", "-o", "prev"], tmp_path, pause="simulating")
    assert alive.stderr.readline().strip() == "infersim: paused at simulating"
    (tmp_path / ".prev.tmp-2mf7sj6g").mkdir()  # an unknown owner
    try:
        done = _sim(["run", "-w", "chatbot", "-n", "20", "-q", "--no-plots", "-o", "prev"], tmp_path)
        assert done.wait(timeout=300) == 0, done.stderr.read()
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names[0] == ".prev.tmp-2mf7sj6g" and f"-{alive.pid}-" in names[1] and names[2:] == ["prev"], names
        assert (tmp_path / "prev" / "summary.json").is_file()
    finally:
        alive.send_signal(signal.SIGTERM)
        assert alive.wait(timeout=120) == 143


def test_a_refused_run_leaves_no_folder_it_created(tmp_path, monkeypatch, capsys):
    """A run refused after its output was staged (the weights do not fit) removes the folders it
    made on the way to --out, and keeps an empty folder the user had."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    big = ["run", "-w", "chatbot", "--model", "llama-3-70b", "--hardware", "h100-sxm", "-n", "5", "-q"]
    for out in ("a/b/c", "mine/x/y", None):
        assert main(big + (["-o", out] if out else [])) == 2
    assert "does not fit" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["mine"]


@pytest.mark.parametrize("existing", ["", "keep"])
def test_a_failed_fill_in_place_command_removes_only_what_it_created(tmp_path, existing):
    """claimed_dir (validations, studies): on failure the folder and the parents it created go,
    a parent that was there stays, even when empty."""
    from infersim.simulator.metrics.rundir import claimed_dir

    base = tmp_path / existing if existing else tmp_path
    base.mkdir(exist_ok=True)
    with pytest.raises(RuntimeError):
        with claimed_dir(base / "p" / "q" / "out", command="validate"):
            raise RuntimeError("the work failed")
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")] == ([existing] if existing else [])


def test_a_folder_another_command_wrote_is_refused_and_kept(tmp_path, capsys):
    """`sim medusa` or `sim sweep` into a run folder mixed their files with the run's, and a
    `sim run` into a study's folder replaced it whole; each is refused without --force."""
    run = tmp_path / "r"
    assert main([*RUN, "-o", str(run)]) == 0
    before = folder_digest(run)
    study = ["medusa", "--candidates", "1,4", "--batches", "1", "--seqs", "1024"]
    assert main([*study, "--out", str(run)]) == 2
    _one_line_error(capsys, f"--out {run}: holds the results of `sim run`, not of `sim medusa`", "--force")
    assert folder_digest(run) == before
    space = tmp_path / "space.yaml"
    space.write_text("parameters:\n  serving.preemption: [recompute, swap]\n")
    assert main(["sweep", "-w", "chatbot", "-s", str(space), "--out", str(run), "--workers", "1", "-q"]) == 2
    _one_line_error(capsys, "holds the results of `sim run`, not of `sim sweep`")
    assert folder_digest(run) == before
    medusa = tmp_path / "m"
    assert main([*study, "--out", str(medusa)]) == 0
    capsys.readouterr()
    kept = folder_digest(medusa)
    assert main([*RUN, "-o", str(medusa)]) == 2
    _one_line_error(capsys, "holds the results of `sim medusa`, not of `sim run`")
    assert folder_digest(medusa) == kept
    assert main([*RUN, "-o", str(medusa), "--force"]) == 0  # --force replaces it, as any folder
    assert (medusa / "summary.json").is_file() and not (medusa / "medusa_study.csv").exists()
