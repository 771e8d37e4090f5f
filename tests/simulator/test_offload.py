"""KV offload (simulator/offload): policies count by hand, the per-layer pipeline composes by
hand, the gpu policy is the roofline, stretches equal stepping, the registry speaks YAML, an
offloading workload serves deterministically, and the InfiniGen findings that hold in the
model stay true."""

import numpy as np
import pytest

from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.errors import InfersimError
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.models.catalog import load_model
from infersim.simulator.offload import OffloadSection, build_offload, coverage
from infersim.simulator.offload.costmodel import OffloadCostModel, Stages
from infersim.simulator.offload.policies import KVShape, build_policy
from infersim.simulator.offload.sparsity import SparsityModel, SparsitySpec, load_sparsity
from infersim.simulator.simulation import Simulation, simulate
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import WorkloadSpec
from tests.utils import poisson, requests_section

M13 = load_model("opt-13b")
A6000 = load_hardware("rtx-a6000", host_link="pcie3x16")
TLB = 2 * 5120 * 2  # OPT-13B: K and V of one token in one layer, fp16 bytes
SPARSE = SparsityModel(load_sparsity("opt-13b"), 4.0)


def cm_for(policy, params=None, model=M13, **section):
    sec = OffloadSection.model_validate({"policy": policy, "params": params or {}, "sparsity": "opt-13b", **section})
    return build_offload(model, A6000, sec).cost_model()


def stages_decode(cm, contexts, final=None):
    c = np.asarray(contexts)[None, :]
    f = None if final is None else np.asarray(final)[None, :]
    return cm.stages(np.ones_like(c), c, np.ones_like(c), f)


# ---- policies count by hand ----------------------------------------------------------------
def test_full_offload_loads_every_token_of_every_layer():
    cm = cm_for("full")
    st = stages_decode(cm, [100, 300])
    assert st.loaded_tokens.shape == (1, 40)
    assert np.all(st.loaded_tokens == 400)
    assert np.allclose(st.load_bytes, 400 * TLB)
    link = A6000.host_link
    assert np.allclose(st.load, link.latency_us * 1e-6 + 400 * TLB / (link.h2d_gbps * 1e9))
    # the new token's KV of each layer is stored back
    assert np.allclose(st.store_bytes, 2 * TLB)


def test_the_position_embedding_runs_before_the_first_layer():
    """OPT-13B's learned positions are added with the token embedding, before layer 0 (where
    the first load overlaps them), not after the last layer with the LM head."""
    cm = cm_for("full")
    st = stages_decode(cm, [100, 300])
    rows = {o.name: o.time_s for o in cm.base.breakdown(BatchShape.decode([100, 300]))}
    assert st.pre[0] == pytest.approx(rows["embedding"] + rows["position_embedding"], rel=1e-12)
    assert st.post[0] == pytest.approx(rows["final_norm"] + rows["lm_head"], rel=1e-12)


def test_infinigen_fetch_is_important_tokens_capped_from_layer_1():
    cm = cm_for("infinigen")
    st = stages_decode(cm, [2048])
    assert st.loaded_tokens[0, 0] == 2048  # layer 0: everything
    assert np.all(st.loaded_tokens[0, 1:] == 73)  # the paper's 73 at 2,048, under the 409 cap
    assert np.all(st.pred[0, 1:] > 0) and st.pred[0, 0] == 0

    # a sparsity table where the 20% cap binds: 300 important tokens of 1,000 -> cap 200
    spec = SparsitySpec(
        name="t", source="test", important_tokens=[{"alpha": 4, "context": [1000, 2000], "tokens": [300, 600]}]
    )
    pol = build_policy("infinigen", {"start_layer": 2}, KVShape.of(M13), SparsityModel(spec, 4))
    att = pol.attended_tokens(np.array([1000, 2000, 1500]), None)
    assert att.shape == (3, 40)
    assert list(att[:, 0]) == [1000, 2000, 1500] and list(att[:, 1]) == [1000, 2000, 1500]  # layers 0, 1 full
    assert list(att[:, 2]) == [200, 400, 300]  # min(important, 20% of the KV)
    # under the cap the count itself: log-log interpolation is exact at the data points
    assert list(pol.attended_tokens(np.array([1000]), None)[0, 2:]) == [200] * 38
    uncapped = build_policy("infinigen", {"max_fetch_fraction": 1.0}, KVShape.of(M13), SparsityModel(spec, 4))
    assert list(uncapped.attended_tokens(np.array([1000, 2000]), None)[:, 5]) == [300, 600]


def test_int4_moves_a_quarter_of_the_bytes_plus_scales():
    cm = cm_for("int4")
    st = stages_decode(cm, [512, 512])
    per_token = 2 * 5120 * (0.5 + 4 / 64)  # 4 bits + an fp16 scale and minimum per group of 64
    assert per_token / TLB == pytest.approx(0.28125)
    assert np.allclose(st.load_bytes, 1024 * per_token)
    # dequantization costs attention time the full-offload policy does not pay
    full = stages_decode(cm_for("full"), [512, 512])
    assert np.all(st.attn > full.attn)


def test_h2o_budget_is_constant_while_decoding():
    cm = cm_for("h2o")
    for c in (1920, 1990, 2047):
        st = stages_decode(cm, [c, c], final=[2048, 2048])
        assert np.all(st.loaded_tokens == 2 * 409)  # 20% of 2,048, every layer, every step
    st = stages_decode(cm, [50], final=[500])
    assert np.all(st.loaded_tokens == 50)  # before the budget (100) fills
    # prefill stores only the budget
    pre = cm.stages(np.array([[1920]]), np.array([[0]]), np.array([[1]]), np.array([[2048]]))
    assert np.allclose(pre.store_bytes, 409 * TLB)
    # the serving path binds final lengths once; unbound, the current length stands in
    cm.bind_final([2048])
    t_bound = cm.iteration_time_s(BatchShape.decode([1920]))
    assert t_bound == cm.time_s(BatchShape.decode([1920]), final=[2048])
    assert cm.iteration_time_s(BatchShape.decode([1920])) == cm.time_s(BatchShape.decode([1920]), final=[1921])


def test_weights_split_streams_the_cpu_share_every_layer():
    cm = cm_for("gpu", weights_gpu_percent=70)
    st = stages_decode(cm, [100])
    per_layer = M13.params_per_layer() * 2
    assert np.allclose(st.load_bytes, 0.3 * per_layer)
    assert cm.iteration_time_s(BatchShape.decode([100])) > cm_for("gpu").iteration_time_s(BatchShape.decode([100]))


# ---- the pipeline composes by hand ----------------------------------------------------------
def _tiny_stages():
    z = np.zeros((1, 2))
    return Stages(
        attn=np.array([[1.0, 2.0]]),
        ffn=np.array([[1.0, 1.0]]),
        pred=np.array([[0.0, 0.5]]),
        load=np.array([[4.0, 3.0]]),
        store=np.array([[0.1, 0.1]]),
        pre=np.array([0.5]),
        post=np.array([0.2]),
        overhead=0.0,
        loaded_tokens=z,
        load_bytes=z,
        store_bytes=z,
    )


@pytest.mark.parametrize(
    "mode,expected",
    [
        # ffn:   max(pre, T0) + [a0 + p1 + max(f0, T1, S0)] + [a1 + max(f1, S1)] + post
        ("ffn", 4.0 + (1.0 + 0.5 + 3.0) + (2.0 + 1.0) + 0.2),
        # layer: max(pre, T0) + [p1 + max(a0 + f0, T1, S0)] + [max(a1 + f1, S1)] + post
        ("layer", 4.0 + (0.5 + 3.0) + 3.0 + 0.2),
        # none:  pre + [T0 + a0 + p1 + f0 + S0] + [T1 + a1 + f1 + S1] + post
        ("none", 0.5 + (4.0 + 1.0 + 0.5 + 1.0 + 0.1) + (3.0 + 2.0 + 1.0 + 0.1) + 0.2),
    ],
)
def test_pipeline_by_hand(mode, expected):
    cm = cm_for("infinigen", overlap=mode)
    assert cm.total(_tiny_stages())[0] == pytest.approx(expected)


def test_without_prediction_each_stage_is_max_of_compute_and_transfer():
    """The textbook form: layer i-1's compute and layer i's load side by side."""
    cm = cm_for("full", overlap="layer")
    st = stages_decode(cm, [1500, 700, 900])
    compute = st.attn[0] + st.ffn[0]
    by_hand = max(st.pre[0], st.load[0, 0])
    for i in range(40):
        nxt = st.load[0, i + 1] if i + 1 < 40 else 0.0
        by_hand += max(compute[i], nxt, st.store[0, i])
    by_hand += st.overhead + st.post[0]
    assert cm.iteration_time_s(BatchShape.decode([1500, 700, 900])) == pytest.approx(by_hand, rel=1e-12)


@pytest.mark.parametrize("mode", ["ffn", "layer", "none"])
def test_timeline_ends_at_the_iteration_time(mode):
    cm = cm_for("infinigen", overlap=mode)
    b = BatchShape.decode([1900, 1000, 2000])
    ev = cm.timeline(b)
    assert max(e["end"] for e in ev) == pytest.approx(cm.iteration_time_s(b), rel=1e-12)
    # compute intervals never overlap each other
    comp = sorted((e["start"], e["end"]) for e in ev if e["stream"] == "compute")
    assert all(b0 >= a1 - 1e-15 for (_, a1), (b0, _) in zip(comp, comp[1:]))
    lb = cm.layer_breakdown(b)
    assert lb["block"].shape == (40,) and np.all(lb["transfer_share"] <= 1)


def test_gpu_policy_is_the_roofline():
    base = RooflineCostModel(M13, A6000)
    cm = cm_for("gpu")
    for batch in (
        BatchShape.decode([100, 2000, 640]),
        BatchShape.prefill([512, 128]),
        BatchShape.of([1, 64], [700, 300]),
    ):
        assert cm.iteration_time_s(batch) == pytest.approx(base.iteration_time_s(batch), rel=1e-12)


@pytest.mark.parametrize("policy", ["full", "h2o", "int4", "infinigen"])
def test_decode_stretch_equals_stepping(policy):
    cm = cm_for(policy)
    ctx = np.array([1000, 1500, 37])
    fin = ctx + 300
    cm.bind_final(fin)
    many = cm.decode_step_times_s(ctx, 200)
    for j in (0, 1, 57, 199):
        assert many[j] == cm.time_s(BatchShape.decode(ctx + j), final=fin)  # bit for bit


# ---- sparsity data ----------------------------------------------------------------------------
def test_sparsity_data_reproduces_the_paper_and_interpolates():
    n = SPARSE.mean_tokens([512, 1024, 1536, 2048])
    assert np.allclose(n, [37, 60, 66, 73])
    mid = SPARSE.mean_tokens(768.0)
    assert 37 < mid < 60
    assert SPARSE.mean_tokens(4096.0) > 73  # keeps growing beyond the data
    assert SPARSE.mean_tokens(5.0) <= 5  # never above the context
    with pytest.raises(InfersimError, match="alpha"):
        SparsityModel(load_sparsity("opt-13b"), 7.0)


def test_quality_proxies():
    assert coverage(73, 73, 2048, 0.9) == pytest.approx(0.9)
    assert coverage(2048, 73, 2048, 0.9) == 1.0
    assert coverage(36.5, 73, 2048, 0.9) == pytest.approx(0.45)
    assert coverage(73 + 0.5 * (2048 - 73), 73, 2048, 0.9) == pytest.approx(0.95)
    shape = KVShape.of(M13)
    ig = build_policy("infinigen", {}, shape, SPARSE).proxies(np.array([2048]))
    assert ig["relative_kv_size"][0] < 0.10  # "less than 10% of the KV on average across layers"
    assert ig["relative_kv_size"][0] == pytest.approx((2048 + 39 * 73) / 40 / 2048)
    assert build_policy("int4", {}, shape).proxies(np.array([2048]))["relative_kv_size"][0] == pytest.approx(0.28125)
    h2o = build_policy("h2o", {}, shape, SPARSE).proxies(np.array([2000]), np.array([2048]))
    assert h2o["relative_kv_size"][0] == pytest.approx(409 / 2000)
    full = build_policy("full", {}, shape).proxies(np.array([2048]))
    assert full["attention_mass"][0] == 1.0
    # a CPU pool limit: FIFO loses important tokens, counter and LRU do not (InfiniGen Table 2)
    mass = {
        v: build_policy("infinigen", {"pool_limit": 0.8, "victim": v}, shape, SPARSE).proxies(np.array([2048]))[
            "attention_mass"
        ][0]
        for v in ("fifo", "lru", "counter")
    }
    assert mass["lru"] == mass["counter"]
    assert mass["fifo"] < mass["lru"] - 0.1
    assert ig["attention_mass"][0] - 0.005 < mass["lru"] <= ig["attention_mass"][0]  # only layer 0 loses a little


# ---- registry and YAML --------------------------------------------------------------------------
def _spec(offload, count=24, rate=2.0, seed=5, **serving):
    return WorkloadSpec.model_validate(
        {
            "model": "opt-1.3b",
            "hardware": {"profile": "rtx-a6000", "host_link": "pcie3x16"},
            "serving": serving,
            "requests": requests_section(count, (200, 1500), (8, 60), poisson(rate)),
            "offload": offload,
            "seed": seed,
        }
    )


def test_policy_names_from_yaml_and_one_line_errors(tmp_path):
    from infersim.simulator.workload.builder import load_workload

    f = tmp_path / "w.yaml"
    f.write_text(
        "model: opt-13b\nhardware: {profile: rtx-a6000, host_link: pcie3x16}\n"
        "requests: {count: 2, arrival: {type: burst}, prompt_tokens: {type: fixed, value: 100},\n"
        "  output_tokens: {type: fixed, value: 4}}\n"
        "offload: {policy: FlexGen, params: {}}\n"
    )
    spec, _ = load_workload(str(f))
    setup = build_offload(M13, A6000, spec.offload)
    assert setup.policy.name == "full"
    for name in ("ideal", "h2o", "INT4", "infinigen"):
        build_offload(M13, A6000, OffloadSection(policy=name))
    with pytest.raises(InfersimError) as e:
        build_offload(M13, A6000, OffloadSection(policy="quest"))
    msg = str(e.value)
    assert "\n" not in msg and "quest" in msg
    for known in ("full", "gpu", "h2o", "infinigen", "int4"):
        assert known in msg
    with pytest.raises(InfersimError) as e:
        build_offload(M13, A6000, OffloadSection(policy="h2o", params={"budgte": 0.1}))
    assert "\n" not in str(e.value) and "budget" in str(e.value) and "budgte" in str(e.value)


# ---- serving ----------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["infinigen", "h2o"])
def test_offloading_workload_serves_poisson_arrivals_deterministically(policy):
    spec = _spec({"policy": policy, "sparsity": "opt-13b"})
    a = simulate(spec, build_requests(spec, "."))
    b = simulate(spec, build_requests(spec, "."))
    s = simulate(spec, build_requests(spec, "."), step_mode=True)
    assert (a.requests["aborted"] == 0).all() and len(a.requests["finish_s"]) == 24
    assert np.all(a.requests["finish_s"] > a.requests["first_token_s"])
    for col in a.requests:
        assert np.array_equal(a.requests[col], b.requests[col], equal_nan=True), col
        assert np.array_equal(a.requests[col], s.requests[col], equal_nan=True), col
    assert a.sim_time_s == b.sim_time_s == s.sim_time_s
    off = a.extra["offload"]
    assert off["policy"] == policy and off["kv_loaded_gb"] > 0 and 0 < off["relative_kv_size"] < 0.5


def test_offload_slows_serving_and_the_pool_is_host_memory():
    res = {
        p: simulate(_spec({"policy": p}), build_requests(_spec({"policy": p}), "."))
        for p in ("gpu", "full", "infinigen")
    }
    # the same requests: full offload is slowest, the GPU fastest, InfiniGen between
    end = {p: r.sim_time_s for p, r in res.items()}
    assert end["gpu"] < end["infinigen"] < end["full"]
    # full offload: the pool is 96 GB x 0.9 of host memory over the KV of a token, in blocks of 16
    m = load_model("opt-1.3b")
    tokens = 96e9 * 0.9 / m.bytes_kv_per_token("fp16")
    assert res["full"].memory.gpu_blocks == int(tokens // 16)
    assert res["full"].extra["offload"]["memory"]["bound_by"] == "cpu"
    sim = Simulation(_spec({"policy": "full"}), build_requests(_spec({"policy": "full"}), "."))
    rep = sim.replicas[0]
    assert rep.blocks.total_gpu == int(tokens // 16) and rep.blocks.total_cpu == 0
    assert isinstance(rep.cost, OffloadCostModel)


def test_host_memory_bounds_the_batch():
    """With a small host, the pool (not the GPU) caps concurrency."""
    spec = _spec({"policy": "full", "cpu_memory_gb": 1.0, "cpu_memory_utilization": 1.0}, rate=50.0)
    r = simulate(spec, build_requests(spec, "."))
    m = load_model("opt-1.3b")
    pool_tokens = r.memory.gpu_blocks * 16
    assert pool_tokens == int(1e9 / m.bytes_kv_per_token("fp16") // 16) * 16
    assert r.metrics.peak["gpu_blocks_used"] <= r.memory.gpu_blocks
    assert (r.requests["aborted"] == 0).all()


# ---- the paper's findings that hold in the model ---------------------------------------------------
@pytest.fixture(scope="module")
def lab():
    from infersim.analysis.reproduce.infinigen import Lab, sections

    return Lab(sections("model"))


def test_finding_full_offload_is_dominated_by_transfer(lab):
    blk = lab.block("flexgen", batch=8)
    assert blk["transfer_share"] > 0.9  # paper: 96.9%
    assert lab.block("h2o", batch=8)["transfer_share"] > 0.9  # paper: 91.8%
    assert lab.block("infinigen", batch=8)["block"] < lab.block("h2o", batch=8)["block"] < blk["block"]


def test_finding_infinigen_speedup_grows_with_length_others_saturate(lab):
    sp = {s: [] for s in ("int4", "h2o", "infinigen")}
    for L in (512, 1024, 1536, 2048):
        full = lab.run("flexgen", 8, L - 128)["total_s"]
        for s in sp:
            sp[s].append(full / lab.run(s, 8, L - 128)["total_s"])
    ig = np.array(sp["infinigen"])
    assert np.all(np.diff(ig) > 0) and ig[-1] > ig[0] * 1.5
    last = {s: v[-1] / v[-2] - 1 for s, v in sp.items()}
    assert last["infinigen"] > 2 * last["h2o"] and last["infinigen"] > 2 * last["int4"]
    assert last["h2o"] < 0.05 and last["int4"] < 0.05  # saturated
    assert ig[-1] > sp["h2o"][-1] > sp["int4"][-1] > 1  # paper's order: 5.28 > 3.40 > 1.92


def test_finding_batching_helps_infinigen_most(lab):
    gain = {s: lab.run(s, 20)["throughput"] / lab.run(s, 4)["throughput"] for s in ("int4", "h2o", "infinigen")}
    assert gain["infinigen"] > gain["h2o"] and gain["infinigen"] > gain["int4"]
    assert gain["infinigen"] > 1.15


def test_kv_shape_counts_int4_group_scales_in_weights():
    # InfiniGen's partial query weights are read as stored: 0.5 bytes per weight plus one fp16
    # scale and one 4-bit zero point per group of 128, while the KV cache stays 16-bit
    int4 = KVShape.of(M13, "int4")
    assert int4.w_bytes == pytest.approx(0.5 + 2.5 / 128)
    assert int4.kv_bytes == 2.0 and int4.a_bytes == 2.0
    assert KVShape.of(M13).w_bytes == 2.0
