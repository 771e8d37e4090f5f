"""The real executor: checkpoint loading, the engine's greedy outputs against Hugging Face
`generate` token for token (continuous batching, forced swap, forced recompute, chunked
prefill, both schedulers, Llama and OPT), and `sim exec`'s run directory.

All on the zoo's trained models (the `zoo_dir` fixture), on CPU with one torch thread
(conftest.py)."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import infersim.executor  # noqa: E402,F401  (before torch: OpenMP threads wait passively, see executor/__init__.py)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytestmark = pytest.mark.torch

from infersim.executor.engine import generate  # noqa: E402
from infersim.executor.models import hf_greedy_generate, load_model  # noqa: E402
from infersim.executor.prompts import make_prompts  # noqa: E402
from infersim.simulator.errors import InfersimError  # noqa: E402
from infersim.simulator.workload.schema import ServingSection  # noqa: E402

PROMPT_LENS = [23, 150, 7, 64, 101, 40, 12, 88, 130, 55, 31, 76]
OUTPUT_LENS = [30, 12, 41, 25, 18, 36, 9, 28, 15, 33, 22, 40]


@pytest.fixture(scope="module")
def case(zoo_target):
    prompts = make_prompts(PROMPT_LENS, tokenizer=zoo_target.tokenizer, vocab_size=zoo_target.vocab_size, seed=11)
    return prompts, OUTPUT_LENS, hf_greedy_generate(zoo_target.model, prompts, OUTPUT_LENS)


def _blocks(case, bs=16):
    """KV blocks that hold every request of the case whole: a swap pool nothing overflows."""
    prompts, outputs, _ = case
    return sum(-(-(len(p) + o) // bs) for p, o in zip(prompts, outputs))


# ---- models -----------------------------------------------------------------------------
def test_checkpoint_round_trip_llama_and_mistral_layout(zoo_target, tmp_path):
    """A zoo checkpoint saved and reloaded as Llama, and the same weights declared as a
    Mistral checkpoint, give the same logits; bf16 loads as bf16."""
    ids = torch.tensor(
        [make_prompts([48], tokenizer=zoo_target.tokenizer, vocab_size=zoo_target.vocab_size, seed=1)[0]]
    )
    with torch.inference_mode():
        ref = zoo_target.model(ids).logits
    zoo_target.model.save_pretrained(tmp_path / "llama", safe_serialization=True)
    again = load_model(str(tmp_path / "llama"))
    assert again.family == "llama" and again.tokenizer is None
    with torch.inference_mode():
        assert torch.equal(again.model(ids).logits, ref)
    mistral = tmp_path / "mistral"
    shutil.copytree(zoo_target.path, mistral)
    cfg = json.loads((mistral / "config.json").read_text())
    cfg.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=None)
    (mistral / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(mistral / "config.json"))
    assert m.family == "mistral" and type(m.model).__name__ == "MistralForCausalLM"
    with torch.inference_mode():
        torch.testing.assert_close(m.model(ids).logits, ref, rtol=1e-5, atol=1e-5)
    half = load_model("zoo-target", dtype="bf16")
    assert half.dtype == torch.bfloat16 and next(half.model.parameters()).dtype == torch.bfloat16


def test_opt_checkpoint_loads(zoo_dir):
    m = load_model("zoo-opt")
    assert m.family == "opt" and type(m.model).__name__ == "OPTForCausalLM"
    assert m.meta["heldout_perplexity"] < 200


def test_bad_model_names_are_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(InfersimError, match="not a zoo name"):
        load_model(str(tmp_path / "missing"))
    (tmp_path / "x").mkdir()
    with pytest.raises(InfersimError, match="no config.json"):
        load_model(str(tmp_path / "x"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine without CUDA
    with pytest.raises(InfersimError, match="CUDA is not available"):
        load_model("zoo-target", device="cuda")


# ---- the engine against Hugging Face generate -------------------------------------------
def serve_matching_hf(zoo_target, case, **serving):
    """Serves the case's prompts on the engine with `serving` options, checks that every token
    is Hugging Face greedy's, and returns the engine."""
    prompts, outputs, ref = case
    got, eng = generate(zoo_target, prompts, outputs, ServingSection(**serving))
    assert got == ref
    return eng


def test_continuous_batching_matches_hf(zoo_target, case):
    eng = serve_matching_hf(zoo_target, case, max_batch_size=4)
    it = eng.stats.iteration_table()
    # requests joined while others were decoding: admissions after the first iteration,
    # and finished requests left the batch
    assert it["admitted"][1:].sum() > 0
    assert len(set(it["batch_size"].tolist())) > 1
    assert eng.counters["preempt_swap"] == eng.counters["preempt_recompute"] == 0


@pytest.mark.cuda
def test_engine_on_cuda_matches_hf_on_cpu(zoo_dir, case):
    """The same trained target in fp32 on a CUDA device: continuous batching gives the CPU's
    greedy tokens."""
    prompts, outputs, ref = case
    got, _ = generate(
        load_model("zoo-target", device="cuda", dtype="fp32"), prompts, outputs, ServingSection(max_batch_size=4)
    )
    assert got == ref


def test_forced_recompute_matches_hf(zoo_target, case):
    eng = serve_matching_hf(zoo_target, case, gpu_blocks=24, preemption="recompute")
    assert eng.counters["preempt_recompute"] > 0


def test_forced_swap_matches_hf(zoo_target, case):
    eng = serve_matching_hf(zoo_target, case, gpu_blocks=24, cpu_blocks=_blocks(case), preemption="swap")
    assert eng.counters["preempt_swap"] > 0 and eng.counters["swap_in_blocks"] > 0
    assert eng.counters["preempt_recompute"] == 0


def test_cost_aware_fairness_and_chunked_prefill_match_hf(zoo_target, case):
    eng = serve_matching_hf(
        zoo_target, case, gpu_blocks=24, cpu_blocks=40, scheduler="fairness", preemption="cost_aware"
    )
    assert eng.counters["preempt_swap"] + eng.counters["preempt_recompute"] > 0
    eng = serve_matching_hf(
        zoo_target, case, chunked_prefill=True, max_batched_tokens=48, gpu_blocks=30, preemption="swap", cpu_blocks=60
    )
    mixed = eng.stats.iteration_table()
    assert ((mixed["prefill_seqs"] > 0) & (mixed["decode_seqs"] > 0)).any()  # Sarathi-style mixed iterations


def test_uninitialised_cache_memory_never_leaks_in(zoo_target, case, monkeypatch):
    """Blocks are read whole and ragged batches padded; masked rows get weight 0, but 0 x NaN
    is NaN: pools made of NaN (as uninitialised GPU memory may be, and a CPU pool's blocks past
    those committed up front) must not change a token."""
    import infersim.executor.kvcache as kvcache

    monkeypatch.setattr(kvcache.PagedKVCache, "_commit", lambda self, blocks: None)

    def nan_filled(real):
        def alloc(*args, **kwargs):
            t = real(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t

        return alloc

    monkeypatch.setattr(kvcache.torch, "empty", nan_filled(torch.empty))
    monkeypatch.setattr(kvcache.torch, "zeros", nan_filled(torch.zeros))
    eng = serve_matching_hf(
        zoo_target, case, gpu_blocks=24, cpu_blocks=_blocks(case), preemption="swap", max_batch_size=5
    )
    assert eng.counters["preempt_swap"] > 0


def _rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="resident memory is read from Linux's /proc")
def test_a_cpu_pool_commits_only_the_blocks_the_workload_can_hold():
    """A planned pool far larger than the workload (4 GiB by default on cpu) costs only the
    blocks the requests can hold: those are allocated and zero-filled up front; the accounting
    keeps the planned size."""
    from infersim.executor.kvcache import KVCacheConfig, PagedKVCache
    from infersim.executor.serving import workload_blocks
    from infersim.simulator.workload.requests import Requests

    # prompts 16 and 17 with outputs 16 and 1 at 16 tokens a block: 2 and 2 blocks, one spare each
    requests = Requests(np.array([16, 17]), np.array([16, 1]), np.array([0.0, 0.0]))
    assert workload_blocks(requests, 16) == 6
    before = _rss_bytes()
    config = KVCacheConfig(gpu_blocks=20_000, cpu_blocks=20_000, dtype=torch.float32, committed_blocks=6)
    cache = PagedKVCache(2, 4, 64, config)  # planned: 4 pools of 655 MB
    grown = _rss_bytes() - before
    # a block: 2 layers x 16 tokens x 4 heads x 64 x 4 B = 32,768 B per tensor
    assert cache._k.numel() * 4 == 6 * 32_768 and cache._hv.numel() * 4 == 6 * 32_768 and grown < 60e6, grown
    assert (cache.total_gpu, cache.free_gpu, cache.total_cpu) == (20_000, 20_000, 20_000)
    assert not cache._k.any() and not cache._hv.any()


def test_drafts_and_opt_match_hf(zoo_dir, case):
    prompts, outputs, _ = case
    for name in ("zoo-draft-b", "zoo-opt"):
        lm = load_model(name)
        ps = make_prompts(PROMPT_LENS[:6], tokenizer=lm.tokenizer, vocab_size=lm.vocab_size, seed=5)
        outs = OUTPUT_LENS[:6]
        ref = hf_greedy_generate(lm.model, ps, outs)
        got, eng = generate(lm, ps, outs, ServingSection(gpu_blocks=12, cpu_blocks=60, preemption="swap"))
        assert eng.counters["preempt_swap"] > 0, name
        assert got == ref, name


def test_arrivals_replayed_in_real_time(zoo_target, case):
    prompts, outputs, _ = case
    arrivals = [0.0, 0.0, 0.25, 0.5]
    _, eng = generate(zoo_target, prompts[:4], [4] * 4, arrival_s=arrivals)
    seqs = sorted(eng.finished, key=lambda s: s.rid)
    for s, a in zip(seqs, arrivals):
        assert s.first_scheduled_s >= a
        assert s.finish_s > s.first_token_s >= s.first_scheduled_s


# ---- sim exec ---------------------------------------------------------------------------
WORKLOAD = """
name: exec-small
model: opt-125m
hardware: {profile: a100-80gb-pcie}
serving: {gpu_blocks: 40, cpu_blocks: 40, block_size: 16, preemption: swap}
requests:
  count: 10
  arrival: {type: burst}
  prompt_tokens: {type: uniform, low: 16, high: 120}
  output_tokens: {type: uniform, low: 8, high: 40}
seed: 2
"""


def test_sim_exec_writes_the_run_directory_of_sim_run(zoo_dir, tmp_path, capsys):
    import pandas as pd

    from infersim.cli.main import main

    wl = tmp_path / "small.yaml"
    wl.write_text(WORKLOAD)
    assert main(["run", "--workload", str(wl), "--out", str(tmp_path / "sim"), "-q", "--no-plots"]) == 0
    assert (
        main(
            [
                "exec",
                "--workload",
                str(wl),
                "--model",
                "zoo-target",
                "--fast",
                "--threads",
                "1",
                "--out",
                str(tmp_path / "exec"),
            ]
        )
        == 0
    )
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps lines at the terminal's width
    sim, ex = tmp_path / "sim", tmp_path / "exec"
    sim_files = {p.name for p in sim.iterdir()}
    ex_files = {p.name for p in ex.iterdir()}
    assert sim_files <= ex_files | {"plots"}
    assert {"iterations.parquet", "iteration_batches.parquet", "outputs.parquet", "plots"} <= ex_files
    assert any((ex / "plots").iterdir())
    for name in ("requests.parquet", "series.parquet"):
        assert list(pd.read_parquet(sim / name).columns) == list(pd.read_parquet(ex / name).columns), name
    s_sim = json.loads((sim / "summary.json").read_text())
    s_ex = json.loads((ex / "summary.json").read_text())
    assert set(s_sim) - {"speculation", "offload"} <= set(s_ex)
    assert s_ex["finished"] == 10 and s_ex["aborted"] == 0
    assert s_ex["preemptions"]["swap"] > 0 and s_ex["swap_out_bytes"] > 0  # 40 blocks are too few for 10 requests
    # the printed summary names the device that ran, the engine clock and the bytes swapped in kB
    from rich.filesize import decimal

    assert "exec-small: zoo-target on cpu (fp32), fcfs/swap" in printed, printed
    assert f"in {s_ex['makespan_s']:.2f} s on the engine clock" in printed and "simulated" not in printed
    assert f"swapped {decimal(s_ex['swap_out_bytes'])} out" in printed and " kB out" in printed
    assert "of 40 device KV blocks (in CPU memory)" in printed
    req = pd.read_parquet(ex / "requests.parquet")
    assert (req["finish_s"] >= req["first_token_s"]).all() and (req["first_token_s"] >= req["arrival_s"]).all()
    # per-iteration records: one row per iteration, batch composition adding up
    it = pd.read_parquet(ex / "iterations.parquet")
    rows = pd.read_parquet(ex / "iteration_batches.parquet")
    series = pd.read_parquet(ex / "series.parquet")
    assert len(it) == len(series) == s_ex["iterations"]
    assert (it["forward_s"] > 0).all() and (it["t_end_s"] >= it["t_start_s"]).all()
    assert (it["batch_size"] == it["prefill_seqs"] + it["decode_seqs"]).all()
    assert it["batch_tokens"].tolist() == rows.groupby("iteration")["query_tokens"].sum().tolist()
    assert it["swap_out_blocks"].sum() > 0
    # copy calls (what validation prices a swap with): 2 (keys, values) per run of consecutive
    # blocks, so between 2 and 2 per block on the CPU, none without a swap
    for d in ("out", "in"):
        blocks, calls = it[f"swap_{d}_blocks"].to_numpy(), it[f"swap_{d}_copies"].to_numpy()
        assert ((calls == 0) == (blocks == 0)).all() and (calls % 2 == 0).all()
        assert (calls <= 2 * blocks).all()
    out = pd.read_parquet(ex / "outputs.parquet")
    assert [len(x) for x in out["output_ids"]] == req["output_tokens"].astype(int).tolist()
    assert [len(x) for x in out["prompt_ids"]] == req["prompt_tokens"].astype(int).tolist()
    cfg = (ex / "config.yaml").read_text()
    assert "executor:" in cfg and "zoo-target" in cfg
    # the generated tokens are those of Hugging Face generate on the same prompts
    lm = load_model("zoo-target")
    ps = [list(map(int, p)) for p in out["prompt_ids"][:3]]
    ref = hf_greedy_generate(lm.model, ps, [len(x) for x in out["output_ids"][:3]])
    assert [list(map(int, x)) for x in out["output_ids"][:3]] == ref
    assert np.isfinite(s_ex["ttft_s"]["mean"])


def test_sim_exec_errors_are_one_line(tmp_path, capsys):
    from infersim.cli.main import main

    wl = tmp_path / "small.yaml"
    wl.write_text(WORKLOAD)
    assert main(["exec", "--workload", str(wl), "--model", str(tmp_path / "nope"), "-q"]) == 2
    assert "not a zoo name" in capsys.readouterr().err
    # the executor's own dtypes, not the workload card's rules; no thread count of 0
    for flag, value, message in (
        ("--dtype", "fp8", "--dtype: the executor runs fp32, fp16 or bf16, got 'fp8'"),
        ("--threads", "0", "(the CPUs this machine gives), got 0"),
    ):
        out = tmp_path / "out"
        assert main(["exec", "-w", str(wl), "-m", "zoo-target", flag, value, "-o", str(out), "-q"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(message) and len(err.splitlines()) == 1 and not out.exists(), err
