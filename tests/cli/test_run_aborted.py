"""Aborted requests reach the user: counted by reason in summary.json and the terminal (one
stderr line under -q), and a run where no request finished exits 3, plots included."""

import json

import pytest

from infersim.cli.main import main
from infersim.cli.run import EXIT_NOTHING_FINISHED

WORKLOAD = """name: toolong
model: opt-1.3b
hardware: {profile: a100-80gb-pcie}
serving: {max_model_len: 1000}
requests:
  count: 20
  arrival: {type: poisson, rate: 10}
  prompt_tokens: {type: fixed, value: PROMPT}
  output_tokens: {type: fixed, value: 8}
"""


def _workload(tmp_path, prompt: int):
    path = tmp_path / f"w{prompt}.yaml"
    path.write_text(WORKLOAD.replace("PROMPT", str(prompt)))
    return str(path)


@pytest.mark.parametrize("plots", [True, False])
def test_every_prompt_longer_than_the_context(tmp_path, capsys, plots):
    out = tmp_path / "r"
    args = ["run", "-w", _workload(tmp_path, 1500), "-o", str(out), "-q"] + ([] if plots else ["--no-plots"])
    assert main(args) == EXIT_NOTHING_FINISHED == 3
    err = capsys.readouterr().err
    assert "20 of 20 requests aborted: 20 longer than the context" in err
    assert "no request finished" in err and "Traceback" not in err
    s = json.loads((out / "summary.json").read_text())
    assert s["finished"] == 0 and s["aborted"] == 20 and s["aborted_by_reason"] == {"exceeds_context": 20}
    assert (out / "plots" / "latency_cdf.png").is_file() == plots


def test_terminal_summary_names_the_reason(tmp_path, capsys):
    assert main(["run", "-w", _workload(tmp_path, 1500), "-o", str(tmp_path / "r"), "--no-plots"]) == 3
    assert "20 of 20 requests aborted: 20 longer than the context" in capsys.readouterr().out


def test_a_run_without_aborts_says_nothing_more(tmp_path, capsys):
    assert main(["run", "-w", _workload(tmp_path, 200), "-o", str(tmp_path / "r"), "-q", "--no-plots"]) == 0
    assert capsys.readouterr().err == ""


def test_help_documents_the_exit_status(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert f"{EXIT_NOTHING_FINISHED} the run completed but no request finished" in capsys.readouterr().out
