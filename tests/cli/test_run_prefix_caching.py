"""`sim run` with prefix caching: the override flag, the side-by-side run without caching in
summary.json, the terminal line, and the refusal when caching is off."""

import json

from infersim.cli.main import main

WORKLOAD = """name: chat
model: opt-1.3b
hardware: {profile: a100-80gb-pcie}
serving: {prefix_caching: true}
requests:
  count: 30
  arrival: {type: poisson, rate: 20}
  prompt_tokens: {type: uniform, low: 20, high: 80}
  output_tokens: {type: fixed, value: 16}
  sharing: {conversations: 3, system_prompt_tokens: 512, max_turns: 5}
"""


def _workload(tmp_path):
    path = tmp_path / "chat.yaml"
    path.write_text(WORKLOAD)
    return str(path)


def test_compare_puts_both_runs_in_the_summary(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "-w", _workload(tmp_path), "-o", str(out), "--no-plots", "--compare-prefix-caching"]) == 0
    s = json.loads((out / "summary.json").read_text())
    off = s["without_prefix_caching"]
    assert s["prefix_cache"]["hit_rate_tokens"] > 0.5 and s["prefix_cache"]["prefill_tokens_saved"] > 0
    assert s["ttft_s"]["mean"] < off["ttft_s"]["mean"] and off["finished"] == s["finished"] == 30
    assert "prefix cache: hit rate" in capsys.readouterr().out


def test_the_flag_turns_caching_off_and_compare_then_refuses(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "-w", _workload(tmp_path), "-o", str(out), "-q", "--no-plots", "--prefix-caching", "off"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert "prefix_cache" not in s
    argv = ["run", "-w", _workload(tmp_path), "-o", str(tmp_path / "x"), "--prefix-caching", "off"]
    assert main([*argv, "--compare-prefix-caching"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "chat.yaml" in err[0] and "prefix_caching" in err[0]
    assert not (tmp_path / "x").exists()
