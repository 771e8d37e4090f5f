"""The hardware catalog: every profile loads, numbers match the reference table, host links
are per direction and can be overridden, and bad input gives one-line errors."""

import json
import re

import pytest
import yaml

from infersim.cli.main import main
from infersim.simulator.costmodel import BatchShape, RooflineCostModel
from infersim.simulator.errors import InfersimError, UnknownNameError
from infersim.simulator.hardware.catalog import list_hardware, list_host_links, load_hardware, load_host_link
from infersim.simulator.models.catalog import load_model
from infersim.simulator.paths import hwprofiles_dir

EXPECTED = {
    "a100-80gb-pcie",
    "a100-80gb-sxm",
    "a100-40gb",
    "a800-80gb-pcie",
    "a40",
    "rtx-a6000",
    "h100-sxm",
    "h100-pcie",
    "h200",
    "l40",
    "v100",
    "l4",
    "l40s",
    "a10",
    "t4",
    "rtx-4090",
    "b200",
    "mi300x",
    "h20",
}

# (fp16 TFLOP/s, memory GB/s, memory GB) from the NVIDIA datasheets each profile cites
FACTS = {
    "a100-80gb-pcie": (312, 1935, 80),
    "a100-80gb-sxm": (312, 2039, 80),
    "a100-40gb": (312, 1555, 40),
    "a800-80gb-pcie": (312, 1935, 80),
    "a40": (149.7, 696, 48),
    "rtx-a6000": (154.8, 768, 48),
    "h100-sxm": (989.5, 3350, 80),
    "h100-pcie": (756.5, 2048, 80),
    "h200": (989.5, 4800, 141),
    "l40": (181, 864, 48),
    "v100": (112, 900, 32),
    # the inference cards: dense halves of the sparsity figures where the datasheet prints those
    "l4": (121, 300, 24),
    "l40s": (362.05, 864, 48),
    "a10": (125, 600, 24),
    "t4": (65, 320, 16),
    "rtx-4090": (165.2, 1008, 24),  # FP16 with FP32 accumulate (Ada whitepaper, Appendix A)
    "b200": (2250, 7700, 180),
    "mi300x": (1307.4, 5300, 192),
    "h20": (148, 4000, 96),  # no NVIDIA datasheet: NVIDIA's figures as listings report them
}


def test_every_required_profile_exists():
    assert EXPECTED <= set(list_hardware())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_loads_and_matches_facts(name):
    hw = load_hardware(name)
    assert hw.name == name and hw.source and hw.aliases
    fp16, bandwidth, memory = FACTS[name]
    assert hw.peak_tflops["fp16"] == pytest.approx(fp16, rel=1e-3)
    assert hw.memory_bandwidth_gbps == bandwidth
    assert hw.memory_gb == memory
    assert hw.peak_tflops["fp32"] < hw.peak_tflops["fp16"]
    # Uncalibrated classes are the datasheet roofline; published or derived ones cite a URL. No invented overheads.
    for op in ("linear", "attention", "elementwise", "communication"):
        eff = hw.efficiency_for(op)
        if eff.confidence == "datasheet":
            assert eff.compute == 1.0 and eff.memory == 1.0
        else:
            assert "https://" in eff.source and 0 < eff.compute <= 1 and 0 < eff.memory <= 1
    assert hw.overheads.kernel_launch_us == 0
    # an engine overhead only where fitted on published runs, which the source names
    assert hw.overheads.iteration_us == hw.overheads.tp_worker_us == 0 or "https://" in hw.overheads.source
    assert hw.host_link.source and hw.interconnect is not None and hw.interconnect.source
    assert {"peak_tflops", "memory_bandwidth_gbps", "memory_gb"} <= set(hw.sources)


def test_a100_80gb_pcie_matches_facts():
    hw = load_hardware("a100")
    assert hw.name == "a100-80gb-pcie"
    assert hw.peak_flops("fp16") == 312e12 and hw.peak_flops("bf16") == 312e12
    assert hw.peak_flops("int8") == 624e12
    assert hw.memory_bandwidth_bytes_per_s() == 1935e9
    assert hw.memory_gb == 80
    # the budget starts from the 79.25 GiB torch reports on an 80 GB A100, not 80e9 bytes
    assert hw.memory_bytes() == 79.25 * 2**30 and "https://" in hw.sources["memory_visible_gib"]
    assert hw.host_link.name == "PCIe 4.0 x16"
    # 75-85% of 31.5 GB/s per direction
    assert 0.75 * 31.5 <= hw.host_link.h2d_gbps <= 0.85 * 31.5
    assert 0.75 * 31.5 <= hw.host_link.d2h_gbps <= 0.85 * 31.5


@pytest.mark.parametrize("name, gen_gbps", [("rtx-a6000", 31.5), ("h100-sxm", 63.0), ("v100", 15.75)])
def test_host_link_matches_pcie_generation(name, gen_gbps):
    link = load_hardware(name).host_link
    assert 0.75 * gen_gbps <= link.h2d_gbps <= 0.85 * gen_gbps


def test_nvlink_per_direction():
    assert load_hardware("a100-80gb-sxm").interconnect.bandwidth_gbps == 300
    assert load_hardware("h100-sxm").interconnect.bandwidth_gbps == 450
    assert load_hardware("h200").interconnect.bandwidth_gbps == 450


def test_h2d_and_d2h_are_separate_fields(tmp_path):
    data = yaml.safe_load((hwprofiles_dir() / "a100-80gb-pcie.yaml").read_text())
    data["host_link"].update(h2d_gbps=12.89, d2h_gbps=0.97)  # FlexGen's asymmetric T4 host
    path = tmp_path / "asym.yaml"
    path.write_text(yaml.safe_dump(data))
    link = load_hardware(str(path)).host_link
    assert (link.h2d_gbps, link.d2h_gbps) == (12.89, 0.97)


def test_host_link_override():
    base = load_hardware("rtx-a6000")
    infinigen = load_hardware("a6000", host_link="pcie3x16")
    assert infinigen.host_link.name == "PCIe 3.0 x16"
    assert infinigen.host_link.h2d_gbps == pytest.approx(0.8 * 15.75)
    assert infinigen.host_link.h2d_gbps < base.host_link.h2d_gbps
    # Only the host link changes, and the cached profile is untouched.
    assert infinigen.peak_tflops == base.peak_tflops
    assert load_hardware("rtx-a6000").host_link.name == "PCIe 4.0 x16"
    assert load_hardware("a6000", host_link="PCIe-3-x16").host_link == infinigen.host_link


def test_host_link_presets():
    assert set(list_host_links()) == {"pcie3x16", "pcie4x16", "pcie5x16"}
    speeds = [load_host_link(n).h2d_gbps for n in ("pcie3x16", "pcie4x16", "pcie5x16")]
    assert speeds == sorted(speeds) and all(load_host_link(n).source for n in list_host_links())


def test_loaded_profiles_are_independent_copies():
    hw = load_hardware("h100")
    hw.memory_gb = 1
    assert load_hardware("h100").memory_gb == 80


@pytest.mark.parametrize(
    "alias, name",
    [
        ("a100", "a100-80gb-pcie"),
        ("A100-80GB-PCIe", "a100-80gb-pcie"),
        ("a6000", "rtx-a6000"),
        ("h100", "h100-sxm"),
        ("H200", "h200"),
    ],
)
def test_aliases(alias, name):
    assert load_hardware(alias).name == name


def test_unknown_profile_lists_known():
    with pytest.raises(UnknownNameError) as err:
        load_hardware("tpu-v5")
    assert err.value.known == sorted(list_hardware())
    assert "a100-80gb-pcie" in str(err.value)


def test_unknown_host_link_lists_presets():
    with pytest.raises(UnknownNameError) as err:
        load_hardware("a100", host_link="pcie7x16")
    assert "pcie3x16" in str(err.value) and "pcie7x16" in str(err.value)


def test_malformed_yaml_names_the_file(tmp_path):
    bad = tmp_path / "gpu.yaml"
    bad.write_text("name: g\npeak_tflops: {fp16: 1\n")
    with pytest.raises(InfersimError) as err:
        load_hardware(str(bad))
    assert str(bad) in str(err.value) and "malformed YAML" in str(err.value)


def test_wrong_typed_field_names_the_file_and_field(tmp_path):
    data = yaml.safe_load((hwprofiles_dir() / "a40.yaml").read_text())
    data["host_link"]["d2h_gbps"] = "fast"
    bad = tmp_path / "a40-typo.yaml"
    bad.write_text(json.dumps(data))
    with pytest.raises(InfersimError) as err:
        load_hardware(str(bad))
    msg = str(err.value)
    assert str(bad) in msg and "host_link.d2h_gbps" in msg and "\n" not in msg


def test_missing_profile_path(tmp_path):
    with pytest.raises(InfersimError, match="file not found"):
        load_hardware(str(tmp_path / "none.yaml"))


@pytest.mark.parametrize(
    "name, compute, confidence, paper",
    [
        ("a100-80gb-sxm", 0.73, "published", "arxiv.org/abs/2307.08691"),  # FlashAttention-2: 230 of 312 TFLOP/s
        ("h100-sxm", 0.75, "published", "arxiv.org/abs/2407.08608"),  # FlashAttention-3: 740 of 989 TFLOP/s
        ("a40", 0.73, "derived", "arxiv.org/abs/2307.08691"),  # the A100's numbers, said so
    ],
)
def test_attention_efficiencies_load_with_their_citations(name, compute, confidence, paper):
    eff = load_hardware(name).efficiency_for("attention")
    assert (eff.compute, eff.memory, eff.confidence) == (compute, 0.8, confidence)
    assert paper in eff.source and "arxiv.org/abs/2309.06180" in eff.source  # vLLM's paged-kernel overhead


# ---- the inference cards ---------------------------------------------------------------------
# Llama-3-8B: 8,030,261,248 parameters (embedding and lm_head 128,256 x 4,096 each, 32 layers of
# q/o 4,096^2, k/v 4,096 x 1,024, gate/up/down 4,096 x 14,336, two norms, the final norm). A decode
# step reads every weight once except the embedding table, of which it gathers one row.
LLAMA3_8B_PARAMS = 2 * 128256 * 4096 + 32 * (2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 4096
LLAMA3_8B_DECODE_WEIGHT_BYTES = 2 * (LLAMA3_8B_PARAMS - 128256 * 4096 + 4096)


@pytest.mark.parametrize("card, bandwidth_gbps", [("l4:datasheet", 300), ("mi300x", 5300)])
def test_batch_one_decode_is_the_weight_read_at_the_card_bandwidth(card, bandwidth_gbps):
    """Llama-3-8B decodes one token at batch 1 in (weights read) / bandwidth: 15.01 GB / 300 GB/s
    = 50.0 ms on an L4, / 5.3 TB/s = 2.83 ms on an MI300X (the KV cache of 17 tokens and the
    activations add under 0.1%)."""
    assert LLAMA3_8B_PARAMS == 8_030_261_248
    hw = load_hardware(card)
    cost = RooflineCostModel(load_model("llama-3-8b"), hw)
    step_s = cost.iteration_time_s(BatchShape.decode([16]))
    assert step_s == pytest.approx(LLAMA3_8B_DECODE_WEIGHT_BYTES / (bandwidth_gbps * 1e9), rel=2e-3)
    # every operator that moves bytes is memory-bound (the fused softmax moves none: picoseconds of FLOPs)
    assert all(row.bound == "memory" for row in cost.breakdown(BatchShape.decode([16])) if row.bytes)


def test_l4_and_mi300x_decode_in_the_ratio_of_their_bandwidths():
    model, batch = load_model("llama-3-8b"), BatchShape.decode([16])
    l4 = RooflineCostModel(model, load_hardware("l4:datasheet")).iteration_time_s(batch)
    mi300x = RooflineCostModel(model, load_hardware("mi300x")).iteration_time_s(batch)
    assert l4 / mi300x == pytest.approx(5300 / 300, rel=1e-6)  # all but the fused softmax's picoseconds


@pytest.mark.parametrize(
    "name, kind, inherits",
    [
        ("l4", "derived", "a40"),
        ("l40s", "derived", "a40"),
        ("a10", "derived", "a40"),
        ("t4", "derived", "a40"),
        ("rtx-4090", "derived", "a40"),
        ("b200", "derived", "h100-sxm"),
        ("h20", "derived", "h100-sxm"),
        ("mi300x", "datasheet", None),
    ],
)
def test_inference_cards_inherit_a_measured_card_or_stay_datasheet(name, kind, inherits):
    hw = load_hardware(name)
    assert hw.mode == kind
    if inherits:
        assert hw.calibration.inherits == inherits and hw.calibration.gemm is not None and hw.calibration.why
    else:
        assert hw.calibration is None
    # every figure cites a public URL
    assert all("https://" in hw.sources[k] for k in ("peak_tflops", "memory_bandwidth_gbps", "memory_gb"))


def test_sim_hardware_lists_the_inference_cards_with_their_kind(capsys):
    assert main(["hardware"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for name, kind in [("l4", "derived from a40"), ("b200", "derived from h100-sxm"), ("mi300x", "datasheet")]:
        assert re.search(rf"\b{re.escape(name)}\b.*?{re.escape(kind)}", out), (name, out)


def test_sim_hardware_names_a_missing_sm_count(capsys):
    """The L4's datasheet gives no SM count: the measured GEMM shapes of its parent are not used, and
    `sim hardware l4` says why without printing a null."""
    assert main(["hardware", "l4"]) == 0
    out = capsys.readouterr().out
    assert "not inherited (no SM count in the profile, not a40's" in out and "None" not in out
