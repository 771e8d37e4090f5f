"""Workload files -> Requests: sampling, traces, built-ins, examples and error messages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from infersim.simulator.errors import InfersimError, UnknownNameError
from infersim.simulator.paths import workloads_dir
from infersim.simulator.workload.builder import build_requests, list_workloads, load_requests, load_workload
from infersim.simulator.workload.distributions import sample_arrivals, sample_lengths, streams
from infersim.simulator.workload.requests import Requests
from infersim.simulator.workload.schema import WorkloadSpec
from infersim.simulator.yamlio import validate


def spec(**requests) -> WorkloadSpec:
    return validate(WorkloadSpec, {"requests": requests, "seed": requests.pop("seed", 0)}, "test")


def dist(**kw):
    return spec(
        count=1, arrival={"type": "burst"}, prompt_tokens=kw, output_tokens={"type": "fixed", "value": 1}
    ).requests.prompt_tokens


def synthetic(**over):
    base = dict(
        count=20_000,
        arrival={"type": "poisson", "rate": 10.0},
        prompt_tokens={"type": "lognormal", "mean": 300, "cv": 1.0},
        output_tokens={"type": "uniform", "low": 10, "high": 200},
    )
    base.update(over)
    return spec(**base)


def cv(x):
    return x.std() / x.mean()


# --- determinism and independent streams -------------------------------------------------


def test_same_seed_same_arrays_and_different_seed_differs():
    a, b, c = build_requests(synthetic()), build_requests(synthetic()), build_requests(synthetic(seed=1))
    for field in ("arrival_s", "prompt_tokens", "output_tokens"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
        assert not np.array_equal(getattr(a, field), getattr(c, field))


def test_changing_one_distribution_leaves_the_others_unchanged():
    a = build_requests(synthetic())
    b = build_requests(synthetic(output_tokens={"type": "lognormal", "mean": 50, "cv": 2.0}))
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert not np.array_equal(a.output_tokens, b.output_tokens)
    c = build_requests(synthetic(arrival={"type": "gamma", "rate": 10.0, "cv": 3.0}))
    assert np.array_equal(a.prompt_tokens, c.prompt_tokens) and np.array_equal(a.output_tokens, c.output_tokens)


# --- length distributions ----------------------------------------------------------------


@pytest.mark.parametrize("mean,c", [(300.0, 1.0), (1000.0, 0.5), (80.0, 2.0)])
def test_lognormal_mean_and_cv(mean, c):
    x = sample_lengths(dist(type="lognormal", mean=mean, cv=c), 400_000, streams(3)[1])
    assert x.dtype == np.int64 and x.min() >= 1
    assert x.mean() == pytest.approx(mean, rel=0.02)
    assert cv(x) == pytest.approx(c, rel=0.08)


def test_lognormal_clipped_to_min_max():
    x = sample_lengths(dist(type="lognormal", mean=100, cv=2.0, min=20, max=300), 100_000, streams(0)[1])
    assert x.min() == 20 and x.max() == 300


def test_fixed_and_uniform():
    rng = streams(0)[1]
    assert (sample_lengths(dist(type="fixed", value=7), 10, rng) == 7).all()
    x = sample_lengths(dist(type="uniform", low=5, high=9), 100_000, rng)
    assert x.min() == 5 and x.max() == 9 and x.mean() == pytest.approx(7, rel=0.01)


def test_quantile_distribution_reproduces_its_quantiles():
    values = [10, 20, 25, 40, 100, 400, 1000, 4000, 10000]
    x = sample_lengths(dist(type="quantiles", values=values), 400_000, streams(0)[1])
    probs = np.linspace(0, 1, len(values))
    assert x.min() == values[0] and x.max() == values[-1]
    # the empirical CDF at each given quantile is its probability (within noise and rounding)
    xs = np.sort(x)
    cdf = (np.searchsorted(xs, values, side="left") + np.searchsorted(xs, values, side="right")) / 2 / len(x)
    assert np.allclose(cdf[1:-1], probs[1:-1], atol=0.01)


def test_quantile_distribution_with_explicit_probs():
    probs, values = [0, 0.5, 0.9, 0.99, 1], [1, 100, 200, 1000, 5000]
    x = sample_lengths(dist(type="quantiles", values=values, probs=probs), 400_000, streams(0)[1])
    assert np.allclose(np.quantile(x, probs[1:-1]), values[1:-1], rtol=0.03)
    # mean of the piecewise-linear inverse CDF
    expect = sum((a + b) / 2 * (q - p) for p, q, a, b in zip(probs, probs[1:], values, values[1:]))
    assert x.mean() == pytest.approx(expect, rel=0.02)


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "quantiles", "values": [5, 3]},
        {"type": "quantiles", "values": [1, 2, 3], "probs": [0, 0.5]},
        {"type": "quantiles", "values": [1, 2, 3], "probs": [0, 0.7, 0.5]},
        {"type": "lognormal", "mean": 10, "min": 20, "max": 10},
        {"type": "uniform", "low": 9, "high": 3},
    ],
)
def test_bad_length_distributions_name_the_field(bad):
    with pytest.raises(InfersimError, match=r"test: field 'requests\.prompt_tokens"):
        dist(**bad)


def test_a_plain_number_is_a_fixed_length():
    s = spec(count=1, arrival={"type": "burst"}, prompt_tokens=512, output_tokens=64).requests
    assert (s.prompt_tokens.type, s.prompt_tokens.value, s.output_tokens.value) == ("fixed", 512, 64)
    with pytest.raises(
        InfersimError, match=r"field 'requests\.prompt_tokens\.fixed\.value': Input should be a valid int"
    ):
        spec(count=1, arrival={"type": "burst"}, prompt_tokens=8.5, output_tokens=1)


@pytest.mark.parametrize(
    ("field", "value", "kinds"),
    [
        ("arrival", {"rate": 2.0}, "poisson, gamma, closed_loop, burst"),
        ("output_tokens", {"mean": 3}, "fixed, uniform, lognormal, quantiles, empirical"),
    ],
)
def test_a_section_without_its_type_is_told_the_kinds(field, value, kinds):
    """pydantic's tagged union says only 'Unable to extract tag'; the error lists the kinds."""
    base = {"count": 1, "arrival": {"type": "burst"}, "prompt_tokens": 8, "output_tokens": 8, field: value}
    with pytest.raises(InfersimError) as e:
        spec(**base)
    assert str(e.value) == f"test: field 'requests.{field}': give its 'type': one of {kinds}"


def test_empirical_column_scaled_and_text_words(tmp_path):
    (tmp_path / "lens.csv").write_text("n,x\n" + "".join(f"{v},0\n" for v in (10, 20, 30)))
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": " ".join(["w"] * k)}) + "\n" for k in (10, 20)))
    rng = streams(0)[1]
    x = sample_lengths(dist(type="empirical", file="lens.csv", column="n", scale=2.0), 30_000, rng, tmp_path)
    assert set(np.unique(x)) == {20, 40, 60}
    w = sample_lengths(
        dist(type="empirical", file="p.jsonl", column="prompt", kind="text_words", scale=1.3), 1000, rng, tmp_path
    )
    assert set(np.unique(w)) == {13, 26}


# --- arrivals ----------------------------------------------------------------------------


def test_poisson_rate_and_cv():
    t = build_requests(synthetic(count=200_000, arrival={"type": "poisson", "rate": 5.0})).arrival_s
    gaps = np.diff(t)
    assert t[0] >= 0 and (gaps >= 0).all()
    assert 1 / gaps.mean() == pytest.approx(5.0, rel=0.01) and cv(gaps) == pytest.approx(1.0, rel=0.02)


@pytest.mark.parametrize("c", [0.5, 2.0, 4.0])
def test_gamma_rate_and_cv(c):
    t = build_requests(synthetic(count=400_000, arrival={"type": "gamma", "rate": 20.0, "cv": c})).arrival_s
    gaps = np.diff(t)
    assert 1 / gaps.mean() == pytest.approx(20.0, rel=0.03)
    assert cv(gaps) == pytest.approx(c, rel=0.05)


def test_burst_is_all_zero():
    r = build_requests(synthetic(count=50, arrival={"type": "burst"}))
    assert len(r) == 50 and (r.arrival_s == 0).all()


def test_duration_limits_open_loop():
    r = build_requests(synthetic(count=None, duration_s=500.0, arrival={"type": "poisson", "rate": 20.0}))
    assert r.duration_s == 500.0 and r.arrival_s[-1] <= 500.0
    assert len(r) == pytest.approx(10_000, rel=0.05)
    assert len(r.prompt_tokens) == len(r.output_tokens) == len(r)
    # count and duration: whichever ends first
    assert len(build_requests(synthetic(count=100, duration_s=500.0))) == 100
    short = build_requests(synthetic(count=100_000, duration_s=50.0, arrival={"type": "poisson", "rate": 20.0}))
    assert len(short) < 1500 and short.arrival_s[-1] <= 50.0


def test_duration_arrivals_are_a_prefix_of_count_arrivals():
    a = sample_arrivals(synthetic().requests.arrival, streams(4)[0], duration_s=100.0)
    b = sample_arrivals(synthetic().requests.arrival, streams(4)[0], count=len(a))
    assert 900 < len(a) < 1100 and a[-1] <= 100.0 and np.allclose(a, b[: len(a)], rtol=1e-12)


def test_closed_loop():
    r = build_requests(
        synthetic(count=300, duration_s=60.0, arrival={"type": "closed_loop", "clients": 8, "think_time_s": 0.5})
    )
    assert r.arrival_s is None and r.closed_loop and r.closed_loop_clients == 8
    assert r.think_time_s == 0.5 and r.duration_s == 60.0 and len(r) == 300


def test_closed_loop_and_burst_need_count():
    for arrival in ({"type": "closed_loop", "clients": 4}, {"type": "burst"}):
        with pytest.raises(InfersimError, match="need 'count'"):
            synthetic(count=None, duration_s=10.0, arrival=arrival)


def test_clipping():
    r = build_requests(synthetic(max_prompt_tokens=100, max_output_tokens=50))
    assert r.prompt_tokens.max() == 100 and r.output_tokens.max() == 50 and r.prompt_tokens.min() >= 1


def test_million_requests():
    """A million requests are drawn as arrays (vectorised), in order, within the quantiles."""
    s = synthetic(
        count=1_000_000,
        arrival={"type": "gamma", "rate": 100.0, "cv": 2.0},
        output_tokens={"type": "quantiles", "values": [1, 10, 100, 1000]},
    )
    r = build_requests(s)
    assert len(r) == 1_000_000
    assert (np.diff(r.arrival_s) >= 0).all() and 1 <= r.output_tokens.min() and r.output_tokens.max() <= 1000


def test_requests_checks_its_arrays():
    with pytest.raises(ValueError):
        Requests(np.array([1, 2]), np.array([1, 1]), np.array([2.0, 1.0]))
    with pytest.raises(ValueError):
        Requests(np.array([0]), np.array([1]), np.array([0.0]))
    with pytest.raises(ValueError):
        Requests(np.array([1]), np.array([1]), None)  # closed loop without clients


# --- traces ------------------------------------------------------------------------------


def write_workload(folder: Path, body: str) -> Path:
    p = folder / "w.yaml"
    p.write_text(body)
    return p


def test_csv_trace_ms_shift_scale_start_row_count(tmp_path):
    (tmp_path / "t.csv").write_text("ts,p,o,extra\n1000,5,6,x\n1500,7,8,y\n3000,9,10,z\n4000,11,12,w\n")
    w = write_workload(
        tmp_path,
        """
requests:
  count: 2
  trace: {file: t.csv, arrival_column: ts, time_unit: ms, prompt_column: p, output_column: o,
          start_row: 1, time_scale: 2.0}
""",
    )
    _, r = load_requests(str(w))
    assert r.arrival_s.tolist() == [0.0, 3.0]
    assert r.prompt_tokens.tolist() == [7, 9] and r.output_tokens.tolist() == [8, 10]


def test_datetime_trace_with_seven_fractional_digits_and_unsorted_rows(tmp_path):
    (tmp_path / "t.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:04.0319600,3,4\n2023-11-16 18:17:03.9799600,1,2\n2023-11-16 18:18:03.9799601,5,6\n"
    )
    w = write_workload(
        tmp_path,
        """
requests:
  trace: {file: t.csv, arrival_column: TIMESTAMP, time_unit: datetime,
          prompt_column: ContextTokens, output_column: GeneratedTokens}
""",
    )
    _, r = load_requests(str(w))
    assert r.arrival_s == pytest.approx([0.0, 0.052, 60.0000001], abs=1e-9)
    assert r.prompt_tokens.tolist() == [1, 3, 5] and r.output_tokens.tolist() == [2, 4, 6]


def test_trace_rows_are_counted_without_parsing_the_file(tmp_path):
    import gzip

    from infersim.simulator.workload.schema import TraceSource
    from infersim.simulator.workload.traces import trace_rows

    src = TraceSource(file="t", arrival_column="ts", prompt_column="p", output_column="o")
    body = "ts,p,o\n" + "".join(f"{i},5,6\n" for i in range(5))
    (tmp_path / "t.csv").write_text(body.rstrip("\n"))  # the last row without its newline
    (tmp_path / "t.csv.gz").write_bytes(gzip.compress(body.encode()))
    (tmp_path / "t.jsonl").write_text('{"ts": 0, "p": 5, "o": 6}\n' * 4)
    (tmp_path / "t.json").write_text("[]")
    assert trace_rows(src, tmp_path / "t.csv") == trace_rows(src, tmp_path / "t.csv.gz") == 5
    assert trace_rows(src.model_copy(update={"start_row": 2}), tmp_path / "t.csv") == 3
    assert trace_rows(src, tmp_path / "t.jsonl") == 4
    assert trace_rows(src, tmp_path / "t.json") is None and trace_rows(src, tmp_path / "none.csv") is None


def test_jsonl_and_json_traces(tmp_path):
    rows = [{"t": i * 0.5, "in": 10 + i, "out": 3, "hash_ids": [1, 2]} for i in range(6)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "t.json").write_text(json.dumps(rows))
    for name in ("t.jsonl", "t.json"):
        w = write_workload(
            tmp_path,
            f"""
requests:
  duration_s: 1.0
  trace: {{file: {name}, arrival_column: t, prompt_column: in, output_column: out}}
""",
        )
        _, r = load_requests(str(w))
        assert r.arrival_s.tolist() == [0.0, 0.5, 1.0] and r.prompt_tokens.tolist() == [10, 11, 12]


def test_trace_lengths_with_poisson_arrivals_and_trace_times_with_sampled_lengths(tmp_path):
    (tmp_path / "t.csv").write_text("p,o,ts\n" + "".join(f"{i + 1},{i + 2},{i * 0.1}\n" for i in range(1000)))
    w = write_workload(
        tmp_path,
        """
requests:
  arrival: {type: poisson, rate: 50}
  trace: {file: t.csv, prompt_column: p, output_column: o}
""",
    )
    _, r = load_requests(str(w))
    assert len(r) == 1000 and r.prompt_tokens[:3].tolist() == [1, 2, 3]
    assert 1 / np.diff(r.arrival_s).mean() == pytest.approx(50, rel=0.1)
    w = write_workload(
        tmp_path,
        """
requests:
  count: 100
  max_output_tokens: 40
  output_tokens: {type: lognormal, mean: 30, cv: 1.0}
  trace: {file: t.csv, arrival_column: ts, prompt_column: p}
""",
    )
    _, r = load_requests(str(w))
    assert len(r) == 100 and r.arrival_s[-1] == pytest.approx(9.9) and r.output_tokens.max() <= 40


def test_trace_text_words_prompt(tmp_path):
    (tmp_path / "g.json").write_text(json.dumps([{"prompt": "a b c d e f g h i j"}, {"prompt": "one two"}]))
    w = write_workload(
        tmp_path,
        """
requests:
  arrival: {type: burst}
  output_tokens: {type: fixed, value: 5}
  trace: {file: g.json, prompt_column: prompt, prompt_column_kind: text_words}
""",
    )
    _, r = load_requests(str(w))
    assert r.prompt_tokens.tolist() == [13, 3]


# --- bad inputs --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body,pattern",
    [
        ("requests: [\n", r"w\.yaml: malformed YAML at line"),
        (
            "requests:\n  count: 2\n  arrival: {type: poisson, rate: -1}\n  prompt_tokens: {type: fixed, value: 3}\n"
            "  output_tokens: {type: fixed, value: 3}\n",
            r"w\.yaml: field 'requests\.arrival\.poisson\.rate'",
        ),
        (
            "requests:\n  count: 2\n  arrival: {type: poisson, rate: 1}\n  prompt_tokens: {type: fixed, value: 3}\n",
            r"w\.yaml: .*output_tokens",
        ),
        (
            "requests:\n  count: 2\n  arrival: {type: poisson, rate: 1}\n"
            "  trace: {file: t.csv, prompt_column: p, output_column: nope}\n",
            r"t\.csv: column 'nope' not found; columns: p, o$",
        ),
        (
            "requests:\n  arrival: {type: poisson, rate: 1}\n  trace: {file: bad.csv, prompt_column: p, output_column: o}\n",
            r"bad\.csv: column 'o', row 3: not a number: 'x'",
        ),
        (
            "requests:\n  arrival: {type: poisson, rate: 1}\n  trace: {file: neg.csv, prompt_column: p, output_column: o}\n",
            r"neg\.csv: column 'p', row 2: negative value -4",
        ),
        (
            "requests:\n  trace: {file: dt.csv, arrival_column: t, prompt_column: p, output_column: o}\n",
            r"dt\.csv: column 't', row 1: not a number: '2023-11-16 18:17:04'; the column holds datetimes: "
            r"set time_unit: datetime$",
        ),
        (
            "requests:\n  arrival: {type: poisson, rate: 1}\n  trace: {file: blank.csv, prompt_column: p, output_column: o}\n",
            r"blank\.csv: column 'o', row 2: an empty cell or NaN$",
        ),
        (
            "requests:\n  arrival: {type: poisson, rate: 1}\n  trace: {file: inf.csv, prompt_column: p, output_column: o}\n",
            r"inf\.csv: column 'p', row 1: not a finite number: inf$",
        ),
        (
            "requests:\n  count: 9\n  arrival: {type: poisson, rate: 1}\n"
            "  trace: {file: t.csv, prompt_column: p, output_column: o}\n",
            r"t\.csv: requests\.count 9 exceeds the 2 rows",
        ),
        (
            "requests:\n  arrival: {type: poisson, rate: 1}\n  trace: {file: gone.csv, prompt_column: p, output_column: o}\n",
            r"gone\.csv: file not found",
        ),
        (
            "requests:\n  arrival: {type: poisson, rate: 1}\n"
            "  trace: {file: t.csv, arrival_column: p, prompt_column: p, output_column: o}\n",
            r"w\.yaml: .*not both",
        ),
        (
            "requests:\n  count: 1\n  trace: {file: t.csv, arrival_column: p, prompt_column: p, output_column: o, "
            "time_unit: days}\n",
            r"w\.yaml: field 'requests\.trace\.time_unit'",
        ),
    ],
)
def test_bad_inputs_are_one_line_errors_naming_file_and_field(tmp_path, body, pattern):
    (tmp_path / "t.csv").write_text("p,o\n1,2\n3,4\n")
    (tmp_path / "bad.csv").write_text("p,o\n1,2\n3,4\n5,x\n")
    (tmp_path / "neg.csv").write_text("p,o\n1,2\n-4,4\n")
    (tmp_path / "blank.csv").write_text("p,o\n1,2\n3,\n")
    (tmp_path / "dt.csv").write_text("t,p,o\n2023-11-16 18:17:04,1,2\n")
    (tmp_path / "inf.csv").write_text("p,o\ninf,2\n")
    w = write_workload(tmp_path, body)
    with pytest.raises(InfersimError, match=pattern) as info:
        load_requests(str(w))
    assert "\n" not in str(info.value)


def test_model_and_profile_files_beside_the_workload_are_found_from_another_folder(tmp_path, monkeypatch):
    """`hardware.profile: card.yaml` and `model: ckpt/config.json` next to the workload file work
    from any folder; a file of that name in the current folder still wins, and names stay names."""
    sub = tmp_path / "exp"
    (sub / "ckpt").mkdir(parents=True)
    (sub / "card.yaml").write_text("name: card\n")
    (sub / "ckpt" / "config.json").write_text("{}")
    body = "model: {model}\nhardware: {{profile: {profile}}}\nrequests:\n  count: 1\n  arrival: {{type: burst}}\n"
    body += "  prompt_tokens: {{type: fixed, value: 3}}\n  output_tokens: {{type: fixed, value: 3}}\n"
    (sub / "w.yaml").write_text(body.format(model="ckpt/config.json", profile="card.yaml:datasheet"))
    (sub / "n.yaml").write_text(body.format(model="llama-3-8b", profile="h100-sxm"))
    monkeypatch.chdir(tmp_path)
    spec, _ = load_workload("exp/w.yaml")
    assert (spec.model, spec.hardware.profile) == ("exp/ckpt/config.json", "exp/card.yaml:datasheet")
    assert load_workload("exp/n.yaml")[0].hardware.profile == "h100-sxm"
    (tmp_path / "card.yaml").write_text("name: mine\n")
    assert load_workload("exp/w.yaml")[0].hardware.profile == "card.yaml:datasheet"


def test_unknown_workload_name_lists_known_names():
    with pytest.raises(UnknownNameError, match=r"unknown workload 'no-such-workload'; known: .*chatbot"):
        load_workload("no-such-workload")
    with pytest.raises(InfersimError, match="file not found"):
        load_workload("some/dir/missing.yaml")


# --- built-in workloads ------------------------------------------------------------------

BUILTINS = ["chatbot", "alpaca", "summary", "finance", "dialogue", "long-context", "code", "conversation"]


def test_builtins_are_listed():
    assert set(BUILTINS) <= set(list_workloads())


@pytest.mark.parametrize("name", sorted(p.stem for p in workloads_dir().glob("*.yaml")))
def test_every_builtin_loads_and_builds(name):
    s, path = load_workload(name)
    assert s.name == name and s.description and s.source
    r = build_requests(s, path)
    assert len(r) > 0 and r.prompt_tokens.min() >= 1 and r.output_tokens.min() >= 1
    assert load_workload(name + ".yaml")[1] == path


@pytest.mark.parametrize("name,mean", [("chatbot", 17.02), ("alpaca", 19.66), ("summary", 340.48)])
def test_adaptivellm_prompt_means(name, mean):
    s, path = load_workload(name)
    assert (s.model, s.hardware.profile) == ("opt-13b", "a800-80gb-pcie")
    assert (s.serving.gpu_blocks, s.serving.cpu_blocks, s.serving.block_size) == (128, 64, 16)
    assert s.requests.count == 1000 and s.requests.max_output_tokens == 64
    many = s.model_copy(update={"requests": s.requests.model_copy(update={"count": 200_000})})
    r = build_requests(many, path)
    assert r.prompt_tokens.mean() == pytest.approx(mean, rel=0.05)
    assert r.output_tokens.max() <= 64 and (r.arrival_s == 0).all()


def test_long_context_is_fixed():
    _, r = load_requests("long-context")
    assert (r.prompt_tokens == 1920).all() and (r.output_tokens == 128).all()


@pytest.mark.parametrize(
    "name,rate,prompt_p50,output_p50", [("code", 2.567, 1469, 13), ("conversation", 5.530, 1020, 129)]
)
def test_azure_shaped_builtins(name, rate, prompt_p50, output_p50):
    s, path = load_workload(name)
    many = s.model_copy(
        update={
            "requests": s.requests.model_copy(
                update={"duration_s": 40_000.0, "max_prompt_tokens": None, "max_output_tokens": None}
            )
        }
    )
    r = build_requests(many, path)
    assert len(r) / r.arrival_s[-1] == pytest.approx(rate, rel=0.03)
    assert np.median(r.prompt_tokens) == pytest.approx(prompt_p50, rel=0.05)
    assert np.median(r.output_tokens) == pytest.approx(output_p50, rel=0.1)
