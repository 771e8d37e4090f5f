"""The report of one speculative case (Markdown + HTML with plots): targets, the round cost
model on the executed rounds, the schedules, acceptance and tokens per step."""

from __future__ import annotations

from pathlib import Path

from infersim.analysis.report_html import Image, Report, Table

from . import plots
from .report import checks_table, latency_cells, num, pct, report_head, timelines_plot, within_run_text

# the totals a speculative case reports, in the comparison's order
_TOTALS = (
    "throughput_output_tokens_per_s",
    "makespan_s",
    "iterations",
    "batch_size_mean",
    "acceptance_rate",
    "tokens_per_step",
)


def spec_case_report(result: dict, exec_run, sim_run, cmp, folder: Path) -> tuple[Path, Path]:
    """Write report.md / report.html (and plots/) for one validated speculative case into folder."""
    folder = Path(folder)
    r = report_head(result, cmp, folder)
    r.h2("Targets")
    r.p(
        "The per-iteration target is judged per round: the drafts' s steps plus the verification "
        "(pipelined: one verification), from one round's start to the next's."
    )
    r.add(checks_table(cmp.checks))
    _rounds_section(r, cmp, folder)
    r.h2("Schedules")
    r.p(_schedules_text(cmp.iterations, result.get("kv_reservation_binds")))
    timelines_plot(r, exec_run, sim_run, folder, "Batch size and KV blocks in use per round, measured and simulated.")
    _requests_section(r, result, cmp, folder)
    return r.write(folder, "report")


def _rounds_section(r: Report, cmp, folder: Path) -> None:
    """The round cost model on the executed rounds, the machine's speed inside the run, the scatter plot."""
    r.h2("Per round: the cost model on the executed rounds")
    r.p(_round_cost_text(cmp.cost_model))
    within = within_run_text(cmp.cost_model)
    if within:
        r.p(within.replace("each iteration", "each round"))
    plots.scatter_iterations(cmp, folder / "plots" / "rounds.png")
    r.add(
        Image(
            "plots/rounds.png",
            "predicted vs measured per round",
            "Per executed round: the fit's time on its rebuilt batch against the measured round period.",
        )
    )


def _round_cost_text(cm: dict) -> str:
    """The fit's errors on the executed rounds, the stalls, and the share of drafting."""
    return (
        f"{cm['compared']} of {cm['rounds']} rounds with a measured period: MAPE {pct(cm['mape'], False)}, signed bias "
        f"{pct(cm['bias'])}, median error {pct(cm['median_ape'], False)}, total-time bias {pct(cm['total_bias'])}; "
        f"{pct(cm['noise']['stalls'], False)} of rounds stalled (MAPE without them {pct(cm['mape_unstalled'], False)}). "
        f"Drafting took {pct(cm['draft_share_measured'], False)} of the measured round time; the fit's draft terms are "
        f"{pct(cm['draft_total_bias'])} off the measured drafting time in total."
    )


def _schedules_text(it: dict, kv_reservation_binds) -> str:
    """Rounds and batch sizes executed against simulated, how far they ran the same batches; admission."""
    return (
        f"Rounds: {it['executed']} executed, {it['simulated']} simulated ({pct(it['rounds_error'])}); mean batch "
        f"{it['mean_batch_executed']:.2f} executed, {it['mean_batch_simulated']:.2f} simulated; "
        f"{pct(it['aligned_fraction'], False)} of rounds ran the same batch (sequences, prefill tokens) at the same "
        f"index, first divergence at round {it['first_divergence']}. Admission: the executor reserves each request's "
        f"whole KV; here that reservation {'could' if kv_reservation_binds else 'can not'} bind "
        f"(the simulator admits on prompt blocks)."
    )


def _requests_section(r: Report, result: dict, cmp, folder: Path) -> None:
    """Latencies and totals measured against simulated, what the speculation did, the latency CDFs."""
    r.h2("Requests, acceptance and tokens per step")
    r.add(_latency_table(cmp.requests))
    rows = [
        [k, num(v.get("measured")), num(v.get("predicted")), pct(v.get("error"))]
        for k, v in cmp.totals.items()
        if k in _TOTALS
    ]
    r.add(Table(["total", "measured", "simulated", "error"], rows, numeric={1, 2, 3}))
    st = result.get("statistics") or {}
    paragraphs = (_per_ssm_text(st), _s_trajectory_text(st, result), _s_replay_text(cmp), _free_selector_text(cmp))
    for text in paragraphs:
        if text:
            r.p(text)
    plots.latency_cdfs(cmp, folder / "plots" / "latency_cdfs.png")
    r.add(Image("plots/latency_cdfs.png", "latency CDFs", "Measured and simulated TTFT, TPOT and end-to-end CDFs."))


def _latency_table(rq: dict) -> Table:
    """Mean and p99 of each latency, measured, simulated and the error; per-request MAPE."""
    return Table(
        [
            "latency",
            "measured mean (ms)",
            "simulated mean (ms)",
            "error",
            "measured p99 (ms)",
            "simulated p99 (ms)",
            "error",
            "per-request MAPE",
        ],
        [
            [col, *latency_cells(rq[col], ("mean", "p99")), pct(rq[col]["mape"], False)]
            for col in ("ttft_s", "tpot_s", "e2e_s")
        ],
        numeric=set(range(1, 8)),
    )


def _per_ssm_text(st: dict) -> str:
    """Each SSM's measured agreement and voting weight ('' without several SSMs)."""
    if not st.get("per_ssm"):
        return ""
    return (
        "Per SSM (measured; the simulator gets the voted draft's acceptance for every SSM, correlation 1): "
        + "; ".join(
            f"{n}: agreement {v['mean_agreement_rate']:.2f}, voted {v['voted']}, final weight {v['final_weight']:.2f}"
            for n, v in st["per_ssm"].items()
        )
    )


def _s_trajectory_text(st: dict, result: dict) -> str:
    """The executed s trajectory beside the simulated selector's ('' when s never moved)."""
    traj = st.get("s_trajectory_rounds", st.get("s_trajectory"))
    if not traj or len(traj) <= 1:
        return ""
    ss = result.get("simulated_speculation", {}).get("s") or {}
    return (
        f"s over the executed rounds (round, s): {traj[:12]}; simulated: final {ss.get('final')}, "
        f"{ss.get('changes')} changes."
    )


def _s_replay_text(cmp) -> str:
    """The simulation following the executed s trajectory ('' without one)."""
    rp = cmp.replay
    if rp.get("kind") != "s-replay":
        return ""
    return (
        f"s-replay (the simulation following the executed s trajectory instead of its own selector; mean s per "
        f"round {num(rp.get('s_mean_simulated'))}, executed {num(cmp.info.get('s_mean_executed'))}): throughput "
        f"{pct(rp['throughput_error'])}, mean end-to-end {pct(rp['e2e_s']['mean_error'])}, end-to-end p99 "
        f"{pct(rp['e2e_s']['p99_error'])}, TPOT p99 {pct(rp['tpot_s']['p99_error'])}, tokens per step "
        f"{pct(rp['tokens_per_step_error'])}, acceptance {pct(rp['acceptance_rate_error'])}."
    )


def _free_selector_text(cmp) -> str:
    """Adaptive s: the simulator's own selector, on the executed observations and free-running ('' otherwise)."""
    fs, sel = cmp.info.get("free_selector"), cmp.info.get("selector_on_executed_inputs") or {}
    if not fs:
        return ""
    return (
        f"Adaptive s: the targets above are judged on the s-replay (sim-s-replay/). The simulator's selector fed "
        f"the executor's own observations took {'the executed trajectory' if sel.get('same') else 'another trajectory'}"
        f" ({sel.get('trajectory')}). The free-running simulation (sim/, its own selector on simulated rounds): "
        f"rounds at {_s_shares(fs.get('s_rounds_simulated') or {})} against {_s_shares(fs.get('s_rounds_executed') or {})} "
        f"executed; throughput {pct(fs['throughput_error'])}, mean end-to-end {pct(fs['e2e_s']['mean_error'])}, "
        f"TTFT p99 {pct(fs['ttft_s']['p99_error'])}, tokens per step {pct(fs['tokens_per_step_error'])}."
    )


def _s_shares(rounds: dict) -> str:
    """Share of rounds at each s, smallest s first: 's=2 40%, s=4 60%'."""
    return ", ".join(f"s={k} {v:.0%}" for k, v in sorted(rounds.items(), key=lambda kv: int(kv[0])))
