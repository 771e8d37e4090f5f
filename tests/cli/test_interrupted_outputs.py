"""Interrupted commands leave whole results: the files of one result (a profile, its sidecar
and measured GEMM table, a figure) are staged under hidden names and moved into place together,
so Ctrl-C or SIGTERM at the worst moment leaves the previous files byte-identical, or nothing
when there was nothing; the staged files and the folders made for them go."""

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infersim.cli.main import main
from infersim.simulator.metrics.rundir import PAUSE_ENV, staged_files
from infersim.simulator.paths import hwprofiles_dir
from tests.cli.fuzz_harness import TINY_WORKLOAD
from tests.utils import folder_digest

CALIBRATION_TABLE = Path(__file__).resolve().parents[1] / "data" / "linear_ops_a100_llama3_8b.csv"


def _tree(folder):
    """Every path under `folder` (hidden ones included), relative to it."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


# ---- the helper -------------------------------------------------------------------------------------------------
def test_staged_files_commit_together_and_an_error_keeps_the_old_set(tmp_path):
    a, b = tmp_path / "r.csv.gz", tmp_path / "r.yaml"
    with staged_files(a, None, b) as staged:
        staged.path(a).write_bytes(b"table 1")
        staged.path(b).write_text("names table 1\n")
        assert not a.exists() and not b.exists()  # nothing in place before the end
    assert (a.read_bytes(), b.read_text()) == (b"table 1", "names table 1\n")
    before = folder_digest(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with staged_files(a, b) as staged:
            staged.path(a).write_bytes(b"table 2")  # the companion is written first...
            raise KeyboardInterrupt  # ...and the main file never
    assert folder_digest(tmp_path) == before and _tree(tmp_path) == ["r.csv.gz", "r.yaml"]


def test_a_failed_rename_in_the_commit_puts_the_previous_files_back(tmp_path, monkeypatch):
    import os

    a, b = tmp_path / "r.csv.gz", tmp_path / "r.yaml"
    a.write_bytes(b"old table")
    b.write_text("old profile\n")
    before = folder_digest(tmp_path)
    real_replace, calls = os.replace, []

    def replace_failing_on_the_main_file(src, dst):
        calls.append((src, dst))
        if str(dst) == str(b) and "staged" in str(src):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_failing_on_the_main_file)
    with pytest.raises(OSError):
        with staged_files(a, b) as staged:
            staged.path(a).write_bytes(b"new table")
            staged.path(b).write_text("new profile\n")
    assert len(calls) > 3  # the table was already in place when the profile's rename failed
    assert folder_digest(tmp_path) == before and _tree(tmp_path) == ["r.csv.gz", "r.yaml"]


def test_staged_files_remove_the_folders_they_made(tmp_path):
    target = tmp_path / "new" / "deeper" / "r.yaml"
    with pytest.raises(KeyboardInterrupt):
        with staged_files(target) as staged:
            staged.path(target).write_text("x\n")
            raise KeyboardInterrupt
    assert _tree(tmp_path) == []
    with staged_files(target):  # nothing written: nothing committed, no folder left
        pass
    assert _tree(tmp_path) == []


# ---- sim profile: measurements of the committed reference profile instead of new sweeps ---------------------------
def _measure_the_reference(monkeypatch):
    """`sim profile` on the reference profile's measurements (every seventh step time) instead
    of sweeping this machine: the fits, the GEMM table and the regressors are the real ones.
    Returns the profiler module and the machine's speed (machine["slower"] scales the times)."""
    pytest.importorskip("torch")
    from infersim.executor.profiler import run as profiler

    sidecar = json.loads((hwprofiles_dir() / "cpu-reference.calib.json").read_text())
    machine = {"slower": 1.0}  # a later run on a slower machine measures other times

    def measured(run):
        run.b.records.extend({**r, "median_s": r["median_s"] * machine["slower"]} for r in sidecar["curves"])
        return {}, {}, [dict(r) for r in sidecar["steps"][::7]]

    monkeypatch.setattr(profiler, "_sweeps", measured)
    return profiler, machine


@pytest.fixture
def reference_sweeps(monkeypatch):
    return _measure_the_reference(monkeypatch)


@pytest.fixture(scope="module")
def first_profile(tmp_path_factory):
    """A completed `sim profile` on the reference measurements (cpu.yaml, its sidecar and its
    GEMM table), made once for the tests that interrupt a later run over it: each copies the
    folder, so each starts from the same bytes."""
    folder = tmp_path_factory.mktemp("first-profile")
    with pytest.MonkeyPatch.context() as mp:
        _measure_the_reference(mp)
        assert _profile(folder / "cpu.yaml") == 0
    return folder


def _copy_of(folder, into):
    """The files of `folder` copied into `into`; returns `into`/cpu.yaml."""
    shutil.copytree(folder, into, dirs_exist_ok=True)
    return into / "cpu.yaml"


def _interrupt_after(monkeypatch, module, name, check=None):
    """`module.name` runs, then `check(its result)`, then Ctrl-C."""
    real = getattr(module, name)

    def then_interrupted(*args, **kwargs):
        result = real(*args, **kwargs)
        if check is not None:
            check(result)
        raise KeyboardInterrupt

    monkeypatch.setattr(module, name, then_interrupted)


def _profile(out, *extra):
    return main(["profile", "--quick", "--no-validate", "--threads", "1", "-q", "--out", str(out), *extra])


def _reads_the_staged_table(fitted):
    """The cost models of the run price GEMMs with the table it measured, staged, not yet in place."""
    hw = fitted[0]
    table = Path(hw.calibration.gemm.measured_shapes.file)
    assert table.name.startswith(".staged-") and table.is_file()


@pytest.mark.torch
def test_an_interrupted_first_profile_leaves_nothing(tmp_path, reference_sweeps, monkeypatch):
    profiler, _ = reference_sweeps
    (tmp_path / "keep.txt").write_text("mine\n")
    # right after the fit wrote the measured GEMM table: the step-overhead fit on cost models that read it
    _interrupt_after(monkeypatch, profiler, "_fit_step_overhead", _reads_the_staged_table)
    assert _profile(tmp_path / "new" / "cpu.yaml") == 130
    assert _tree(tmp_path) == ["keep.txt"]


@pytest.mark.torch
@pytest.mark.parametrize("step", ["_fit_step_overhead", "_held_out_checks"])
def test_an_interrupted_profile_with_force_keeps_every_old_file(
    tmp_path, first_profile, reference_sweeps, monkeypatch, step
):
    profiler, machine = reference_sweeps
    out = _copy_of(first_profile, tmp_path)
    before = folder_digest(tmp_path)
    assert sorted(before) == ["cpu.calib.json", "cpu.gemm-shapes.csv.gz", "cpu.yaml"]
    machine["slower"] = 1.25  # the new run's GEMM table differs from the old one
    _interrupt_after(monkeypatch, profiler, step)
    assert _profile(out, "--force") == 130
    assert folder_digest(tmp_path) == before and _tree(tmp_path) == sorted(before)
    # and an interrupted refit in place, after its fit staged a new table
    _interrupt_after(monkeypatch, profiler, "_fit_step_overhead", _reads_the_staged_table)
    assert main(["profile", "--refit", str(out), "--no-validate", "--seed", "2", "-q"]) == 130
    assert folder_digest(tmp_path) == before and _tree(tmp_path) == sorted(before)


@pytest.mark.torch
def test_models_only_into_another_folder_takes_the_table_along(tmp_path, first_profile, reference_sweeps, monkeypatch):
    """`--refit P --models-only --out elsewhere/Q.yaml` writes Q's own copy of P's measured GEMM
    table (Q names the table beside itself), staged with Q's YAML and sidecar."""
    from infersim.simulator.hardware.catalog import load_hardware

    profiler, _ = reference_sweeps
    old = _copy_of(first_profile, tmp_path)
    monkeypatch.setattr(profiler, "_measure_models", lambda *a: {"models": {}})  # no model measured
    new = tmp_path / "elsewhere" / "q.yaml"
    argv = ["profile", "--refit", str(old), "--models-only", "--model", "zoo-target", "--out", str(new), "-q"]
    assert main(argv) == 0
    assert _tree(new.parent) == ["q.calib.json", "q.gemm-shapes.csv.gz", "q.yaml"]
    table = load_hardware(str(new)).calibration.gemm.measured_shapes.file
    assert Path(table) == new.with_name("q.gemm-shapes.csv.gz").resolve()
    assert Path(table).read_bytes() == (tmp_path / "cpu.gemm-shapes.csv.gz").read_bytes()


# ---- sim calibrate --------------------------------------------------------------------------------------------------
def _calibrate(out, *extra):
    return ["calibrate", str(CALIBRATION_TABLE), "--hardware", "a100-80gb-sxm", "--out", str(out), *extra]


def test_an_interrupted_calibrate_keeps_the_old_profile_table_and_figure(tmp_path, monkeypatch):
    from infersim.simulator.calibration import calibrate

    out, plot = tmp_path / "a100.yaml", tmp_path / "fit.png"
    assert main(_calibrate(out, "--plot", str(plot))) == 0
    before = folder_digest(tmp_path)
    assert sorted(before) == ["a100.gemm-shapes.csv.gz", "a100.yaml", "fit.png"]
    # the figure is drawn after the table is staged: interrupted there
    _interrupt_after(monkeypatch, calibrate, "plot_fit")
    assert main(_calibrate(out, "--plot", str(plot), "--force", "--name", "other")) == 130
    assert folder_digest(tmp_path) == before and _tree(tmp_path) == sorted(before)
    assert main(_calibrate(tmp_path / "sub" / "b.yaml", "--plot", str(tmp_path / "sub" / "b.png"))) == 130
    assert folder_digest(tmp_path) == before and _tree(tmp_path) == sorted(before)


def _sim(args, cwd, pause):
    import os

    env = {**os.environ, "MPLBACKEND": "Agg", PAUSE_ENV: pause}
    return subprocess.Popen(
        [sys.executable, "-m", "infersim.cli.main", *args], cwd=cwd, env=env, stderr=subprocess.PIPE, text=True
    )


def test_sigterm_before_the_commit_keeps_the_old_calibrated_profile(tmp_path):
    """A real `sim calibrate --force` stopped by SIGTERM with its new table, figure and profile
    staged: the old three files are byte-identical and nothing staged is left."""
    out, plot = tmp_path / "a100.yaml", tmp_path / "fit.svg"
    assert main(_calibrate(out, "--plot", str(plot))) == 0
    before = folder_digest(tmp_path)
    proc = _sim(_calibrate(out, "--plot", str(plot), "--force", "--name", "other"), tmp_path, "committing")
    assert proc.stderr.readline().strip() == "infersim: paused at committing"
    assert sum(p.name.startswith(".staged-") for p in tmp_path.iterdir()) == 3  # all three staged
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143
    assert "terminated" in proc.stderr.read()
    assert folder_digest(tmp_path) == before and _tree(tmp_path) == sorted(before)


# ---- sim roofline ---------------------------------------------------------------------------------------------------
def test_an_interrupted_roofline_keeps_its_old_table_and_plot(tmp_path, monkeypatch):
    """The CSV and JSON are ready long before the plot: a Ctrl-C while plotting used to leave a
    new table beside the old figure."""
    from infersim.cli import roofline

    files = {"--csv": tmp_path / "r.csv", "--json": tmp_path / "r.json", "--plot": tmp_path / "r.png"}
    flags = [str(x) for kv in files.items() for x in kv]
    assert main(["roofline", "--batch", "1", "--seq", "128", *flags]) == 0
    before = folder_digest(tmp_path)
    _interrupt_after(monkeypatch, roofline, "plot_roofline")
    assert main(["roofline", "--batch", "8", "--seq", "512", *flags, "--force"]) == 130
    assert folder_digest(tmp_path) == before and _tree(tmp_path) == ["r.csv", "r.json", "r.png"]
    new = [str(x) for kv in files.items() for x in (kv[0], kv[1].with_name("new" + kv[1].suffix))]
    assert main(["roofline", "--batch", "1", "--seq", "128", *new]) == 130
    assert _tree(tmp_path) == ["r.csv", "r.json", "r.png"]


# ---- sim sweep: the summary files of a sweep folder ----------------------------------------------------------------
def test_an_interrupted_sweep_summary_keeps_the_previous_one_whole(tmp_path, monkeypatch):
    """The tables and figures are written before the report: interrupted at the report, the
    previous summary stays byte-identical and a first summary leaves no plots/ folder."""
    from infersim.analysis import sweep
    from infersim.analysis.sweep_backends import BackendOptions

    wl = tmp_path / "wl.yaml"
    wl.write_text(yaml.safe_dump(TINY_WORKLOAD))
    space = sweep.SweepSpace.model_validate({"parameters": {"serving.max_batch_size": [8, 64]}})
    done = sweep.run_sweep(str(wl), space, tmp_path / "s", run=BackendOptions(workers=1))
    assert "plots/pareto.png" in _tree(tmp_path / "s")
    before, tree = folder_digest(tmp_path / "s"), _tree(tmp_path / "s")
    params = sweep.build_params(space)
    _interrupt_after(monkeypatch, sweep, "_summaries")
    with pytest.raises(KeyboardInterrupt):  # a summary of one row: every file would change
        sweep.write_outputs(tmp_path / "s", done.table.iloc[:1], params, space)
    assert folder_digest(tmp_path / "s") == before and _tree(tmp_path / "s") == tree
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with pytest.raises(KeyboardInterrupt):
        sweep.write_outputs(fresh, done.table, params, space)
    assert _tree(fresh) == []


# ---- sim zoo ship ---------------------------------------------------------------------------------------------------
def _fake_zoo(folder, weights: bytes):
    """A zoo folder as ship() reads it: zoo.json and a model's files (no torch needed)."""
    (folder / "zoo-x").mkdir(parents=True)
    (folder / "zoo-x" / "model.safetensors").write_bytes(weights)
    (folder / "zoo-x" / "config.json").write_text("{}\n")
    (folder / "zoo.json").write_text(json.dumps({"corpus_sha256": "c", "versions": {}, "spec": {}}) + "\n")
    return folder


def test_an_interrupted_zoo_ship_keeps_the_shipped_folder_whole(tmp_path, monkeypatch):
    """ship() used to delete the shipped folder and copy file by file: a Ctrl-C in between left
    half a zoo whose manifest was gone."""
    from infersim.executor.zoo import shipped

    out = tmp_path / "shipped"
    shipped.ship(_fake_zoo(tmp_path / "old", b"old weights"), out)
    before, tree = folder_digest(out), _tree(tmp_path)
    real, copies = shipped.shutil.copyfile, []

    def copy_then_interrupted(src, dst):
        copies.append(dst)
        if len(copies) == 2:
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(shipped.shutil, "copyfile", copy_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        shipped.ship(_fake_zoo(tmp_path / "new", b"new weights"), out)
    assert folder_digest(out) == before
    assert _tree(tmp_path) == sorted([*tree, *(f"new/{p}" for p in _tree(tmp_path / "new")), "new"])


# ---- the atomic writers -------------------------------------------------------------------------------------------
def test_an_interrupted_atomic_write_leaves_no_folder_it_made(tmp_path, monkeypatch):
    import os

    from infersim.simulator import yamlio

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        yamlio.write_atomic(tmp_path / "a" / "b" / "x.yaml", "x: 1\n")
    with pytest.raises(KeyboardInterrupt):
        with yamlio.atomic_path(tmp_path / "c" / "x.csv") as tmp:
            tmp.write_text("a\n1\n")
    assert _tree(tmp_path) == []


# ---- sim medusa -----------------------------------------------------------------------------------------------------
def test_an_interrupted_medusa_study_keeps_the_previous_table_and_figures(tmp_path, monkeypatch):
    """The CSV is ready before the three figures: interrupted at the last figure, the previous
    study's four files stay byte-identical (the folder is filled in place, so other files stay too)."""
    from infersim.analysis import medusa_study

    out = tmp_path / "study"
    assert main(["medusa", "--batch", "1", "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine\n")
    before, tree = folder_digest(out), _tree(out)
    _interrupt_after(monkeypatch, medusa_study, "plot_speedup_by_seq")
    assert main(["medusa", "--batch", "4", "--out", str(out)]) == 130
    assert folder_digest(out) == before and _tree(out) == tree


# ---- sim validate ---------------------------------------------------------------------------------------------------
@pytest.mark.torch
def test_an_interrupted_validation_keeps_the_previous_case_folder(tmp_path, monkeypatch, zoo_dir):
    """A validation writes its runs, then its verdict and report: it is built in a hidden
    sibling, so an interrupted rerun never leaves new runs beside the old report. The case's
    work is replaced by one that writes a run and a verdict (the real one takes minutes)."""
    from infersim.cli import validate

    def validated(case, model, out, opts, cost, interrupted=False):
        (out / "exec").mkdir()
        (out / "exec" / "summary.json").write_text(json.dumps({"seed": opts.seed}) + "\n")
        if interrupted:
            raise KeyboardInterrupt
        (out / "validation.json").write_text(json.dumps({"seed": opts.seed}) + "\n")
        return {"checks": []}

    wl = tmp_path / "wl.yaml"
    wl.write_text(yaml.safe_dump(TINY_WORKLOAD))
    out = tmp_path / "v"
    argv = ["validate", "-w", str(wl), "-o", str(out), "-q"]
    monkeypatch.setattr(validate, "validate_case", validated)
    assert main(argv) == 0
    before, tree = folder_digest(tmp_path), _tree(tmp_path)
    assert "v/validation.json" in tree
    monkeypatch.setattr(validate, "validate_case", lambda *a: validated(*a, interrupted=True))
    assert main([*argv, "--seed", "5"]) == 130
    assert folder_digest(tmp_path) == before and _tree(tmp_path) == tree
    assert main(["validate", "-w", str(wl), "-o", str(tmp_path / "new" / "v"), "-q"]) == 130
    assert _tree(tmp_path) == tree
