"""`sim validate`'s command line: what it prints before any run."""

from infersim.analysis.validate.cases import CASES
from infersim.cli.main import main


def test_list_heads_its_columns_and_says_what_small_means(capsys):
    assert main(["validate", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["case", "mode", "small", "what"]
    assert lines[-1].startswith("small: ")
    rows = {line.split()[0]: line for line in lines[1:-1]}
    assert list(rows) == list(CASES)
    for name, case in CASES.items():
        assert rows[name].split()[2] == "yes" if case.small else rows[name].split()[2] != "yes"


def test_the_printed_table_names_each_source_in_a_word_and_explains_it_once_under_the_verdict(capsys):
    from infersim.cli.validate import print_checks

    why = "cost model (total bias +50.9% on the executed batches)"
    checks = [
        {"metric": "throughput", "value": -0.34, "target": 0.1, "ok": False, "component": why, "kind": "cost model"},
        {"metric": "TTFT p99", "value": 0.53, "target": 0.2, "ok": False, "component": why, "kind": "cost model"},
        {"metric": "TPOT p99", "value": 0.05, "target": 0.2, "ok": True, "component": "", "kind": ""},
    ]
    print_checks({"case": "c", "checks": checks})
    out = capsys.readouterr().out
    assert "verdict: 2 of 3 targets missed" in out and out.count("total bias +50.9%") == 1
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert [("cost model" in r, "pass" in r) for r in rows] == [(True, False), (True, False), (False, True)]
    print_checks({"case": "c", "checks": checks[2:]})
    assert "verdict: all 1 targets met" in capsys.readouterr().out


def test_a_metric_name_wraps_between_words_never_inside_one(capsys, monkeypatch):
    """At 80 columns the table printed 'per-iterati…'."""
    from infersim.cli.validate import print_checks

    monkeypatch.setenv("COLUMNS", "80")
    checks = [
        {"metric": "per-iteration latency MAPE", "value": 0.093, "raw": 0.063, "target": 0.1, "ok": True},
        {"metric": "throughput (output tok/s)", "value": 0.087, "raw": 0.087, "target": 0.1, "ok": True},
        {"metric": "TTFT p99", "value": -0.35, "raw": -0.35, "target": 0.2, "ok": False, "component": "cost model"},
    ]
    for c in checks:
        c.setdefault("component", "")
        c["judged_on"] = "local speed"
    print_checks({"case": "plain-load", "checks": checks})
    out = capsys.readouterr().out
    assert "per-iteration" in out and "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 80
