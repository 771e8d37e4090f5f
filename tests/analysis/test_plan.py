"""`sim plan`: goodput search, replicas for a target, cost, the report (in a real browser)."""

import json
import math
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from infersim.analysis.plan import (
    PlanFile,
    PlanFlags,
    SearchSection,
    build_candidates,
    load_plan_file,
    meets,
    parse_duration,
    parse_prices,
    parse_slo,
    plan,
    probe_once,
    rank,
    verdict,
    write_plan,
)
from infersim.analysis.sweep_backends import BackendOptions
from infersim.cli.main import main
from infersim.simulator.errors import InfersimError
from tests.utils import chromium

WORKLOAD = """\
name: plan-test
model: llama-2-7b
hardware: {profile: a100-80gb-pcie}
requests:
  count: 300
  arrival: {type: poisson, rate: 5.0}
  prompt_tokens: {type: lognormal, mean: 400, cv: 0.8, max: 2000}
  output_tokens: {type: lognormal, mean: 120, cv: 0.8, max: 600}
seed: 4
"""
SLO = "ttft_p99=1s,tpot_p99=60ms"
N = 300  # requests per probe: small, the tests check the logic, not the numbers
TOL = 0.1
TARGET = 25.0
PRICES = {"a100-80gb-pcie": 1.8, "h100": 3.5}  # an alias on purpose: prices match canonical names


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    p = tmp_path_factory.mktemp("wl") / "plan-test.yaml"
    p.write_text(WORKLOAD)
    return str(p)


@pytest.fixture(scope="module")
def result(workload):
    pf = PlanFile(search=SearchSection(requests=N, tolerance=TOL))
    return plan(
        workload,
        slos=parse_slo(SLO),
        plan_file=pf,
        flags=PlanFlags(hardware=["a100-80gb-pcie", "h100-sxm"], prices=PRICES, target_rate=TARGET),
        run=BackendOptions(workers=2),
    )


@pytest.fixture(scope="module")
def report_dir(result, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "report"
    write_plan(result, out)
    return out


def test_parse_slo_and_durations():
    slos = parse_slo("ttft_p99=2s, tpot_p99=100ms,e2e_mean=1500ms,itl_p90=250us")
    assert [(s.metric, s.limit_s) for s in slos] == [
        ("ttft_s.p99", 2.0),
        ("tpot_s.p99", 0.1),
        ("e2e_s.mean", 1.5),
        ("itl_s.p90", pytest.approx(250e-6)),
    ]
    assert parse_slo({"ttft_p50": 0.5})[0].limit_s == 0.5
    assert parse_duration("1.5") == 1.5 and parse_duration("2min") == 120
    for bad in ("ttft=2s", "latency_p99=1s", "ttft_p99", "ttft_p99=fast", "ttft_p99=-1s", "ttft_p99=0"):
        with pytest.raises(InfersimError):
            parse_slo(bad)
    assert parse_prices("a100-80gb-pcie=1.8, h100-sxm=4") == {"a100-80gb-pcie": 1.8, "h100-sxm": 4.0}
    for bad in ("h100", "h100=cheap", "h100=-1"):
        with pytest.raises(InfersimError):
            parse_prices(bad)


def test_plan_file_prices_reach_datasheet_candidates(tmp_path):
    """NAME:datasheet is the same GPU as NAME priced by the pure roofline: the plan file's price for
    NAME (or an alias of it) applies to both; a price given for NAME:datasheet itself wins there."""
    pf_path = tmp_path / "plan.yaml"
    pf_path.write_text("prices: {h100: 4.0, a100-80gb-sxm: 2.0, a100-80gb-sxm:datasheet: 1.5}\n")
    pf = load_plan_file(pf_path)
    hardware = {"profile": "h100-sxm", "tensor_parallel": 1, "pipeline_parallel": 1}
    spec = SimpleNamespace(hardware=SimpleNamespace(**hardware, data_parallel_attention=False, two_batch_overlap=False))
    names = ["h100-sxm", "h100-sxm:datasheet", "a100-80gb-sxm", "a100-80gb-sxm:datasheet", "a40:datasheet"]
    cands = build_candidates(spec, names, [1], {}, pf.prices)
    assert {c.label: c.price for c in cands} == {
        "h100-sxm": 4.0,
        "h100-sxm:datasheet": 4.0,
        "a100-80gb-sxm": 2.0,
        "a100-80gb-sxm:datasheet": 1.5,
        "a40:datasheet": None,
    }


def test_meets_checks_every_slo():
    slos = parse_slo("ttft_p99=1s,tpot_p99=50ms")
    s = {"finished": 10, "ttft_s": {"p99": 0.9}, "tpot_s": {"p99": 0.05}}
    assert meets(s, slos)
    assert not meets({**s, "tpot_s": {"p99": 0.051}}, slos)
    assert not meets({**s, "ttft_s": {"p99": None}}, slos)  # no finished request has a TTFT: not met
    assert not meets({**s, "finished": 0}, slos)


def test_goodput_is_within_slo_and_a_slightly_higher_rate_is_not(result, workload):
    slos = parse_slo(SLO)
    assert [c.status for c in result.candidates] == ["ok", "ok"]
    for c in result.candidates:
        assert 0 < c.goodput_rps < c.fail_rate_rps <= c.goodput_rps * (1 + TOL) * (1 + 1e-9)
        # independently of the search: simulate both rates again, as many requests as it did
        n_at = _probe(c, c.goodput_rps).requests
        n_above = _probe(c, c.fail_rate_rps).requests
        # at least N requests, and at least 30 s of arrivals (the floor of 1.25 x 1 s / 0.1)
        assert n_at == max(N, math.ceil(c.goodput_rps * 30))
        at = probe_once(workload, c.overrides, c.goodput_rps, n_at, result.seed)
        above = probe_once(workload, c.overrides, c.fail_rate_rps, n_above, result.seed)
        assert meets(at, slos), c.label
        assert not meets(above, slos), c.label
        assert at["requests"] == n_at
    a100, h100 = result.candidates
    assert h100.goodput_rps > a100.goodput_rps  # more bandwidth and FLOPs, same model


def _probe(c, rate, kind="search"):
    return next(p for p in c.probes if p.rate == rate and p.kind == kind)


def test_replicas_gpus_and_cost_by_hand(result, workload):
    slos = parse_slo(SLO)
    for c in result.candidates:
        assert c.replicas_initial == math.ceil(TARGET / c.goodput_rps)
        assert c.verified and c.replicas >= c.replicas_initial
        assert c.gpus == c.replicas * c.tensor_parallel
        verify = [p for p in c.probes if p.kind == "verify"]
        assert verify[-1].replicas == c.replicas and verify[-1].ok
        assert all(not p.ok for p in verify[:-1])  # stepped up only past failures
        assert verify[-1].requests == max(N * c.replicas, math.ceil(TARGET * 30))
        again = probe_once(workload, c.overrides, TARGET, verify[-1].requests, result.seed, replicas=c.replicas)
        assert meets(again, slos)
        # cost: price x GPUs / output tokens per hour at the target, mean output from the first probe
        first = c.probes[0]
        s = probe_once(workload, c.overrides, first.rate, first.requests, result.seed)
        mean_out = s["throughput_output_tokens_per_s"] * s["makespan_s"] / s["finished"]
        price = 1.8 if c.hardware == "a100-80gb-pcie" else 3.5
        assert c.price_per_gpu_hour == price
        assert c.cost_per_m_output_tokens == pytest.approx(price * c.gpus * 1e6 / (3600 * TARGET * mean_out))
        assert c.cost_per_m_output_tokens_at_goodput == pytest.approx(price * 1e6 / (3600 * c.goodput_rps * mean_out))
        assert c.cost_per_m_output_tokens >= c.cost_per_m_output_tokens_at_goodput * (1 - 1e-9)
    best = rank(result.candidates)[0]
    assert best.cost_per_m_output_tokens == min(c.cost_per_m_output_tokens for c in result.candidates)
    assert best.label in verdict(result)[0] and f"{best.gpus} GPU" in verdict(result)[0]


def test_unreachable_slo_is_infeasible(workload):
    res = plan(
        workload,
        slos=parse_slo("tpot_p99=1ms"),
        flags=PlanFlags(hardware=["a100-80gb-pcie"], target_rate=5.0),
        plan_file=PlanFile(search=SearchSection(requests=60, min_rate=0.5)),
        run=BackendOptions(workers=1),
    )
    c = res.candidates[0]
    assert c.status == "infeasible" and c.goodput_rps == 0 and c.replicas is None
    assert all(not p.ok for p in c.probes) and min(p.rate for p in c.probes) < 1.0
    assert verdict(res)[0].startswith("No configuration meets")


def test_cli_plan_with_no_answer_exits_3_and_says_why(workload, tmp_path, capsys):
    """Every configuration infeasible: the report is written, and the status (3, as `sim sweep`
    when every configuration failed) and one stderr line under -q say there is no answer."""
    out = tmp_path / "p"
    argv = ["plan", "-w", workload, "--slo", "tpot_p99=1ms", "--hardware", "a100-80gb-pcie", "--target-rate", "5"]
    argv += ["--requests", "60", "-o", str(out), "-q", "--workers", "1", "--no-plots"]
    assert main(argv) == 3
    err = capsys.readouterr().err.strip()
    assert err == "No configuration meets TPOT p99 ≤ 1 ms at 5 req/s.", err
    assert json.loads((out / "plan.json").read_text())["candidates"][0]["status"] == "infeasible"


def test_report_files_and_relative_images(report_dir):
    html = (report_dir / "report.html").read_text()
    md = (report_dir / "report.md").read_text()
    for name in ("latency_vs_load", "goodput", "replicas", "cost"):
        assert (report_dir / "plots" / f"{name}.png").stat().st_size > 5000
        assert f'src="plots/{name}.png"' in html and f"](plots/{name}.png)" in md
    assert "Verdict" in html and "**Verdict**" in md
    data = json.loads((report_dir / "plan.json").read_text())
    assert len(data["candidates"]) == 2
    import pandas as pd

    probes = pd.read_csv(report_dir / "probes.csv")
    assert set(probes["kind"]) == {"search", "curve", "verify"}


def test_cli_plan_file_and_flags(workload, tmp_path, capsys):
    pf = tmp_path / "plan.yaml"
    pf.write_text(
        "slo: {ttft_p99: 1s}\nhardware: [h100-sxm]\ntarget_rate: 10\nprices: {h100-sxm: 2.0}\n"
        "search: {requests: 80, tolerance: 0.3, min_duration_s: 5}\n"
    )
    out = tmp_path / "p"
    assert (
        main(
            [
                "plan",
                "-w",
                workload,
                "--plan",
                str(pf),
                "--target-rate",
                "20",
                "--price",
                "h100-sxm=4",
                "--option",
                "serving.preemption=recompute,swap",
                "-o",
                str(out),
                "-q",
                "--workers",
                "1",
                "--no-plots",
            ]
        )
        == 0
    )
    data = json.loads((out / "plan.json").read_text())
    assert data["target_rate"] == 20  # the flag wins over the file
    assert data["search"]["requests"] == 80
    assert all(
        p["requests"] == max(80 * p["replicas"], math.ceil(p["rate"] * 5))
        for c in data["candidates"]
        for p in c["probes"]
    )
    assert [c["label"] for c in data["candidates"]] == ["h100-sxm preemption=recompute", "h100-sxm preemption=swap"]
    assert all(c["price_per_gpu_hour"] == 4.0 for c in data["candidates"])
    assert (out / "report.html").exists() and not (out / "plots").exists()


def test_cli_bad_input_is_one_line(workload, tmp_path, capsys):
    def err():
        e = capsys.readouterr().err.strip()
        assert "Traceback" not in e and len(e.splitlines()) == 1, e
        return e

    assert main(["plan", "-w", workload, "--slo", "ttft_p99=soon", "-o", str(tmp_path / "x"), "-q"]) == 2
    assert "ttft_p99" in err()
    assert main(["plan", "-w", workload, "-o", str(tmp_path / "x"), "-q"]) == 2
    assert "SLO" in err()
    assert (
        main(["plan", "-w", workload, "--slo", "ttft_p99=1s", "--hardware", "tpu-v9", "-o", str(tmp_path / "x"), "-q"])
        == 2
    )
    assert "tpu-v9" in err()
    bad = tmp_path / "bad.yaml"
    bad.write_text("slo: {ttft_p99: 1s}\nbudget: 3\n")
    assert main(["plan", "-w", workload, "--plan", str(bad), "-o", str(tmp_path / "x"), "-q"]) == 2
    assert "budget" in err()
    assert not (tmp_path / "x").exists()
    assert isinstance(load_plan_file(None), PlanFile)


# ---------------------------------------------------------------------------------------------
# the HTML in a real headless browser

CHROME_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]


def _check_in_browser(html_path: Path, profile: Path) -> dict:
    """Load the page; return images (count), broken (list), errors (page errors and SEVERE
    console entries). Selenium with chromedriver when available (it reads the browser's
    console log), otherwise chromium --dump-dom (the page records its own errors in the DOM)."""
    chrome = chromium()
    driver_path = shutil.which("chromedriver")
    drv = None
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        webdriver = None
    if webdriver is not None and driver_path:
        opts = webdriver.ChromeOptions()
        opts.binary_location = chrome
        for f in CHROME_FLAGS + [f"--user-data-dir={profile}", "--window-size=1200,900"]:
            opts.add_argument(f)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        try:
            drv = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
        except Exception:  # a driver that does not match the browser: use the DOM check below
            drv = None
    if webdriver is not None and driver_path and drv is not None:
        try:
            drv.set_page_load_timeout(30)
            drv.get(html_path.resolve().as_uri())
            from selenium.webdriver.support.ui import WebDriverWait

            WebDriverWait(drv, 20).until(
                lambda d: d.execute_script("return document.body.getAttribute('data-render-check')") == "done"
            )
            info = drv.execute_script("""
                var imgs = Array.from(document.images);
                return {images: imgs.length,
                        broken: imgs.filter(function (i) { return !i.complete || i.naturalWidth === 0; })
                                    .map(function (i) { return i.getAttribute('src'); }),
                        recorded: document.body.getAttribute('data-errors'),
                        title: document.title, height: document.body.scrollHeight};""")
            logs = drv.get_log("browser")
        finally:
            drv.quit()
        errors = [e["message"] for e in logs if e.get("level") == "SEVERE"]
        if info["recorded"]:
            errors.append(info["recorded"])
        return {
            "images": info["images"],
            "broken": info["broken"],
            "errors": errors,
            "title": info["title"],
            "height": info["height"],
            "via": "selenium",
        }
    out = subprocess.run(
        [
            chrome,
            *CHROME_FLAGS,
            f"--user-data-dir={profile}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            html_path.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    import re

    body = re.search(r"<body([^>]*)>", out.stdout)
    assert body, out.stderr[-2000:]
    attrs = dict(re.findall(r'(data-[a-z-]+)="([^"]*)"', body.group(1)))
    assert attrs.get("data-render-check") == "done", attrs
    title = re.search(r"<title>(.*?)</title>", out.stdout)
    return {
        "images": int(attrs["data-images"]),
        "broken": attrs["data-broken-images"].split(),
        "errors": [e for e in attrs["data-errors"].split(" | ") if e],
        "title": title.group(1) if title else "",
        "height": None,
        "via": "dump-dom",
    }


@pytest.mark.browser
def test_report_renders_in_headless_browser(report_dir, tmp_path):
    info = _check_in_browser(report_dir / "report.html", tmp_path / "profile")
    assert info["title"] == "Capacity plan: plan-test"
    assert info["images"] == 4, info
    assert info["broken"] == [] and info["errors"] == [], info
    if info["height"] is not None:
        assert info["height"] > 1500  # the plots took their size: they really rendered

    # the check can fail: a missing image is caught
    broken = tmp_path / "broken"
    shutil.copytree(report_dir, broken)
    (broken / "plots" / "cost.png").unlink()
    info = _check_in_browser(broken / "report.html", tmp_path / "profile2")
    assert info["broken"] == ["plots/cost.png"], info
    assert info["errors"], info
