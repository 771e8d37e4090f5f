"""The offload serving executor (executor/offload/serve.py, runner.py) on the zoo's real
target model: with the full policy it generates what the plain executor generates; every
iteration loads exactly the bytes the policy selects (against hand counts from the executed
batches); H2O and InfiniGen load fewer; the validation hooks give the simulator statistics it
accepts; bad input is one line."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from infersim.simulator.errors import InfersimError  # noqa: E402

PROMPTS = {"type": "uniform", "low": 40, "high": 140}


def _spec(policy=None, **over):
    from infersim.simulator.workload.schema import WorkloadSpec

    d = {
        "name": f"serve-{policy or 'plain'}",
        "model": "zoo-target",
        "seed": 321,
        "serving": {"max_batch_size": 4, "dtype": "fp32"},
        "requests": {
            "count": 6,
            "arrival": {"type": "poisson", "rate": 400.0},
            "prompt_tokens": PROMPTS,
            "output_tokens": {"type": "fixed", "value": 10},
        },
    }
    if policy is not None:
        d["offload"] = {"policy": policy, "overlap": "none"}
    for k, v in over.items():
        d[k] = {**d.get(k, {}), **v}
    return WorkloadSpec.model_validate(d)


def _read(path):
    import pyarrow.parquet as pq

    t = pq.read_table(str(path))
    return {c: t.column(c).to_numpy() for c in t.column_names}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, zoo_dir):
    """The same requests served plainly and with each offload policy."""
    from infersim.executor.offload import execute as offload_execute
    from infersim.executor.options import VALIDATION
    from infersim.executor.run import execute as plain_execute
    from infersim.simulator.workload.builder import build_requests

    out = tmp_path_factory.mktemp("offload-serve")
    spec = _spec()
    plain_execute(spec, build_requests(spec), "zoo-target", out / "plain", VALIDATION)
    for pol in ("full", "h2o", "infinigen"):
        s = _spec(pol)
        offload_execute(s, build_requests(s), "zoo-target", out / pol, VALIDATION)
    return out


def _kv_token_layer_bytes():
    from infersim.executor.models import load_model

    cfg = load_model("zoo-target").config
    kvh = cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return cfg.num_hidden_layers, 2 * kvh * hd * 4  # layers; K and V of one token in one layer, fp32


def test_full_offload_generates_the_plain_executors_tokens(runs):
    a = _read(runs / "plain" / "outputs.parquet")
    b = _read(runs / "full" / "outputs.parquet")
    assert [list(x) for x in a["prompt_ids"]] == [list(x) for x in b["prompt_ids"]]
    assert [list(x) for x in a["output_ids"]] == [list(x) for x in b["output_ids"]]
    assert all(len(x) == 10 for x in b["output_ids"])


def test_bytes_loaded_and_stored_per_iteration_equal_the_hand_count(runs):
    L, tl = _kv_token_layer_bytes()
    b = _read(runs / "full" / "iteration_batches.parquet")
    o = _read(runs / "full" / "offload_iterations.parquet")
    dec = (b["query_tokens"] == 1) & (b["context_tokens"] > 0)
    for it, loaded, stored in zip(o["iteration"], o["loaded_bytes"], o["stored_bytes"]):
        m = b["iteration"] == it
        # full: every cached token of every decoding sequence, every layer; every new token stored
        assert loaded == int(b["context_tokens"][m & dec].sum()) * L * tl
        assert stored == int(b["query_tokens"][m].sum()) * L * tl
    assert o["loaded_bytes"].sum() > 0


def test_h2o_loads_its_budget_by_hand_count(runs):
    L, tl = _kv_token_layer_bytes()
    b = _read(runs / "h2o" / "iteration_batches.parquet")
    r = _read(runs / "h2o" / "requests.parquet")
    o = _read(runs / "h2o" / "offload_iterations.parquet")
    final = {int(i): int(p + q) for i, (p, q) in enumerate(zip(r["prompt_tokens"], r["output_tokens"]))}
    for it, loaded, stored in zip(o["iteration"], o["loaded_bytes"], o["stored_bytes"]):
        m = b["iteration"] == it
        want_load = want_store = 0
        for rid, q, c in zip(b["rid"][m], b["query_tokens"][m], b["context_tokens"][m]):
            budget = max(1, math.floor(0.2 * final[int(rid)] + 1e-9))  # the simulator's H2O budget, 20% of final
            if q == 1 and c > 0:
                want_load += min(int(c), budget)
                want_store += 1
            else:
                want_store += min(int(q), budget)  # prefill keeps only the budget
        assert loaded == want_load * L * tl
        assert stored == want_store * L * tl


def test_h2o_and_infinigen_load_fewer_bytes_than_full(runs):
    full = _read(runs / "full" / "offload_iterations.parquet")["loaded_bytes"].sum()
    for pol in ("h2o", "infinigen"):
        o = _read(runs / pol / "offload_iterations.parquet")
        assert 0 < o["loaded_bytes"].sum() < 0.6 * full, pol
    # InfiniGen loads everything below start_layer (1) and at most the 20% cap above it
    L, tl = _kv_token_layer_bytes()
    c = _read(runs / "infinigen" / "offload_counts.parquet")
    below = c["layer"] < 1
    assert np.array_equal(c["loaded"][below], c["context"][below].astype(float))
    assert np.all(c["loaded"][~below] <= np.maximum(1, np.floor(0.2 * c["context"][~below])) + 1e-9)
    assert np.all(np.isfinite(c["predicted"][~below]))


def test_hooks_give_updates_a_simulation_accepts(runs, tmp_path):
    from infersim.analysis.validate.measured import load_exec_run, load_run
    from infersim.analysis.validate.modes import MODES
    from infersim.analysis.validate.simulate import simulate_run
    from infersim.executor.offload import recorded_statistics, simulator_updates

    assert MODES.get("offload").availability() == (True, "")
    for pol in ("h2o", "infinigen"):
        stats = recorded_statistics(runs / pol)
        up = simulator_updates(stats)
        assert up["offload"]["pool_blocks"] == stats["pool_blocks"] > 0
        assert stats["loaded_bytes_total"] == pytest.approx(
            _read(runs / pol / "offload_iterations.parquet")["loaded_bytes"].sum()
        )
        if pol == "infinigen":
            from infersim.simulator.offload.sparsity import load_sparsity

            sp = load_sparsity(up["offload"]["sparsity"])  # the simulator's own loader accepts the file
            assert sp.important_tokens[0].alpha == 4.0 and len(sp.layer_scale) == 3
        else:
            assert "sparsity" not in up["offload"]
        summary = simulate_run(load_exec_run(runs / pol), tmp_path / pol, updates=up)
        sim = load_run(tmp_path / pol)
        assert summary["offload"]["policy"] == pol and summary["offload"]["kv_loaded_gb"] > 0
        assert len(sim.requests["arrival_s"]) == 6


def test_bad_input_is_one_line(tmp_path):
    from infersim.executor.offload import execute
    from infersim.executor.options import VALIDATION
    from infersim.simulator.workload.builder import build_requests

    for spec, words in (
        (_spec(), "offload:"),
        (_spec("gpu"), "not served"),
        (_spec("full", serving={"chunked_prefill": True}), "chunked_prefill"),
    ):
        with pytest.raises(InfersimError) as e:
            execute(spec, build_requests(spec), "zoo-target", tmp_path / "x", VALIDATION)
        assert words in str(e.value) and "\n" not in str(e.value)


def test_sim_exec_serves_a_workload_with_an_offload_section(runs, tmp_path, capsys):
    """`sim exec` picks the offload engine from the workload's `offload:` section: the same
    tokens as the library call."""
    import json

    import yaml

    from infersim.cli.main import main

    spec = _spec("h2o")
    path = tmp_path / "wl.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    out = tmp_path / "run"
    assert (
        main(["exec", "-w", str(path), "-m", "zoo-target", "--fast", "--threads", "1", "--no-plots", "-o", str(out)])
        == 0
    )
    assert "host-memory KV blocks" in " ".join(capsys.readouterr().out.split())  # the pool is not on a GPU
    assert json.loads((out / "summary.json").read_text())["finished"] == 6
    # the schedule follows the measured clock, so the bytes per iteration may differ; each
    # sequence's own H2O decisions (and so its tokens) do not
    got = _read(out / "offload_iterations.parquet")
    assert (
        got["loaded_bytes"].sum() > 0
        and got["iteration"].size == json.loads((out / "summary.json").read_text())["iterations"]
    )
    a, b = _read(out / "outputs.parquet"), _read(runs / "h2o" / "outputs.parquet")
    assert [list(x) for x in a["output_ids"]] == [list(x) for x in b["output_ids"]]
