"""`sim run` end to end: outputs, determinism, bad input, atomic run directories."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infersim.cli.main import main
from tests.utils import folder_digest


def test_run_writes_directory_and_is_byte_identical(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["run", "--workload", "chatbot.yaml", "-n", "200", "-o", str(a), "-q"]) == 0
    assert main(["run", "--workload", "chatbot", "-n", "200", "-o", str(b), "-q"]) == 0
    files = folder_digest(a)
    for name in (
        "config.yaml",
        "requests.parquet",
        "series.parquet",
        "summary.json",
        "plots/latency_cdf.png",
        "plots/timeline.png",
        "plots/throughput.png",
    ):
        assert name in files
    assert files == folder_digest(b)
    import json

    s = json.loads((a / "summary.json").read_text())
    assert s["requests"] == 200 and s["finished"] == 200
    assert s["ttft_s"]["p50"] <= s["ttft_s"]["p99"]


def test_a_speculative_run_prints_its_acceleration_as_sim_exec_does(tmp_path, capsys):
    import json

    wl = Path(__file__).resolve().parents[2] / "examples" / "speculative" / "draft.yaml"
    assert main(["run", "-w", str(wl), "-n", "12", "-o", str(tmp_path / "r"), "--no-plots"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    sx = json.loads((tmp_path / "r" / "summary.json").read_text())["speculation"]
    line = f"speculation (draft, {sx['mode']}): {sx['acceleration_rate']:.2f} tokens per target step"
    assert line in printed and f"acceptance {sx['acceptance_rate']:.2f}" in printed, printed
    assert "s simulated" in printed


def test_seed_changes_results(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    main(["run", "-w", "chatbot", "-n", "100", "-o", str(a), "-q", "--no-plots"])
    main(["run", "-w", "chatbot", "-n", "100", "-o", str(b), "-q", "--no-plots", "--seed", "7"])
    assert folder_digest(a)["requests.parquet"] != folder_digest(b)["requests.parquet"]


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


def test_unknown_model_lists_known(tmp_path, capsys):
    assert main(["run", "-w", "chatbot", "--model", "gpt-17", "-o", str(tmp_path / "r"), "-q"]) == 2
    err = _err(capsys)
    assert "gpt-17" in err and "llama-2-7b" in err and "opt-13b" in err


def test_unknown_hardware_and_policy(tmp_path, capsys):
    assert main(["run", "-w", "chatbot", "--hardware", "tpu-v9", "-o", str(tmp_path / "r"), "-q"]) == 2
    assert "a100-80gb-pcie" in _err(capsys)
    assert main(["run", "-w", "chatbot", "--preemption", "teleport", "-o", str(tmp_path / "r"), "-q"]) == 2
    assert "cost_aware" in _err(capsys)


@pytest.mark.parametrize(
    "text,needle",
    [
        ("model: [unclosed\n", "malformed YAML"),
        (
            "requests:\n  count: 10\n  arrival: {type: poisson, rate: -3}\n"
            "  prompt_tokens: {type: fixed, value: 5}\n  output_tokens: {type: fixed, value: 5}\n",
            "rate",
        ),
        (
            "requests:\n  count: 10\n  arrival: {type: poisson, rate: 1}\n  prompt_tokens: {type: fixed, value: 5}\n"
            "  output_tokens: {type: fixed, value: 5}\nserving: {block_size: sixteen}\n",
            "serving.block_size",
        ),
        (
            "model: llama-2-7b\nhardware: {tensor_parallel: 3}\nrequests:\n  count: 10\n  arrival: {type: poisson, rate: 1}\n"
            "  prompt_tokens: {type: fixed, value: 5}\n  output_tokens: {type: fixed, value: 5}\n",
            "field 'hardware.tensor_parallel': tensor parallel 3 does not divide llama-2-7b's 32 attention heads",
        ),
    ],
)
def test_bad_workload_file_is_one_line_exit_2(tmp_path, capsys, text, needle):
    wl = tmp_path / "bad.yaml"
    wl.write_text(text)
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "r"), "-q"]) == 2
    err = _err(capsys)
    assert "bad.yaml" in err and needle in err
    assert not (tmp_path / "r").exists()


def test_trace_with_missing_column(tmp_path, capsys):
    (tmp_path / "t.csv").write_text("time,input\n0.0,10\n0.5,20\n")
    wl = tmp_path / "w.yaml"
    wl.write_text("requests:\n  trace: {file: t.csv, arrival_column: time, prompt_column: input, output_column: out}\n")
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "r"), "-q"]) == 2
    err = _err(capsys)
    assert "t.csv" in err and "'out'" in err


def test_failed_run_keeps_previous_results(tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert main(["run", "-w", "chatbot", "-n", "50", "-o", str(out), "-q"]) == 0
    before = folder_digest(out)

    import infersim.cli.run

    def broken(run_dir):
        (Path(run_dir) / "plots").mkdir(exist_ok=True)
        (Path(run_dir) / "plots" / "half.png").write_bytes(b"\x89PNG")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(infersim.cli.run, "plot_run", broken)
    with pytest.raises(RuntimeError):
        main(["run", "-w", "chatbot", "-n", "60", "-o", str(out), "-q"])
    assert folder_digest(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no temporary folders left behind


def test_help_for_every_subcommand(capsys):
    from infersim.cli.commands import COMMANDS

    for cmd in COMMANDS:
        with pytest.raises(SystemExit) as exc:
            main([cmd, "--help"])
        assert exc.value.code == 0
        assert "usage: sim" in capsys.readouterr().out


def test_installed_sim_finds_builtins_from_any_directory(tmp_path):
    exe = shutil.which("sim")
    assert exe is not None, "the sim console script is not on PATH: pip install -e ."
    for args in (["workloads"], ["models", "opt-13b"], ["hardware", "a100-80gb-pcie"]):
        done = subprocess.run([exe, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    done = subprocess.run(
        [exe, "run", "-w", "chatbot", "-n", "20", "-q", "--no-plots", "-o", "r"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r" / "summary.json").exists()
    done = subprocess.run([sys.executable, "-c", "import infersim.cli.main"], cwd=tmp_path, capture_output=True)
    assert done.returncode == 0
