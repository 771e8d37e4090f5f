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
