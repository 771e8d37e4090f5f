"""The public traces shipped in traces/data/: each has a built-in replay workload that reads the
gzipped file and reproduces the statistics traces/SOURCES.md gives for it."""

from __future__ import annotations

import gzip
import json
import re

import numpy as np
import pytest

from infersim.simulator.paths import workloads_dir
from infersim.simulator.workload.builder import build_requests, list_workloads, load_workload

# mean prompt, mean output (None: not in the file), mean rate (req/s; None: no times), rows;
# from traces/SOURCES.md. gsm8k prompts: 44 words x 1.3 tokens per word.
SOURCES_STATS = {
    "replay-azure-code": (2048, 28, 2.57, 8819),
    "replay-azure-conv": (1155, 211, 5.53, 19366),
    "replay-mooncake": (12035, 343, 3.40, 12031),
    "replay-sharegpt": (2340, 439, None, 30731),
    "replay-sharegpt-v3": (248, 325, None, 58000),
    "replay-bwb": (1067, 1613, None, 33768),
    "replay-arxiv": (2588, 291, None, 28257),
    "replay-gsm8k": (44 * 1.3, None, None, 7266),
}


def test_every_shipped_trace_has_a_built_in_replay():
    data = {p.name for p in (workloads_dir() / "data").glob("*.gz")}
    replays = {n: load_workload(n)[0].requests.trace.file for n in list_workloads() if n.startswith("replay-")}
    assert set(replays) == set(SOURCES_STATS)
    assert {f.removeprefix("data/") for f in replays.values()} == data


def test_sources_lists_every_shipped_file_with_its_licence():
    text = (workloads_dir() / "SOURCES.md").read_text()
    for p in (workloads_dir() / "data").glob("*.gz"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {p.name} |"))
        assert re.search(r"CC-BY-4\.0|Apache-2\.0|MIT", row), row


@pytest.mark.parametrize("name", sorted(SOURCES_STATS))
def test_replay_reproduces_the_trace_statistics(name):
    prompt, output, rate, rows = SOURCES_STATS[name]
    s, path = load_workload(name)
    r = build_requests(s, path)
    assert len(r) == rows
    assert r.prompt_tokens.mean() == pytest.approx(prompt, rel=0.03)
    if output is not None:
        assert r.output_tokens.mean() == pytest.approx(output, rel=0.01)
    assert r.arrival_s[0] >= 0.0 and (np.diff(r.arrival_s) >= 0).all()
    if rate is not None:  # replayed times, shifted to start at 0
        assert r.arrival_s[0] == 0.0
        assert len(r) / r.arrival_s[-1] == pytest.approx(rate, rel=0.01)


def test_mooncake_timestamps_are_milliseconds():
    s, path = load_workload("replay-mooncake")
    assert s.requests.trace.time_unit == "ms"
    assert build_requests(s, path).arrival_s[-1] == pytest.approx(3537.0, abs=1.0)  # an hour, not 3.5e6 s


def test_gzipped_and_plain_files_read_the_same(tmp_path):
    rows = [{"t": 0.5 * i, "p": 10 + i, "o": 3 + i} for i in range(5)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as fh:
        fh.write((tmp_path / "a.jsonl").read_text())
    (tmp_path / "b.csv").write_text("t,p,o\n" + "".join(f"{r['t']},{r['p']},{r['o']}\n" for r in rows))
    with gzip.open(tmp_path / "b.csv.gz", "wt") as fh:
        fh.write((tmp_path / "b.csv").read_text())
    got = []
    for f in ("a.jsonl", "a.jsonl.gz", "b.csv", "b.csv.gz"):
        (tmp_path / "w.yaml").write_text(
            f"requests: {{trace: {{file: {f}, arrival_column: t, prompt_column: p, output_column: o}}}}\n"
        )
        s, path = load_workload(str(tmp_path / "w.yaml"))
        r = build_requests(s, path)
        got.append((r.arrival_s.tolist(), r.prompt_tokens.tolist(), r.output_tokens.tolist()))
    assert got[0] == ([0.0, 0.5, 1.0, 1.5, 2.0], [10, 11, 12, 13, 14], [3, 4, 5, 6, 7])
    assert all(g == got[0] for g in got)


def test_corrupt_gzip_is_one_error_naming_the_file(tmp_path):
    from infersim.simulator.errors import InfersimError

    (tmp_path / "bad.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00not gzip at all")
    (tmp_path / "w.yaml").write_text(
        "requests: {trace: {file: bad.jsonl.gz, arrival_column: t, prompt_column: p, output_column: o}}\n"
    )
    s, path = load_workload(str(tmp_path / "w.yaml"))
    with pytest.raises(InfersimError, match="bad.jsonl.gz"):
        build_requests(s, path)
