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
from infersim.simulator.models.spec import ModelSpec
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
# the same shape as the simulator's model spec (the pool's sizing counts its KV only)
ZOO_TARGET_SPEC = ModelSpec(
    name="zoo-target",
    family="llama",
    source="executor/zoo",
    num_layers=3,
    hidden_size=192,
    num_heads=6,
    num_kv_heads=2,
    head_dim=32,
    intermediate_size=512,
    vocab_size=4096,
)
# a plain run's device pool derived from the card: (total x 0.9 - 0.25 GiB) // 12,288 B (the
# offload cases' host pool before it was planned from host memory)
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


def _offload_plan(total, available, **offload):
    """The offload cases' host pool for zoo-target in fp16 on a card of `total` bytes, a host with
    `available` bytes free (weights and activations left out: a few MB)."""
    from infersim.executor.offload.plan import Machine, plan_host_pool
    from infersim.executor.serving import DeviceBudget
    from infersim.simulator.offload.config import OffloadSection

    device = DeviceBudget("cuda", total, BLOCK_BYTES, 0.0, 0.0)
    section = OffloadSection(policy="full", **offload)
    return plan_host_pool(
        ZOO_TARGET_SPEC, section, ServingSection(max_batch_size=8), Machine(device, available), "fp16"
    )


@pytest.mark.parametrize("card", sorted(PLANNED))
def test_an_offload_case_plans_its_host_pool_from_host_memory(card):
    """The offload cases set no pool: it is planned from offload.cpu_memory_gb's 96 GB x 0.9 =
    86.4 GB over 768 B a token (3 layers x K and V x 64 x 2 B), 112,500,000 tokens = 7,031,250
    blocks of 16, fewer than the card's free memory holds at 512 B a token (the load double
    buffer): cpu-bound on both cards, no longer the card's 10,972,530 / 6,207,036 blocks. The run
    holds that pool (pageable) and 4 pinned staging buffers of one layer's K or V of the workload's
    613 blocks (1,255,424 B, 2 MiB as torch rounds it): 86.4 GB, which a 128 GiB host holds. The
    same pool pinned whole would be 2 x 64 GiB, more than the host has."""
    from infersim.executor.offload.plan import check_host_fits, host_hold

    total, former = PLANNED[card]
    plan = _offload_plan(total, HOST_AVAILABLE)
    assert (plan.blocks, plan.bound_by, plan.cpu_pool_bytes) == (7_031_250, "cpu", 86.4e9)
    assert plan.blocks != former
    hold = host_hold(plan.blocks, BLOCK_BYTES, device_type="cuda", act_bytes=0.0, workload=613, num_layers=3)
    assert (hold.pool_bytes, hold.staging_bytes, hold.device_pool_bytes) == (86_400_000_000, 4 * 2**21, 0)
    check_host_fits(hold, plan, host_available_bytes=HOST_AVAILABLE, source="offload-full")
    assert 2 * pinned_bytes(hold.pool_bytes // 2) == HOST_128_GIB > HOST_AVAILABLE


@pytest.mark.parametrize("card", sorted(PLANNED))
def test_the_executor_and_the_simulator_plan_the_same_pool(card):
    """Both call simulator/offload/memory.py's pool_blocks: on a profile with the card's memory
    the simulator's plan equals the executor's, cpu-bound (the default 96 GB) and gpu-bound
    (cpu_memory_gb 10,000: the card's free memory binds)."""
    from infersim.executor.offload.plan import Machine, plan_host_pool
    from infersim.executor.serving import DeviceBudget
    from infersim.simulator.engine.memory import MemoryOptions
    from infersim.simulator.hardware.catalog import load_hardware
    from infersim.simulator.models.catalog import load_model as load_spec
    from infersim.simulator.offload import OffloadSection, build_offload
    from infersim.simulator.offload.memory import plan_offload_memory

    total, _ = PLANNED[card]
    name = {"H200": "h200", "H100": "h100-sxm"}[card]
    hw = load_hardware(name).model_copy(update={"memory_visible_gib": total / 2**30})
    model = load_spec("llama-3-8b")
    sv = ServingSection(max_batch_size=8, max_batched_tokens=2048)
    opts = MemoryOptions(16, "fp16", "fp16", 1, 0.9, 4.0, 2048, 8)
    for cpu_gb, bound in ((96.0, "cpu"), (10_000.0, "gpu")):
        section = OffloadSection(policy="full", cpu_memory_gb=cpu_gb)
        policy = build_offload(model, hw, section).policy
        sim = plan_offload_memory(model, hw, policy, section, opts)
        device = DeviceBudget(
            "cuda", hw.memory_bytes(), 2_097_152, model.weight_bytes_per_gpu(1, "fp16"), opts.activation_bytes(model)
        )
        ex = plan_host_pool(model, section, sv, Machine(device, 1e15), "fp16")
        assert (ex.blocks, ex.bound_by) == (sim.pool_blocks, sim.bound_by) and sim.bound_by == bound


def test_a_pool_larger_than_the_host_is_refused_naming_its_field():
    """offload.pool_blocks 12,000,000 (147 GB) on a 128 GiB host: refused, naming the field; a
    cpu_memory_gb past the host's memory is capped at what the host has available (x 0.9)."""
    from infersim.executor.offload.plan import check_host_fits, host_hold

    plan = _offload_plan(H200_BYTES, HOST_AVAILABLE, pool_blocks=12_000_000)
    hold = host_hold(plan.blocks, BLOCK_BYTES, device_type="cuda", act_bytes=0.0, workload=613, num_layers=3)
    with pytest.raises(InfersimError) as e:
        check_host_fits(hold, plan, host_available_bytes=HOST_AVAILABLE, source="w.yaml")
    line = str(e.value)
    assert line.startswith(
        "w.yaml: field 'offload.pool_blocks': the host KV pool (12,000,000 blocks, as set: 147.5 GB)"
    )
    assert "more than the 134.2 GB available" in line and "\n" not in line
    capped = _offload_plan(H200_BYTES, HOST_AVAILABLE, cpu_memory_gb=500.0)
    assert (capped.bound_by, capped.cpu_pool_bytes) == ("cpu", HOST_AVAILABLE * 0.9)


@pytest.mark.parametrize("card", sorted(PLANNED))
def test_a_plain_run_planned_from_the_card_allocates_the_workload_only(card):
    """A plain run with a derived pool plans the card's memory and 4 GiB of swap space (349,525
    blocks); the device and the host pool hold the workload's 74 blocks."""
    from infersim.executor.serving import DeviceBudget, plan_pools

    total, planned = PLANNED[card]
    budget = DeviceBudget("cuda", total, BLOCK_BYTES, weight_bytes=0.0, act_bytes=0.0)
    gpu, cpu, _ = plan_pools(ServingSection(), budget)
    assert (gpu, cpu) == (planned, 4 * 2**30 // BLOCK_BYTES) == (planned, 349_525)
    whole = pool_sizes(
        "engine", device_type="cuda", gpu_blocks=gpu, cpu_blocks=cpu, workload=None, block_bytes=BLOCK_BYTES
    )
    assert whole.device_memory_bytes == planned * BLOCK_BYTES  # 134.8 GB on the H200, 76.3 GB on the H100
    # the 4 GiB swap space, pageable
    assert whole.host_memory_bytes == 349_525 * BLOCK_BYTES == 4_294_963_200
    fit = pool_sizes("engine", device_type="cuda", gpu_blocks=gpu, cpu_blocks=cpu, workload=74, block_bytes=BLOCK_BYTES)
    assert (fit.device_memory_bytes, fit.host_memory_bytes) == (74 * BLOCK_BYTES, 74 * BLOCK_BYTES)


def test_pools_the_gpu_cannot_hold_are_refused_naming_the_gpu():
    """serving.gpu_blocks asks for 10,000,000 blocks (122.9 GB) of a speculative run's target on
    an H100 with 84 GB free: refused before anything is allocated."""
    big = pool_sizes(
        "speculative", device_type="cuda", gpu_blocks=10_000_000, cpu_blocks=0, workload=None, block_bytes=BLOCK_BYTES
    )
    assert (big.device_memory_bytes, big.host_memory_bytes) == (122_880_000_000, 0)
    with pytest.raises(
        InfersimError, match=r"w.yaml: the KV pools need 122.9 GB of GPU memory, more than the 84.0 GB free"
    ):
        check_pools_fit([big], host_available_bytes=HOST_AVAILABLE, device_free_bytes=84e9, source="w.yaml")


def test_a_cpu_runs_device_pool_is_host_memory():
    sizes = pool_sizes("engine", device_type="cpu", gpu_blocks=100, cpu_blocks=50, workload=40, block_bytes=1000)
    assert (sizes.device_memory_bytes, sizes.host_memory_bytes) == (0, 80_000)
    with pytest.raises(InfersimError, match="need 80.0 kB of host memory, more than the 80.0 kB available"):
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


@pytest.mark.parametrize(
    "offload,available,field",
    [({}, 1e5, "offload.cpu_memory_gb"), ({"pool_blocks": 2_000_000}, 20e9, "offload.pool_blocks")],
)
def test_sim_exec_refuses_an_offload_pool_the_host_cannot_hold(
    tmp_path, monkeypatch, capsys, zoo_dir, offload, available, field
):
    """A host pool whose run the host's available memory cannot hold: one line naming the field,
    exit 2, no folder. 100 kB available: the pool capped at 90 kB (3 blocks of 24,576 B) and
    the one-block device pool need 98 kB, with the activation peak more; 2,000,000 blocks
    (49.2 GB) on 20 GB."""
    pytest.importorskip("torch")
    import yaml

    import infersim.executor.offload.plan as plan
    from infersim.cli.main import main

    monkeypatch.setattr(plan, "host_available_bytes", lambda: available)
    wl = tmp_path / "wl.yaml"
    wl.write_text(yaml.safe_dump({**OFFLOAD_SMALL, "offload": {**OFFLOAD_SMALL["offload"], **offload}}))
    assert main(["exec", "-w", str(wl), "-m", "zoo-target", "--fast", "-q", "-o", str(tmp_path / "run")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"wl.yaml: field '{field}': the host KV pool" in err[0], err
    assert f"more than the {'100.0 kB' if available == 1e5 else '20.0 GB'} available on this machine" in err[0]
    assert [p.name for p in tmp_path.iterdir()] == ["wl.yaml"]


def test_a_host_pool_never_grows_past_the_plan_the_check_counted():
    """Growth past what was checked is impossible by construction: the check counts the planned
    pool whole (host_hold's pool_bytes), the tensors start at the workload's blocks and double up
    to the plan, never past it, and the free list hands out no id past the plan (it refuses, as
    overdrawn)."""
    torch = pytest.importorskip("torch")
    from infersim.executor.kvcache import KVCacheConfig
    from infersim.executor.offload.plan import host_hold
    from infersim.executor.offload.serve import HostKVPool

    planned = 10
    pool = HostKVPool(1, 1, 2, KVCacheConfig(planned, 2, dtype=torch.float32, committed_blocks=3))
    checked = host_hold(planned, pool.bytes_per_block, device_type="cpu", act_bytes=0.0, workload=3, num_layers=1)
    sizes = [pool.allocated_gpu]
    for n in range(planned):
        pool.grow_to(SimpleNamespace(block_table=[], cpu_block_table=[]), 2)  # one block each
        sizes.append(pool.allocated_gpu)
    assert sizes == [3, 3, 3, 3, 6, 6, 6, 10, 10, 10, 10] and pool.free_gpu == 0
    assert (pool._k.nbytes + pool._v.nbytes) == planned * pool.bytes_per_block == checked.pool_bytes
    with pytest.raises(RuntimeError, match="overdrawn"):
        pool.grow_to(SimpleNamespace(block_table=[], cpu_block_table=[]), 2)
    assert pool.allocated_gpu == planned


def test_a_host_pool_is_committed_in_slices_a_signal_can_interrupt(monkeypatch):
    """A host pool is pageable on both devices and committed in COMMIT_SLICE_BYTES slices, one C
    call each: a SIGTERM arriving during the commit is handled after the slice in progress (here
    raised from the first slice's zero-fill; the remaining slices never run)."""
    torch = pytest.importorskip("torch")
    import os
    import signal

    import infersim.executor.kvcache as kvcache
    from infersim.executor.kvcache import KVCacheConfig
    from infersim.executor.offload.serve import HostKVPool

    # 1 layer x 16 blocks x 2 tokens x 1 head x 1024 x 4 B = 128 KiB per tensor: 16 slices of 8 KiB
    monkeypatch.setattr(kvcache, "COMMIT_SLICE_BYTES", 8 << 10)
    slices = []
    real_zero = torch.Tensor.zero_

    def zero(t):
        slices.append(t.nbytes)
        if len(slices) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # delivered while this slice's C call runs
        return real_zero(t)

    class Terminated(Exception):
        pass

    def on_term(signum, frame):
        raise Terminated

    monkeypatch.setattr(torch.Tensor, "zero_", zero)
    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        with pytest.raises(Terminated):
            HostKVPool(1, 1, 1024, KVCacheConfig(16, 2, dtype=torch.float32))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert slices == [8 << 10]
