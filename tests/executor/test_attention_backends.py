"""The attention backends the executor and the profiler run: on CUDA, FlashAttention,
memory-efficient and math kernels and never cuDNN's (which builds an execution graph for every
new shape: about 40 ms on an H100 or H200, where the other kernels take 0.04-0.07 ms on the same
first call); on the CPU, torch's own choice, untouched."""

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import torch.nn.functional as F  # noqa: E402

from infersim.executor.device import attention_backends, sdpa  # noqa: E402


def _flags():
    b = torch.backends.cuda
    return b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled()


def test_cuda_runs_without_cudnn_attention_and_restores_the_flags():
    before = _flags()
    with attention_backends(torch.device("cuda")):
        assert _flags() == (False, True, True, True)
    with attention_backends("cuda:0"):
        assert _flags()[0] is False
    assert _flags() == before
    with attention_backends("cuda"):  # nested (a timed sweep inside, a call inside that): still off
        with attention_backends("cuda"):
            pass
        assert _flags()[0] is False
    assert _flags() == before


def test_cpu_keeps_torchs_choice():
    before = _flags()
    with attention_backends(torch.device("cpu")):
        assert _flags() == before


def test_sdpa_on_cpu_is_torchs_own_call_bit_for_bit():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 9, 16, generator=g) for _ in range(3))
    mask = torch.rand(2, 1, 9, 9, generator=g) > 0.3
    assert torch.equal(sdpa(q, k, v, is_causal=True), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert torch.equal(sdpa(q, k, v, attn_mask=mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
