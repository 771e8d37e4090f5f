"""What the executor's KV pools take on a GPU and in host memory, computed with real cards'
numbers (an H200: torch.cuda.mem_get_info total 150,109,880,320 B; an H100: 85,045,002,240 B;
both hosts 128 GiB), and the pools' tensors sized to the workload on this CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infersim.executor.kv_memory import (
    allocated_blocks,
    check_pools_fit,
    pinned_bytes,
    pool_sizes,
    workload_blocks,
)
from infersim.simulator.errors import InfersimError
from infersim.simulator.workload.schema import ServingSection
from tests.utils import poisson, requests_section

H200_BYTES, H100_BYTES = 150_109_880_320, 85_045_002_240
HOST_128_GIB = 128 * 2**30
# a 128 GiB host's MemAvailable before a run: the kernel, the driver and the interpreter hold some
HOST_AVAILABLE = 125 * 2**30

# zoo-target (3 layers, 2 KV heads of 32) in fp16, as the validation serves it on CUDA:
# K and V x 3 layers x 16 tokens x 2 heads x 32 x 2 B
ZOO_TARGET = SimpleNamespace(
    num_attention_heads=6, num_key_value_heads=2, head_dim=32, num_hidden_layers=3, hidden_size=192
)
BLOCK_BYTES = 12_288
# the offload cases' host pool when derived from the card: (total x 0.9 - 0.25 GiB) // 12,288 B
PLANNED = {"H200": (H200_BYTES, 10_972_530), "H100": (H100_BYTES, 6_207_036)}
# two requests, prompts 256 and 768 with 64 outputs: 20 + 1 and 52 + 1 blocks at 16 tokens
TWO_REQUESTS = ([256, 768], [64, 64])
TWO_REQUESTS_BLOCKS = 74
# two requests of 40 + 4 tokens served with the KV in host memory
OFFLOAD_SMALL = {
    "name": "offload-small",
    "model": "zoo-target",
    "seed": 5,
    "serving": {"max_batch_size": 2, "dtype": "fp32"},
    "requests": requests_section(2, 40, 4, poisson(400.0)),
    "offload": {"policy": "full", "overlap": "none"},
}


def test_block_bytes_and_the_workload_bound_by_hand():
    from infersim.executor.serving import kv_block_bytes

    assert kv_block_bytes(ZOO_TARGET, 16, 2) == BLOCK_BYTES
    assert workload_blocks(*TWO_REQUESTS, 16) == TWO_REQUESTS_BLOCKS
    assert allocated_blocks(10, None) == 10 and allocated_blocks(10, 3) == 3 and allocated_blocks(2, 3) == 2
    assert allocated_blocks(0, 3) == 0  # no swap space: no host pool
    # torch's caching host allocator rounds a pinned tensor up to a power of two
    assert (pinned_bytes(454_656), pinned_bytes(524_288), pinned_bytes(0)) == (524_288, 524_288, 0)


@pytest.mark.parametrize("card", sorted(PLANNED))
def test_an_offload_case_planned_from_the_card_allocates_the_workload_only(card):
    """The offload cases set no pool: it is planned from the card's memory (10,972,530 blocks,
    134.8 GB on the H200). Allocated whole, pinned, that is 2 x 64 GiB (each of K and V rounded
    up to a power of two) on a 128 GiB host: refused. Allocated for the workload: 74 blocks."""
    from infersim.executor.serving import plan_pools

    total, planned = PLANNED[card]
    sv = ServingSection(max_batch_size=8)
    gpu, cpu, source = plan_pools(
        sv, device_type="cuda", total_bytes=total, block_bytes=BLOCK_BYTES, weight_bytes=0.0, act_bytes=0.0
    )
    assert (gpu, source) == (planned, "derived")
    whole = pool_sizes(
        "offload", device_type="cuda", gpu_blocks=gpu, cpu_blocks=0, workload=None, block_bytes=BLOCK_BYTES
    )
    assert whole.host_blocks == planned and whole.host_memory_bytes == HOST_128_GIB
    with pytest.raises(InfersimError) as e:
        check_pools_fit([whole], host_available_bytes=HOST_AVAILABLE, device_free_bytes=total, source="offload-full")
    line = str(e.value)
    assert "offload-full: the KV pools need 137 GB of pinned host memory" in line and "offload.pool_blocks" in line
    assert "\n" not in line

    served = workload_blocks(*TWO_REQUESTS, 16)
    fit = pool_sizes(
        "offload", device_type="cuda", gpu_blocks=gpu, cpu_blocks=0, workload=served, block_bytes=BLOCK_BYTES
    )
    assert (fit.device_blocks, fit.host_blocks) == (1, TWO_REQUESTS_BLOCKS)
    # K and V of 74 blocks: 454,656 B each, pinned as 524,288 B; the device keeps one block
    assert (fit.host_memory_bytes, fit.device_memory_bytes) == (1_048_576, BLOCK_BYTES)
    check_pools_fit([fit], host_available_bytes=HOST_AVAILABLE, device_free_bytes=total, source="offload-full")


@pytest.mark.parametrize("card", sorted(PLANNED))
def test_a_plain_run_planned_from_the_card_allocates_the_workload_only(card):
    """A plain run with a derived pool plans the card's memory and 4 GiB of swap space (349,525
    blocks); the device and the pinned host pool hold the workload's 74 blocks."""
    from infersim.executor.serving import plan_pools

    total, planned = PLANNED[card]
    gpu, cpu, _ = plan_pools(
        ServingSection(),
        device_type="cuda",
        total_bytes=total,
        block_bytes=BLOCK_BYTES,
        weight_bytes=0.0,
        act_bytes=0.0,
    )
    assert (gpu, cpu) == (planned, 4 * 2**30 // BLOCK_BYTES) == (planned, 349_525)
    whole = pool_sizes(
        "engine", device_type="cuda", gpu_blocks=gpu, cpu_blocks=cpu, workload=None, block_bytes=BLOCK_BYTES
    )
    assert whole.device_memory_bytes == planned * BLOCK_BYTES  # 134.8 GB on the H200, 76.3 GB on the H100
    # the 4 GiB swap space: K and V of 2,147,479,552 B each, pinned as 2 GiB each
    assert whole.host_memory_bytes == 2 * 2**31
    fit = pool_sizes("engine", device_type="cuda", gpu_blocks=gpu, cpu_blocks=cpu, workload=74, block_bytes=BLOCK_BYTES)
    assert (fit.device_memory_bytes, fit.host_memory_bytes) == (74 * BLOCK_BYTES, 1_048_576)


def test_pools_the_gpu_cannot_hold_are_refused_naming_the_gpu():
    """serving.gpu_blocks asks for 10,000,000 blocks (122.9 GB) of a speculative run's target on
    an H100 with 84 GB free: refused before anything is allocated."""
    big = pool_sizes(
        "speculative", device_type="cuda", gpu_blocks=10_000_000, cpu_blocks=0, workload=None, block_bytes=BLOCK_BYTES
    )
    assert (big.device_memory_bytes, big.host_memory_bytes) == (122_880_000_000, 0)
    with pytest.raises(
        InfersimError, match=r"w.yaml: the KV pools need 123 GB of GPU memory, more than the 84 GB free"
    ):
        check_pools_fit([big], host_available_bytes=HOST_AVAILABLE, device_free_bytes=84e9, source="w.yaml")


def test_a_cpu_runs_device_pool_is_host_memory():
    sizes = pool_sizes("engine", device_type="cpu", gpu_blocks=100, cpu_blocks=50, workload=40, block_bytes=1000)
    assert (sizes.device_memory_bytes, sizes.host_memory_bytes, sizes.pinned) == (0, 80_000, False)
    with pytest.raises(InfersimError, match="need 80 kB of host memory, more than the 80 kB available"):
        check_pools_fit([sizes], host_available_bytes=79_999, device_free_bytes=None, source="w")


class _ListFreeIds:
    """The free list the cache kept before: every id in a list, highest first, popped from the end."""

    def __init__(self, total):
        self.ids = list(range(total - 1, -1, -1))

    def take(self, n):
        return [self.ids.pop() for _ in range(n)]

    def give_back(self, ids):
        self.ids.extend(reversed(ids))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 6)), max_size=60))
def test_free_ids_hand_out_what_the_list_did_and_touch_only_the_peak(ops):
    """The counter-backed free list hands out the same ids in the same order as a full list, and
    the distinct ids a run touches are as many as it held at once (what lets a pool allocate
    only the workload's blocks)."""
    from infersim.executor.kvcache import FreeIds

    total = 40
    new, old = FreeIds(total), _ListFreeIds(total)
    held, touched, peak = [], set(), 0
    for take, n in ops:
        if take and n <= len(new):
            got = new.take(n)
            assert got == old.take(n)
            held.append(got)
            touched.update(got)
        elif not take and held:
            ids = held.pop(n % len(held))
            new.give_back(ids)
            old.give_back(ids)
        peak = max(peak, sum(map(len, held)))
        assert len(new) == len(old.ids)
    assert touched == set(range(len(touched))) and len(touched) == peak


def test_a_pool_grows_past_the_workloads_blocks_keeping_its_contents():
    """A pool allocated for 2 blocks of a planned 10 grows (doubling, at least to the id asked
    for) when a run needs more, and the blocks already written keep their values; a new device
    block reads as zeros, a swap round trip returns the values."""
    torch = pytest.importorskip("torch")
    from infersim.executor.kvcache import KVCacheConfig, PagedKVCache

    cache = PagedKVCache(1, 1, 2, KVCacheConfig(10, 2, cpu_blocks=10, dtype=torch.float32, committed_blocks=2))
    assert (cache.allocated_gpu, cache.allocated_cpu, cache.free_gpu) == (2, 2, 10)
    a, b = SimpleNamespace(block_table=[], cpu_block_table=[]), SimpleNamespace(block_table=[], cpu_block_table=[])
    cache.grow_to(a, 4)  # blocks 0, 1
    cache._k[0, a.block_table] = torch.arange(8.0).view(2, 2, 1, 2)
    cache.grow_to(b, 6)  # blocks 2, 3, 4: past the tensors
    assert b.block_table == [2, 3, 4] and cache.allocated_gpu == 5
    assert torch.equal(cache._k[0, :2].flatten(), torch.arange(8.0)) and not cache._k[0, 2:].any()
    cache.swap_out([a, b])  # host ids 0..4: the host pool grows too
    assert cache.allocated_cpu == 5 and cache.free_gpu == 10
    cache.swap_in([a])
    assert torch.equal(cache._k[0, a.block_table].flatten(), torch.arange(8.0))


def test_an_offload_run_records_and_allocates_the_workloads_blocks(tmp_path):
    """On this CPU the offload case's pool is planned from --device-memory-gb's default 4 GiB;
    the run allocates the workload's blocks and says so in config.yaml."""
    pytest.importorskip("torch")
    import yaml

    from infersim.executor.offload import execute
    from infersim.executor.options import VALIDATION
    from infersim.simulator.workload.builder import build_requests
    from infersim.simulator.workload.schema import WorkloadSpec

    spec = WorkloadSpec.model_validate(OFFLOAD_SMALL)
    execute(spec, build_requests(spec), "zoo-target", tmp_path / "run", VALIDATION)
    mem = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["memory"]
    # 44 tokens: 3 blocks + 1 spare, twice; fp32 blocks of 24,576 B, K and V pageable
    assert mem["gpu_blocks"] > 100_000 and mem["allocated_host_blocks"] == 8
    assert mem["allocated_host_bytes"] == 8 * 24_576 + 1 * 24_576  # the pool, and the unused device block


def test_sim_exec_refuses_an_offload_pool_the_host_cannot_hold(tmp_path, monkeypatch, capsys, zoo_dir):
    """A pool larger than the host's available memory: one line naming it, exit 2, no folder."""
    pytest.importorskip("torch")
    import yaml

    import infersim.executor.serving as serving
    from infersim.cli.main import main

    monkeypatch.setattr(serving, "host_available_bytes", lambda: 1e5)
    wl = tmp_path / "wl.yaml"
    wl.write_text(yaml.safe_dump(OFFLOAD_SMALL))
    assert main(["exec", "-w", str(wl), "-m", "zoo-target", "--fast", "-q", "-o", str(tmp_path / "run")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert (
        len(err) == 1
        and "wl.yaml: the KV pools need" in err[0]
        and "host memory, more than the 100 kB available" in err[0]
    )
    assert [p.name for p in tmp_path.iterdir()] == ["wl.yaml"]
