"""The torch device a command runs on: cpu, cuda, cuda:N or auto, checked once for every
command (exec, validate, profile), so that a device that is not there is one line naming
--device."""

from __future__ import annotations

import contextlib

from infersim.simulator.errors import InfersimError

DEVICE_CHOICES = ("cpu", "cuda")


def select_device(name: str | None = "cpu"):
    """'cpu', 'cuda', 'cuda:N' or 'auto' to a torch.device; a one-line InfersimError when CUDA
    is asked for and torch has none (CPU-only build, no driver, no GPU)."""
    import torch

    name = (name or "cpu").strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise InfersimError(f"--device {name}: unknown device; use cpu, cuda or cuda:N") from None
    if dev.type not in DEVICE_CHOICES:
        raise InfersimError(f"--device {name}: unsupported device type '{dev.type}'; use cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, no usable GPU"
            raise InfersimError(
                f"--device {name}: CUDA is not available on this machine "
                f"(torch {torch.__version__}, {build}); use --device cpu"
            )
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise InfersimError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible")
        dev = torch.device("cuda", index)
    return dev


def attention_backends(device):
    """The context under which the executor and the profiler call
    scaled_dot_product_attention on `device`. On CUDA: cuDNN's attention kernels off, so torch
    runs FlashAttention, memory-efficient or math kernels. cuDNN attention builds an execution
    graph for every new shape (about 40 ms each on an H200 under torch 2.11), and a serving
    batch brings new query and key lengths nearly every iteration, so with it a 20-token
    prefill takes 40 ms; serving engines run FlashAttention-style kernels. Only the cuDNN flag
    is switched (about 1 us; torch's sdpa_kernel context, which sets every backend, takes 15).
    On the CPU, and under a torch without the switch (before 2.3: no cuDNN attention), torch
    picks as it always does."""
    import torch

    if torch.device(device).type != "cuda" or not hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        return contextlib.nullcontext()
    return _without_cudnn_attention(torch.backends.cuda)


@contextlib.contextmanager
def _without_cudnn_attention(backends):
    previous = backends.cudnn_sdp_enabled()
    backends.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        backends.enable_cudnn_sdp(previous)


def sdpa(q, k, v, **kwargs):
    """torch's scaled_dot_product_attention under `attention_backends` (every attention call
    of the executor and the profiler goes through here); inside that context already, a plain
    call (a timed sweep enters it once, so no switch lands between its CUDA events)."""
    import torch
    import torch.nn.functional as F

    if q.device.type == "cuda" and torch.backends.cuda.cudnn_sdp_enabled():
        with attention_backends(q.device):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)
