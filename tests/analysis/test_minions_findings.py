"""The Minions write-up quotes its figures from the run's rows (and the datasheet run's, when kept):
hand-made optimum tables go in, the sentences of section 1 come out with the values counted by hand;
the paragraph filler never opens a markdown list by accident."""

import re

import pandas as pd

from infersim.analysis.reproduce.minions import Tables, _pct, _reflow, _share, _span, discuss_fig2

EMPTY = pd.DataFrame()


def _opt(s_opt: dict) -> Tables:
    """An optimum table over (pair, dataset, batch) -> s*, the sweep being s = 1..16."""
    rows = [{"pair": p, "dataset": d, "batch": b, "s_opt": s, "interior": 1 < s < 16} for (p, d, b), s in s_opt.items()]
    return Tables(pd.DataFrame(rows), EMPTY, EMPTY, EMPTY, EMPTY, EMPTY)


def _grid(opt13: dict, llama: dict) -> dict:
    """s* for every (pair, dataset, batch) from {(dataset, batch): s} per pair."""
    return {("opt-13b", *k): v for k, v in opt13.items()} | {("llama-2-70b", *k): v for k, v in llama.items()}


DS = ("finance", "chatbot", "dialogue")
NOW = _grid(
    {(d, b): (6 if d == "dialogue" and b == 32 else 7) for d in DS for b in (8, 16, 32)},
    {(d, b): {8: 5, 16: 3, 32: 1 if d != "dialogue" else 3}[b] for d in DS for b in (8, 16, 32)},
)
DATASHEET = _grid(
    {(d, b): {8: 14, 16: 10, 32: 6}[b] for d in DS for b in (8, 16, 32)},
    {(d, b): 4 for d in DS for b in (8, 16, 32)},
)


def test_fig2_discussion_quotes_this_run_and_what_moved():
    text = " ".join(discuss_fig2(_opt(NOW), _opt(DATASHEET)).split())
    assert "the optimum is s = 7 on finance and chatbot and 6-7 on dialogue over batch 8 to 32" in text
    assert "at batch 16 it is 7 on finance and 7 on dialogue" in text
    assert "it is 5 at batch 8, 3 at batch 16 and 1-3 at batch 32" in text
    # the two settings at s = 1 are named, and the interior count is 18 - 2
    assert "For Llama-2-70B finance batch 32 and Llama-2-70B chatbot batch 32 the optimum is s = 1" in text
    assert "holds in 16 of 18 settings" in text
    assert (
        "moves with batch size for OPT-13B on dialogue and Llama-2-70B, not for OPT-13B on finance and chatbot" in text
    )
    # datasheet: OPT 6-14 and Llama 4 everywhere, all interior, OPT moving with batch, Llama not
    assert "the optimum was 6-14 for OPT-13B and 4 for Llama-2-70B, interior in 18 of 18" in text
    assert "moving with batch size for OPT-13B;" in text
    # lower now: OPT at batch 8 and 16, Llama at batch 16 and 32 (3 datasets each: 12); higher: Llama at
    # batch 8 (3) and OPT at batch 32 on finance and chatbot (7 > 6: 2); OPT dialogue batch 32 the same
    assert "lower than there in 12 of 18 settings, higher in 5" in text


def test_fig2_discussion_without_the_datasheet_run_says_nothing_about_it():
    assert "datasheet" not in discuss_fig2(_opt(NOW), None)


def test_ranges_and_percentages():
    assert _span([7, 7.2]) == "7" and _span([5, 7]) == "5-7" and _span([]) == "-"
    assert _pct([-0.3, 12.6]) == "+0% to +13%"  # a loss that rounds to nothing reads +0%, never -0%
    assert _pct([-5.6, -2.7]) == "-6% to -3%"
    assert _share([0.934, 0.981]) == "93-98%" and _share([]) == "-"


def test_reflow_fills_paragraphs_and_bullets_and_opens_no_list():
    text = "aaaa bbbb 2. cccc dddd\n\n* one two three\n* four\n\n| a | b |\n|---|---|"
    out = _reflow(text, width=9)
    # "2." would open an ordered list at the start of a line: it stays on the line before
    assert out.split("\n\n")[0] == "aaaa bbbb 2.\ncccc dddd"
    assert out.split("\n\n")[1] == "* one two\n  three\n* four"
    assert out.split("\n\n")[2] == "| a | b |\n|---|---|"  # a table is left as it is
    words = "s -= s_punish and + 5 - 3 * 2 # 1. x " * 20
    for line in _reflow(words, width=30).splitlines():
        assert not re.match(r"^(\d+[.)]|[-+*>]|#+)\s", line), line
