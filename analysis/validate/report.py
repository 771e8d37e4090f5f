"""The validation report of one case (Markdown + HTML, with plots) and the matrix table."""

from __future__ import annotations

import math
from pathlib import Path

from infersim.analysis.report_html import Image, Report, Table

from . import plots
from .execute import repeats_note
from .rule import RULE


def pct(x, signed: bool = True) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def ms(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x * 1e3:.3f}"


def num(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if not math.isfinite(x):
            return "-"
        return f"{x:,.4g}" if abs(x) < 1e4 else f"{x:,.0f}"
    return f"{x:,}"


def checks_table(checks: list[dict]) -> Table:
    rows = []
    bad = set()
    for i, c in enumerate(checks):
        rows.append(
            [
                c["metric"],
                pct(c["value"], signed=c["metric"].endswith("MAPE") is False),
                f"≤ {c['target']:.0%}",
                "pass" if c["ok"] else "MISS",
                c["component"] or "",
            ]
        )
        if not c["ok"]:
            bad.add(i)
    return Table(["metric", "error", "target", "", "where a miss comes from"], rows, highlight=bad, numeric={1, 2})


def report_head(result: dict, cmp, folder: Path) -> "Report":
    """A case report with its title and verdict line (and folder/plots made)."""
    (Path(folder) / "plots").mkdir(parents=True, exist_ok=True)
    r = Report(f"Validation: {result['case']}", result.get("title", ""))
    checks = (result.get("judged") or {}).get("checks", cmp.checks)  # the pass rule's verdict (rule.py)
    verdict = (
        "all targets met under the rule"
        if all(c["ok"] for c in checks)
        else f"{sum(not c['ok'] for c in checks)} of {len(checks)} targets missed under the rule"
    )
    r.verdict = [
        f"**{verdict}** — {result['model']} on {result['device']} ({result['threads']} torch thread(s)), "
        f"{cmp.requests['requests']} requests; cost model: {result['cost_model']['description']}."
    ]

    if result.get("repeats"):
        r.verdict.append(f"The validated requests were {repeats_note(result['repeats'])}.")
    if result.get("judged"):
        judged = "; ".join(
            f"{c['metric']} {pct(c['value'], not c['metric'].endswith('MAPE'))} on {c['judged_on']}"
            for c in checks
            if c.get("judged_on") not in (None, "one run")
        )
        r.verdict.append(f"The rule: {RULE}. Judged: {judged}. The table below gives the run of median busy time.")
    return r


def within_run_text(cm: dict) -> str:
    """What the run's speed ticks say about its per-iteration errors ('' without ticks)."""
    w = cm.get("within_run") or {}
    if not w:
        return ""
    return (
        f"The machine's speed inside the run (its speed ticks around each iteration, p10-p90 "
        f"{w['tick_range'][0]:.2f}-{w['tick_range'][1]:.2f}x their median): correlation with measured/predicted "
        f"{w['correlation']:.2f} (log), MAPE at that local speed {pct(w['mape_at_local_speed'], False)}. A high "
        f"correlation says the per-iteration errors are the machine's speed moving, not the cost model."
    )


def case_report(result: dict, exec_run, sim_run, cmp, folder: Path) -> tuple[Path, Path]:
    """Write report.md / report.html (and plots/) for one validated case into folder."""
    folder = Path(folder)
    r = report_head(result, cmp, folder)
    r.h2("Targets")
    r.add(checks_table(cmp.checks))
    _per_iteration_section(r, cmp, folder)
    _latency_section(r, cmp, folder)
    _totals_section(r, result, cmp)
    # closes the totals' section: KV use over time is its memory
    timelines_plot(r, exec_run, sim_run, folder, _TIMELINES_CAPTION)
    r.h2("Method")
    r.bullets(_method_bullets(result))
    return r.write(folder)


def _per_iteration_section(r: Report, cmp, folder: Path) -> None:
    """The cost model on the executed batches, the schedules side by side, the replay, the scatter plot."""
    r.h2("Per iteration")
    r.p(_cost_model_text(cmp.cost_model))
    within = within_run_text(cmp.cost_model)
    if within:
        r.p(within)
    r.p(_schedule_text(cmp.iterations))
    if cmp.replay:
        r.p(_replay_text(cmp.replay))
    r.add(
        Image(
            "plots/iterations.png",
            "predicted vs measured per iteration",
            "Each point: one executed iteration, its measured engine time against the cost model's on the same "
            "batch; colour: sequences in the batch.",
        )
    )
    plots.scatter_iterations(cmp, folder / "plots" / "iterations.png")


def _cost_model_text(cm: dict) -> str:
    """The cost model's errors on the executor's exact batches, and the run's timing noise."""
    return (
        f"The cost model on the executor's exact batches ({cm['compared']} of {cm['iterations']} iterations with a "
        f"measured engine time; the others idled before the next one or were the last): MAPE {pct(cm['mape'], False)}, "
        f"signed bias {pct(cm['bias'])}, median error {pct(cm['median_ape'], False)}, total-time bias "
        f"{pct(cm['total_bias'])}; decode-only batches {pct(cm['decode_mape'], False)}, batches with prefills "
        f"{pct(cm['mixed_mape'], False)}. Timing noise: {pct(cm['noise']['stalls'], False)} of iterations stalled (took "
        f"at least twice the time of like iterations around them: the process lost its core), iteration-to-iteration "
        f"jitter of like decode steps {pct(cm['noise']['jitter'], False)}; MAPE without the stalls {pct(cm['mape_unstalled'], False)}."
    )


def _schedule_text(it: dict) -> str:
    """How many iterations the simulation ran the executor's batch at the same index."""
    return (
        f"The simulation ran {it['simulated']} iterations against {it['executed']} executed; "
        f"{it['aligned']} ({pct(it['aligned_fraction'], False)}) ran the same batch at the same index (first "
        f"divergence at iteration {it['first_divergence']}); on those, MAPE {pct(it['mape_aligned'], False)}, bias "
        f"{pct(it['bias_aligned'])}."
    )


def _replay_text(rp: dict) -> str:
    """The simulation driven by the measured times: the error left to scheduling alone."""
    return (
        f"**Scheduling alone** (the same simulation driven by the executor's own measured iteration and copy "
        f"times, `replay/`): {pct(rp['aligned_fraction'], False)} of its {rp['simulated']} iterations ran the "
        f"executor's batch; mean end-to-end {pct(rp['e2e_s']['mean_error'])}, p99 {pct(rp['e2e_s']['p99_error'])}, "
        f"TTFT p99 {pct(rp['ttft_s']['p99_error'])}, TPOT p99 {pct(rp['tpot_s']['p99_error'])}, throughput "
        f"{pct(rp['throughput_error'])}. What is left here is the simulator's scheduling, not its cost model."
    )


# (column in the comparison's requests, its label) per row of the latency table
_LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "end-to-end"))
_QUANTILES = ("mean", "p50", "p99")


def _latency_section(r: Report, cmp, folder: Path) -> None:
    """Measured against simulated latencies, as a table and as CDFs."""
    r.h2("Latency")
    columns = ["latency (ms)"]
    for q in _QUANTILES:
        columns += [f"{q} meas.", f"{q} sim.", "err"]
    r.add(
        Table(
            columns + ["per-request MAPE", "bias"],
            [_latency_row(label, cmp.requests[col]) for col, label in _LATENCIES],
            numeric=set(range(1, 12)),
            caption="Requests aligned by id; per-request MAPE and bias over the same requests.",
        )
    )
    r.add(Image("plots/latency_cdfs.png", "latency CDFs", "Measured and simulated latency distributions."))
    plots.latency_cdfs(cmp, folder / "plots" / "latency_cdfs.png")


def _latency_row(label: str, x: dict) -> list[str]:
    """One latency: measured, simulated and error at each quantile; per-request MAPE and bias."""
    return [label, *latency_cells(x, _QUANTILES), pct(x["mape"], False), pct(x["bias"])]


def latency_cells(x: dict, quantiles: tuple[str, ...]) -> list[str]:
    """A latency's measured and simulated value (ms) and their error, at each of `quantiles` in turn."""
    cells = []
    for q in quantiles:
        cells += [ms(x["measured"][q]), ms(x["predicted"][q]), pct(x[f"{q}_error"])]
    return cells


def _totals_section(r: Report, result: dict, cmp) -> None:
    """Throughput, preemptions and memory, measured against simulated; the copies' notes."""
    r.h2("Throughput, preemptions, memory")
    r.add(
        Table(
            ["quantity", "measured", "simulated", "error"],
            [
                [k.replace("_", " "), num(v["measured"]), num(v["predicted"]), pct(v["error"])]
                for k, v in cmp.totals.items()
            ],
            numeric={1, 2, 3},
        )
    )
    cm, ob = cmp.cost_model, result.get("offload")
    notes = [
        _swap_note(cm["swap"]) if "swap" in cm else None,
        _recompute_note(cm["recompute"]) if "recompute" in cm else None,
        _offload_note(ob) if ob else None,  # offload cases (offload_validate.py)
    ]
    notes = [n for n in notes if n]
    if notes:
        r.bullets(notes)


def _swap_note(s: dict) -> str:
    return (
        f"Swap copies: {s['events']} iterations swapped; measured {ms(s['measured_s'])} ms in total, "
        f"predicted {ms(s['predicted_s'])} ms on the same bytes ({pct(s['error'])}; per event MAPE "
        f"{pct(s['mape'], False)})."
    )


def _recompute_note(s: dict) -> str:
    return (
        f"Recomputes: {s['iterations']} iterations prefilled an evicted sequence again; measured "
        f"{ms(s['measured_s'])} ms, predicted {ms(s['predicted_s'])} ms on the same batches "
        f"({pct(s['error'])})."
    )


def _offload_note(ob: dict) -> str:
    """The KV bytes loaded over the host link and their copy time, measured against predicted."""
    heldout = (
        f"; with the sparsity recorded on the held-out calibration run instead: {pct(ob['heldout_sparsity_bytes_error'])}"
        if "heldout_sparsity_bytes_error" in ob
        else ""
    )
    return (
        f"KV offload: {num(ob['measured_bytes'] / 1e6)} MB loaded over the host link in "
        f"{ob['iterations_loading']} iterations, predicted {num(ob['predicted_bytes'] / 1e6)} MB by the "
        f"simulator's policy on the same batches ({pct(ob['bytes_error'])}; per iteration MAPE "
        f"{pct(ob['bytes_mape'], False)}); load copies measured {ms(ob['measured_load_s'])} ms, predicted "
        f"{ms(ob['predicted_load_s'])} ms ({pct(ob['load_time_error'])}); the simulation, on its own schedule: "
        f"{pct(ob.get('simulated_bytes_error'))} against the executed bytes{heldout}."
    )


_TIMELINES_CAPTION = "Batch size and KV blocks in use, measured (blue) and simulated (orange), on each run's own clock."


def timelines_plot(r: Report, exec_run, sim_run, folder: Path, caption: str) -> None:
    """The batch size and KV use plot, measured and simulated, written to folder/plots and added to the report."""
    r.add(Image("plots/timelines.png", "batch size and KV use over time", caption))
    plots.timelines(exec_run, sim_run, Path(folder) / "plots" / "timelines.png")


def _method_bullets(result: dict) -> list[str]:
    """How the case ran: executor, simulator, cost model, what is timed, what was carried over."""
    stats = ", ".join(map(str, result.get("statistics", {}))) or "none (plain serving needs none)"
    return [
        f"Executor: `{result['model']}` on `{result['device']}`, mode `{result['mode']}`, arrivals replayed without "
        f"sleeping (idle waits skipped), {result['threads']} torch thread(s). Run directory: `exec/`.",
        "Simulator: the executor's requests (arrival times, prompt and output lengths, by id) and its policy "
        "configuration and KV pools, in step mode (one series row per iteration). Run directory: `sim/`; the same "
        "driven by the executor's measured times: `replay/`.",
        f"Cost model: {result['cost_model']['description']}.",
        "Measured iteration time: from an iteration's start to the next one's, less the next one's swap copies "
        "(the simulator times those as transfers) — the forward pass plus the engine's own per-iteration work.",
        f"Recorded statistics fed to the simulator: {stats}.",
    ]


def matrix_report(rows: list[dict], meta: dict, folder: Path, stem: str = "RESULTS") -> tuple[Path, Path]:
    """The matrix table: one row per case and target, with the date and the machine."""
    r = Report(meta.get("title", "Validation matrix: simulator against the executor"), meta.get("subtitle", ""))
    r.verdict = meta.get("verdict", [])
    r.h2("Machine")
    r.bullets([f"{k}: {v}" for k, v in meta.get("machine", {}).items()])
    r.h2("Results")
    cols = [
        "case",
        "status",
        "iteration MAPE: judged (raw)",
        "throughput",
        "mean e2e",
        "TTFT p99",
        "TPOT p99",
        "e2e p99",
        "swap cost",
        "recompute cost",
        "KV bytes loaded",
        "replay: mean e2e / aligned",
        "misses and their source",
    ]
    body, bad = [], set()
    for i, row in enumerate(rows):
        if row.get("status") != "ran":
            body.append([row["case"], row.get("status", "?")] + ["-"] * 10 + [row.get("reason", "")])
            continue
        checks = (row.get("judged") or {}).get("checks", row["checks"])  # the rule's verdict (rule.py)
        by = {c["metric"]: c for c in checks}

        def cell(metric, signed=True):
            c = by.get(metric)
            if c is None:
                return "-"
            return pct(c["value"], signed) + ("" if c["ok"] else " ✗")

        misses = _misses(checks)
        if misses:
            bad.add(i)
        body.append(
            [
                row["case"],
                "pass" if not misses else "miss",
                _iteration_cell(by, cell),
                cell("throughput (output tok/s)"),
                cell("mean end-to-end latency"),
                cell("TTFT p99"),
                cell("TPOT p99"),
                cell("end-to-end p99"),
                cell("swap cost (total copy time)"),
                cell("recompute cost (re-prefill time)"),
                cell("KV bytes loaded (total)"),
                _replay_cell(row),
                "; ".join(misses),
            ]
        )
    r.add(
        Table(
            cols,
            body,
            highlight=bad,
            numeric=set(range(2, 12)),
            caption="Targets: per-iteration MAPE ≤ 10% (judged at the run's local speed on CPU; in brackets the raw "
            "MAPE); throughput and mean end-to-end ≤ 10%; p99 ≤ 20%; swap "
            "and recompute cost ≤ 5%; offload cases: KV bytes loaded over the host link ≤ 5% in total (and "
            "≤ 10% per iteration, MAPE). Errors are (simulated - measured) / measured, the aggregate ones the "
            "median over the repeats; ✗ marks a miss under the rule. Replay: the "
            "simulation driven by the executor's measured times (scheduling alone): its mean end-to-end "
            "error and the share of iterations that ran the executor's batch; for the adaptive-s cases (s-replay), "
            "the mean end-to-end error of the simulation that follows the executed s trajectory.",
        )
    )
    for p in meta.get("notes", []):
        r.p(p)
    return r.write(folder, stem)


def _iteration_cell(by: dict, cell) -> str:
    """The per-iteration MAPE judged (at local speed on CPU) with the raw one beside it."""
    c = by.get("per-iteration latency MAPE")
    raw = c.get("raw") if c else None
    return cell("per-iteration latency MAPE", False) + (f" ({pct(raw, False)})" if raw is not None else "")


def _replay_cell(row: dict) -> str:
    rp = row.get("comparison", {}).get("replay") or {}
    if not rp:
        return "-"
    if rp.get("kind") == "s-replay":  # speculative: the simulation with the executed s trajectory
        return f"s-replay: {pct(rp['e2e_s']['mean_error'])}"
    return f"{pct(rp['e2e_s']['mean_error'])} / {pct(rp['aligned_fraction'], False)}"


_SHORT = {
    "per-iteration latency MAPE": "iteration",
    "throughput (output tok/s)": "throughput",
    "mean end-to-end latency": "mean e2e",
    "TTFT p99": "TTFT p99",
    "TPOT p99": "TPOT p99",
    "end-to-end p99": "e2e p99",
    "swap cost (total copy time)": "swap",
    "recompute cost (re-prefill time)": "recompute",
    "KV bytes loaded (total)": "KV bytes",
    "KV bytes loaded per iteration (MAPE)": "KV bytes per iteration",
}


def _misses(checks: list[dict]) -> list[str]:
    """Misses grouped by the component they come from, each component's detail said once
    (the detail of its first end-to-end miss, else its first)."""
    groups: dict[str, list[dict]] = {}
    for c in checks:
        if not c["ok"]:
            groups.setdefault(c.get("kind") or c["component"], []).append(c)
    out = []
    for kind, cs in groups.items():
        names = ", ".join(_SHORT.get(c["metric"], c["metric"]) for c in cs)
        detail = next((c["component"] for c in cs if c["metric"] != "per-iteration latency MAPE"), cs[0]["component"])
        out.append(f"{names} — {detail}")
    return out
