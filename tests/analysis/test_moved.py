"""The reproductions' comparison against their datasheet-roofline run (analysis/reproduce/moved.py)."""

from __future__ import annotations

import pandas as pd

from infersim.analysis.reproduce.moved import Headline, moved_section, reference_path


def _speedup(rows: pd.DataFrame) -> float:
    return float(rows.loc[rows["label"] == "tree", "speedup"].iloc[0])


HEADLINES = [
    Headline("speedup", _speedup),
    Headline("best", lambda rows: str(rows.loc[rows["speedup"].idxmax(), "label"])),
    Headline("served", lambda rows: float(rows["tok_s"].max()), "{:.0f}", "serving"),
    Headline("absent", lambda rows: float(rows["no_such_column"].iloc[0])),
]


def _write_reference(tmp_path, stem: str, df: pd.DataFrame) -> None:
    df.to_csv(reference_path(tmp_path, stem), index=False)  # the .gz name makes pandas compress it


def test_each_quantity_is_stated_on_both_runs_with_its_ratio(tmp_path):
    _write_reference(tmp_path, "study", pd.DataFrame({"label": ["tree", "plain"], "speedup": [2.0, 1.0]}))
    _write_reference(tmp_path, "serving", pd.DataFrame({"tok_s": [100.0, 300.0]}))
    now = {
        "study": pd.DataFrame({"label": ["tree", "plain"], "speedup": [1.5, 1.0]}),
        "serving": pd.DataFrame({"tok_s": [240.0]}),
    }
    text = moved_section(now, tmp_path, HEADLINES)
    assert "`study.datasheet.csv.gz`, `serving.datasheet.csv.gz`" in text
    assert "| speedup | 2.00 | 1.50 | 0.75 |" in text  # 1.5 / 2.0
    assert "| best | tree | tree | - |" in text
    assert "| served | 300 | 240 | 0.80 |" in text  # the serving table's own reference
    assert "| absent | - | - | - |" in text


def test_no_section_without_the_datasheet_run(tmp_path):
    assert moved_section({"study": pd.DataFrame({"speedup": [1.0]})}, tmp_path, HEADLINES) == ""
