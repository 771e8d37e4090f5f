"""The report of one speculative case (Markdown + HTML with plots): targets, the round cost
model on the executed rounds, the schedules, acceptance and tokens per step."""

from __future__ import annotations

from pathlib import Path

from infersim.analysis.report_html import Image, Table

from . import plots
from .report import checks_table, ms, num, pct, report_head, within_run_text


def spec_case_report(result: dict, exec_run, sim_run, cmp, folder: Path) -> tuple[Path, Path]:
    folder = Path(folder)
    cm, it, rq, tot = cmp.cost_model, cmp.iterations, cmp.requests, cmp.totals
    r = report_head(result, cmp, folder)
    r.h2("Targets")
    r.p(
        "The per-iteration target is judged per round: the drafts' s steps plus the verification "
        "(pipelined: one verification), from one round's start to the next's."
    )
    r.add(checks_table(cmp.checks))
    r.h2("Per round: the cost model on the executed rounds")
    r.p(
        f"{cm['compared']} of {cm['rounds']} rounds with a measured period: MAPE {pct(cm['mape'], False)}, signed bias "
        f"{pct(cm['bias'])}, median error {pct(cm['median_ape'], False)}, total-time bias {pct(cm['total_bias'])}; "
        f"{pct(cm['noise']['stalls'], False)} of rounds stalled (MAPE without them {pct(cm['mape_unstalled'], False)}). "
        f"Drafting took {pct(cm['draft_share_measured'], False)} of the measured round time; the fit's draft terms are "
        f"{pct(cm['draft_total_bias'])} off the measured drafting time in total."
    )
    within = within_run_text(cm)
    if within:
        r.p(within.replace("each iteration", "each round"))
    plots.scatter_iterations(cmp, folder / "plots" / "rounds.png")
    r.add(
        Image(
            "plots/rounds.png",
            "predicted vs measured per round",
            "Per executed round: the fit's time on its " "rebuilt batch against the measured round period.",
        )
    )
    r.h2("Schedules")
    r.p(
        f"Rounds: {it['executed']} executed, {it['simulated']} simulated ({pct(it['rounds_error'])}); mean batch "
        f"{it['mean_batch_executed']:.2f} executed, {it['mean_batch_simulated']:.2f} simulated; "
        f"{pct(it['aligned_fraction'], False)} of rounds ran the same batch (sequences, prefill tokens) at the same "
        f"index, first divergence at round {it['first_divergence']}. Admission: the executor reserves each request's "
        f"whole KV; here that reservation {'could' if result.get('kv_reservation_binds') else 'can not'} bind "
        f"(the simulator admits on prompt blocks)."
    )
    plots.timelines(exec_run, sim_run, folder / "plots" / "timelines.png")
    r.add(
        Image(
            "plots/timelines.png",
            "batch size and KV use over time",
            "Batch size and KV blocks in use per round, measured and simulated.",
        )
    )
    r.h2("Requests, acceptance and tokens per step")
    rows = []
    for col in ("ttft_s", "tpot_s", "e2e_s"):
        x = rq[col]
        rows.append(
            [
                col,
                ms(x["measured"]["mean"]),
                ms(x["predicted"]["mean"]),
                pct(x["mean_error"]),
                ms(x["measured"]["p99"]),
                ms(x["predicted"]["p99"]),
                pct(x["p99_error"]),
                pct(x["mape"], False),
            ]
        )
    r.add(
        Table(
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
            rows,
            numeric=set(range(1, 8)),
        )
    )
    rows = [
        [k, num(v.get("measured")), num(v.get("predicted")), pct(v.get("error"))]
        for k, v in tot.items()
        if k
        in (
            "throughput_output_tokens_per_s",
            "makespan_s",
            "iterations",
            "batch_size_mean",
            "acceptance_rate",
            "tokens_per_step",
        )
    ]
    r.add(Table(["total", "measured", "simulated", "error"], rows, numeric={1, 2, 3}))
    st = result.get("statistics") or {}
    if st.get("per_ssm"):
        r.p(
            "Per SSM (measured; the simulator gets the voted draft's acceptance for every SSM, correlation 1): "
            + "; ".join(
                f"{n}: agreement {v['mean_agreement_rate']:.2f}, voted {v['voted']}, final weight "
                f"{v['final_weight']:.2f}"
                for n, v in st["per_ssm"].items()
            )
        )
    traj = st.get("s_trajectory_rounds", st.get("s_trajectory"))
    if traj and len(traj) > 1:
        ss = result.get("simulated_speculation", {}).get("s") or {}
        r.p(
            f"s over the executed rounds (round, s): {traj[:12]}; simulated: final {ss.get('final')}, "
            f"{ss.get('changes')} changes."
        )
    plots.latency_cdfs(cmp, folder / "plots" / "latency_cdfs.png")
    rp = cmp.replay
    if rp.get("kind") == "s-replay":
        r.p(
            f"s-replay (the simulation following the executed s trajectory instead of its own selector; mean s per "
            f"round {num(rp.get('s_mean_simulated'))}, executed {num(cmp.info.get('s_mean_executed'))}): throughput "
            f"{pct(rp['throughput_error'])}, mean end-to-end {pct(rp['e2e_s']['mean_error'])}, end-to-end p99 "
            f"{pct(rp['e2e_s']['p99_error'])}, TPOT p99 {pct(rp['tpot_s']['p99_error'])}, tokens per step "
            f"{pct(rp['tokens_per_step_error'])}, acceptance {pct(rp['acceptance_rate_error'])}."
        )
    fs, sel = cmp.info.get("free_selector"), cmp.info.get("selector_on_executed_inputs") or {}
    if fs:
        share = lambda d: ", ".join(f"s={k} {v:.0%}" for k, v in sorted(d.items(), key=lambda kv: int(kv[0])))
        r.p(
            f"Adaptive s: the targets above are judged on the s-replay (sim-s-replay/). The simulator's selector fed "
            f"the executor's own observations took {'the executed trajectory' if sel.get('same') else 'another trajectory'}"
            f" ({sel.get('trajectory')}). The free-running simulation (sim/, its own selector on simulated rounds): "
            f"rounds at {share(fs.get('s_rounds_simulated') or {})} against {share(fs.get('s_rounds_executed') or {})} "
            f"executed; throughput {pct(fs['throughput_error'])}, mean end-to-end {pct(fs['e2e_s']['mean_error'])}, "
            f"TTFT p99 {pct(fs['ttft_s']['p99_error'])}, tokens per step {pct(fs['tokens_per_step_error'])}."
        )
    r.add(Image("plots/latency_cdfs.png", "latency CDFs", "Measured and simulated TTFT, TPOT and end-to-end CDFs."))
    return r.write(folder, "report")
