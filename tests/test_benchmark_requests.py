"""The speed benchmark's requests are vidur's: the committed file is what vidur_requests() makes
from the shipped Azure conversation trace, with vidur's trim and Poisson draw."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "sim_speed.py"


def _sim_speed():
    spec = importlib.util.spec_from_file_location("sim_speed", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_requests_are_regenerated_exactly():
    mod = _sim_speed()
    made = mod.vidur_requests()
    committed = pd.read_csv(mod.VIDUR_REQUESTS)
    assert list(committed.columns) == ["arrival_s", "prompt_tokens", "output_tokens"]
    assert len(made) == len(committed) == 10_000
    assert (made.prompt_tokens.to_numpy() == committed.prompt_tokens.to_numpy()).all()
    assert (made.output_tokens.to_numpy() == committed.output_tokens.to_numpy()).all()
    assert np.array_equal(made.arrival_s.to_numpy(), committed.arrival_s.to_numpy())


def test_vidur_trim_and_poisson_draw():
    r = _sim_speed().vidur_requests(n=2_000, qps=4.0, max_tokens=1024)
    total = r.prompt_tokens + r.output_tokens
    assert total.max() <= 1024 and r.prompt_tokens.min() >= 1 and r.output_tokens.min() >= 1
    gaps = np.diff(np.concatenate([[0.0], r.arrival_s.to_numpy()]))
    assert gaps.min() > 0 and gaps.max() <= 3.0 / 4.0  # vidur caps an interval at 3 / qps
    assert 1 / gaps.mean() == pytest.approx(4.0, rel=0.1)
