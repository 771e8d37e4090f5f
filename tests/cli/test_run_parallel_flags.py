"""`sim run --tp/--replicas/--dtype`: a planner sizes a deployment from the command line, without
editing the workload file; the KV pool follows the hand calculation, and a size that cannot
hold the weights is refused in one line."""

import json
from pathlib import Path

import yaml

from infersim.cli.main import main
from tests.utils import one_line_error, poisson, requests_section, write_yaml

WORKLOAD = {
    "name": "chat-70b",
    "model": "llama-3-70b",
    "hardware": {"profile": "h100-sxm"},
    "requests": requests_section(20, 500, 50, poisson(2.0)),
    "seed": 0,
}


def _workload(tmp_path):
    return write_yaml(tmp_path / "chat-70b.yaml", WORKLOAD)


def test_70b_on_one_h100_is_refused_and_tp4_fits(tmp_path, capsys):
    wl = _workload(tmp_path)
    out = tmp_path / "r"
    assert main(["run", "-w", str(wl), "-o", str(out), "-q", "--no-plots"]) == 2
    err = one_line_error(capsys)
    assert "chat-70b.yaml" in err and "hardware.tensor_parallel" in err and "141.1 GB" in err
    assert not out.exists()

    assert main(["run", "-w", str(wl), "-o", str(out), "-q", "--no-plots", "--tp", "4", "--replicas", "2"]) == 0
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["workload"]["hardware"]["tensor_parallel"] == 4
    assert config["workload"]["hardware"]["replicas"] == 2
    # KV pool by hand: the 79.22 GiB the driver reports x 0.9, less vLLM's 0.25 GiB non-torch
    # reserve, less a quarter of the 70.55B fp16 weights, less the
    # activation peak (8,192 batched tokens x (4 x 8,192 + 2 x 28,672 / 4) x 2 bytes, plus
    # 256 sequences x 128,256 fp32 logits), over a block of 16 tokens x 80 layers x K and V x
    # 2 KV heads per GPU x 128 x 2 bytes
    weights = 70_553_706_496 * 2 / 4
    act = 8192 * (4 * 8192 + 2 * 28672 / 4) * 2 + 256 * 128256 * 4
    block = 16 * 80 * 2 * 2 * 128 * 2
    summary = json.loads((out / "summary.json").read_text())
    usable = 79.22 * 2**30 * 0.9 - 0.25 * 2**30
    assert summary["gpu_blocks"] == int((usable - weights - act) // block) == 30599
    assert summary["finished"] == 20


def test_dtype_flag_halves_weights_and_is_checked_against_the_card(tmp_path, capsys):
    wl = _workload(tmp_path)
    out = tmp_path / "r"
    assert main(["run", "-w", str(wl), "-o", str(out), "-q", "--no-plots", "--tp", "2", "--dtype", "fp8"]) == 0
    config = yaml.safe_load((out / "config.yaml").read_text())
    # one byte per layer weight, two for the embedding, final norm and LM head (2 x 128,256 x 8,192
    # + 8,192), over 2 GPUs
    edges = 2 * 128_256 * 8_192 + 8_192
    assert config["memory"]["weight_bytes_per_gpu"] == (70_553_706_496 + edges) / 2
    assert config["workload"]["serving"]["dtype"] == "fp8"
    args = ["run", "-w", str(wl), "-o", str(tmp_path / "a"), "-q", "--tp", "4", "--hardware", "v100"]
    assert main([*args, "--dtype", "fp8"]) == 2
    err = one_line_error(capsys)
    assert "field 'serving.dtype': vLLM refuses fp8 weights for model" in err and "'v100'" in err
    assert main([*args, "--dtype", "int3"]) == 2
    assert "--dtype: unknown dtype 'int3'" in one_line_error(capsys)


def test_kv_dtype_flag_sets_the_cache_fp8_weights_leave_16_bit(tmp_path, capsys):
    """Llama-3-70B in fp8 at TP 4 on H100: 18.16 GB of weights per GPU. The cache stays 16-bit by
    default (vLLM's --kv-cache-dtype auto): 655,360-byte blocks, 43,655 of them; `--kv-dtype fp8`
    (vLLM's --kv-cache-dtype fp8) halves the block and doubles the pool to 87,311."""
    wl = _workload(tmp_path)
    weights = (70_553_706_496 + 2 * 128_256 * 8_192 + 8_192) / 4
    act = 8192 * (4 * 8192 + 2 * 28672 / 4) * 2 + 256 * 128256 * 4
    usable = 79.22 * 2**30 * 0.9 - 0.25 * 2**30
    for flags, kv_bytes, blocks in (([], 2, 43_655), (["--kv-dtype", "fp8"], 1, 87_311)):
        out = tmp_path / f"kv{kv_bytes}"
        assert (
            main(["run", "-w", str(wl), "-o", str(out), "-q", "--no-plots", "--tp", "4", "--dtype", "fp8", *flags]) == 0
        )
        memory = yaml.safe_load((out / "config.yaml").read_text())["memory"]
        block = 16 * 80 * 2 * 2 * 128 * kv_bytes
        assert memory["weight_bytes_per_gpu"] == weights and memory["kv_bytes_per_block"] == block
        assert memory["gpu_blocks"] == int((usable - weights - act) // block) == blocks
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "bad"), "-q", "--tp", "4", "--kv-dtype", "int3"]) == 2
    assert "--kv-dtype: unknown dtype 'int3'" in one_line_error(capsys)


def test_tp_that_does_not_split_the_heads_is_refused(tmp_path, capsys):
    wl = _workload(tmp_path)
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "r"), "-q", "--tp", "3"]) == 2
    assert "tensor parallel 3 does not divide llama-3-70b's 64 attention heads" in one_line_error(capsys)
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "r"), "-q", "--tp", "0"]) == 2
    assert "--tp: expected a whole number >= 1, got 0" in one_line_error(capsys)
    assert not (tmp_path / "r").exists()


def test_summary_title_counts_gpus_not_replicas():
    from infersim.cli.run import deployment_line, gpus_line
    from infersim.simulator.paths import hwprofiles_dir
    from infersim.simulator.workload.builder import load_workload

    assert gpus_line(1, "h100-sxm", 4) == "4 x h100-sxm (1 replica, tp=4)"
    assert gpus_line(2, "h100-sxm", 4) == "8 x h100-sxm (2 replicas, tp=4)"
    assert gpus_line(1, "h100-sxm", 8, pp=2) == "16 x h100-sxm (1 replica, tp=8, pp=2)"
    spec, _ = load_workload(str(Path(__file__).resolve().parents[2] / "examples/disaggregation/disaggregated-7b.yaml"))
    assert deployment_line(spec) == (
        "1 x a100-80gb-pcie prefill (1 replica, tp=1) + 2 x a100-80gb-pcie decode (2 replicas, tp=1)"
    )
    # a profile is named by its name, not by how the workload spelled it (an alias, a file path)
    aliased = spec.model_copy(
        update={"hardware": spec.hardware.model_copy(update={"profile": "h100", "disaggregated": None})}
    )
    assert deployment_line(aliased) == "1 x h100-sxm (1 replica, tp=1)"
    by_path = aliased.model_copy(
        update={
            "hardware": aliased.hardware.model_copy(
                update={"profile": str(hwprofiles_dir() / "a40.yaml") + ":datasheet"}
            )
        }
    )
    assert deployment_line(by_path) == "1 x a40:datasheet (1 replica, tp=1)"


def test_disaggregated_summary_gives_kv_use_per_pool():
    """A TP 8 prefill pool and a TP 4 decode pool hold different KV pools: the line gives each
    pool its own batch size and KV use instead of one percentage of the decode pool's size."""
    from infersim.cli.run import batch_and_kv_line

    pools = {
        "prefill": {"batch_size_mean_busy": 1.14, "kv_utilization_mean_busy": 0.001, "gpu_blocks": 81750},
        "decode": {"batch_size_mean_busy": 36.23, "kv_utilization_mean_busy": 0.0743, "gpu_blocks": 27328},
    }
    assert batch_and_kv_line({"disaggregation": {"pools": pools}, "iterations": 4115}) == (
        "prefill pool: batch size mean 1.1, KV use mean 0.1% of 81,750 GPU blocks per replica; "
        "decode pool: batch size mean 36.2, KV use mean 7.4% of 27,328 GPU blocks per replica; 4115 iterations"
    )


def test_latencies_past_a_second_are_written_without_exponents():
    """A long-context TTFT of 144.6 s reads '144,565' ms in the summary table (it read '1.45e+05')."""
    from infersim.cli.run import no_exponent

    assert no_exponent(144565.27) == "144,565"
    assert no_exponent(57.14) == "57.1"
    assert no_exponent(0.000611) == "0.000611"
    assert no_exponent(20910.4, 4, thousands="") == "20910"  # the roofline's narrow columns


def test_a_tensor_parallel_group_across_nodes_is_named_in_the_summary(tmp_path, capsys):
    """TP 16 on 8-GPU nodes runs (its all-reduces priced on the network) and the terminal says
    that the group spans 2 nodes; TP 8 inside one node prints no such note."""
    wl = _workload(tmp_path)
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "a"), "--no-plots", "--tp", "16", "-n", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "note: the tensor-parallel group of 16 GPUs spans 2 nodes of 8: its all-reduces cross the" in out
    config = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())
    assert config["parallel"]["tp_group_crosses_nodes"] is True
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "b"), "--no-plots", "--tp", "8", "-n", "2"]) == 0
    assert "spans" not in capsys.readouterr().out


def test_tensor_parallel_on_a_profile_without_an_interconnect_is_refused(tmp_path, capsys):
    """cpu-reference gives no interconnect and no measured all-reduce: TP 2 there, colocated or
    in a disaggregated pool, is one line naming the field, before any work (was a traceback
    from the first iteration)."""
    base = {"model": "llama-68m", "requests": requests_section(2, 10, 4), "seed": 0}
    wl = write_yaml(tmp_path / "cpu.yaml", {**base, "hardware": {"profile": "cpu-reference", "tensor_parallel": 2}})
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "a"), "-q", "--no-plots"]) == 2
    err = one_line_error(capsys)
    assert "cpu.yaml: field 'hardware.tensor_parallel': tensor parallel 2 needs an interconnect" in err
    assert "'cpu-reference'" in err and not (tmp_path / "a").exists()
    pools = {"prefill": {"profile": "cpu-reference", "tensor_parallel": 2}}
    wl = write_yaml(tmp_path / "dis.yaml", {**base, "hardware": {"profile": "a100-80gb-sxm", "disaggregated": pools}})
    assert main(["run", "-w", str(wl), "-o", str(tmp_path / "b"), "-q", "--no-plots"]) == 2
    assert "field 'hardware.disaggregated.prefill.tensor_parallel': tensor parallel 2 needs" in one_line_error(capsys)
    assert not (tmp_path / "b").exists()
