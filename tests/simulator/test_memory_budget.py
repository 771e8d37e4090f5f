"""The KV budget as vLLM computes it: the total the driver reports x gpu_memory_utilization,
less the weights, the activation peak and the non-torch reserve; checked against vLLM's own
log and hand calculations."""

import pytest

from infersim.cli.main import main
from infersim.simulator.engine.memory import VLLM_NON_TORCH_RESERVE_GIB, plan_memory
from infersim.simulator.hardware.catalog import load_hardware
from infersim.simulator.models.catalog import load_model
from infersim.simulator.simulation import Simulation
from infersim.simulator.workload.builder import build_requests
from infersim.simulator.workload.schema import WorkloadSpec
from tests.utils import memory_options, one_line_error, requests_section, write_yaml

GIB = 2**30
LLAMA3_8B_PARAMS = 8_030_261_248
LLAMA3_70B_PARAMS = 70_553_706_496


def test_llama3_8b_tp1_on_h100_reproduces_vllms_log():
    """vLLM's log for Meta-Llama-3-8B on an H100 at TP 1 (https://github.com/vllm-project/vllm/pull/10511):
    total_gpu_memory 79.22 GiB x 0.90 = 71.29 GiB; weights 14.96 GiB; non_torch_memory 1.79 GiB;
    activation peak 1.26 GiB; KV cache 53.29 GiB. Given that log's 1.79 GiB reserve, our plan
    differs from its KV cache only by our activation estimate: (4 x 4,096 + 2 x 14,336) x 2 bytes
    for each of 8,192 batched tokens plus 256 fp32 logit rows of 128,256 = 0.81 GiB against
    vLLM's measured 1.26 GiB, so our KV cache is 0.45 GiB larger (53.74 GiB)."""
    m, h100 = load_model("llama-3-8b"), load_hardware("h100-sxm")
    opts = memory_options(dtype="bf16", kv_dtype="bf16", max_batched_tokens=8192, non_torch_reserve_gib=1.79)
    plan = plan_memory(m, h100, opts)
    weights = LLAMA3_8B_PARAMS * 2
    act = 8192 * (4 * 4096 + 2 * 14336) * 2 + 256 * 128256 * 4
    block = 16 * 32 * 2 * 8 * 128 * 2  # tokens x layers x K,V x KV heads x head dim x bf16: 2 MiB
    assert plan.weight_bytes_per_gpu / GIB == pytest.approx(14.96, abs=0.005)
    assert plan.activation_bytes_per_gpu == act and act / GIB == pytest.approx(0.81, abs=0.005)
    assert plan.gpu_blocks == int((79.22 * GIB * 0.9 - 1.79 * GIB - weights - act) // block) == 27515
    kv_gib = plan.gpu_blocks * block / GIB
    assert kv_gib == pytest.approx(53.29 + (1.26 - act / GIB), abs=0.01)  # 53.74 GiB
    assert plan.non_torch_reserve_bytes == 1.79 * GIB and plan.memory_bytes_per_gpu == 79.22 * GIB


def test_llama3_70b_tp4_on_a100_by_hand():
    """Llama-3-70B fp16 at TP 4 on A100-80GB SXM with the defaults: 79.25 GiB x 0.9 less the
    0.25 GiB reserve (76.32 GB), less 35.28 GB of weights per GPU and the activation peak of
    8,192 batched tokens ((4 x 8,192 + 2 x 28,672 / 4) x 2 bytes each, plus 256 fp32 logit rows
    of 128,256: 0.90 GB), over 1.31 MB blocks (16 tokens x 80 layers x K,V x 2 of 8 KV heads x
    128 x 2 bytes): 30,621 blocks, 489,936 tokens."""
    m, a100 = load_model("llama-3-70b"), load_hardware("a100-80gb-sxm")
    plan = plan_memory(m, a100, memory_options(tp=4, max_batched_tokens=8192))
    act = 8192 * (4 * 8192 + 2 * 28672 / 4) * 2 + 256 * 128256 * 4
    block = 16 * 80 * 2 * 2 * 128 * 2
    usable = 79.25 * GIB * 0.9 - VLLM_NON_TORCH_RESERVE_GIB * GIB
    assert plan.gpu_blocks == int((usable - LLAMA3_70B_PARAMS * 2 / 4 - act) // block) == 30621


def test_a_profile_without_the_visible_total_keeps_its_datasheet_figure():
    """The A40 profile gives no driver-visible total: its budget starts from memory_gb x 1e9,
    bit for bit the pool of the plan before the reserve existed when the reserve is 0, and that
    pool less 0.25 GiB of blocks by default."""
    m, a40 = load_model("llama-2-7b"), load_hardware("a40")
    assert a40.memory_visible_gib is None and a40.memory_bytes() == 48e9
    weights, block = m.weight_bytes_per_gpu(1, "fp16"), m.bytes_kv_per_block_per_gpu(16, 1, "fp16")
    act = memory_options().activation_bytes(m)
    before = int((48e9 * 0.9 - weights - act) // block)
    assert plan_memory(m, a40, memory_options(non_torch_reserve_gib=0.0)).gpu_blocks == before
    assert plan_memory(m, a40, memory_options()).gpu_blocks == int((48e9 * 0.9 - 0.25 * GIB - weights - act) // block)


def test_a_cpu_profile_reserves_nothing():
    m, cpu = load_model("opt-125m"), load_hardware("cpu-reference")
    plan = plan_memory(m, cpu, memory_options(max_batched_tokens=2048, max_batch_size=16))
    assert cpu.device == "cpu" and plan.non_torch_reserve_bytes == 0.0


def _spec(**serving) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {
            "model": "llama-3-8b",
            "hardware": {"profile": "h100-sxm"},
            "serving": {"max_batch_size": 64, **serving},
            "requests": requests_section(4, 200, 20),
        }
    )


def test_the_user_overrides_the_reserve_and_the_run_records_it():
    """serving.non_torch_reserve_gib replaces vLLM's 0.25 GiB: one more GiB reserved is 512 fewer
    2 MiB blocks; config.yaml's memory section records the reserve and the total."""
    default = Simulation(_spec(), build_requests(_spec(), ".")).resolved()["memory"]
    spec = _spec(non_torch_reserve_gib=1.25)
    mem = Simulation(spec, build_requests(spec, ".")).resolved()["memory"]
    assert (
        default["non_torch_reserve_bytes_per_gpu"] == 0.25 * GIB
        and mem["non_torch_reserve_bytes_per_gpu"] == 1.25 * GIB
    )
    assert default["memory_bytes_per_gpu"] == mem["memory_bytes_per_gpu"] == 79.22 * GIB
    assert default["gpu_blocks"] - mem["gpu_blocks"] in (511, 512, 513)


def test_a_negative_reserve_is_refused(tmp_path, capsys):
    wl = write_yaml(
        tmp_path / "w.yaml",
        {**_spec().model_dump(mode="json", exclude_unset=True), "serving": {"non_torch_reserve_gib": -1}},
    )
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "out"), "-q", "--no-plots"]) == 2
    err = one_line_error(capsys)
    assert "w.yaml" in err and "serving.non_torch_reserve_gib" in err
