"""The dispatch and combine all-to-alls of data-parallel attention with expert parallelism.

Each GPU of an expert-parallel group of N holds E/N whole experts and runs attention for its
own requests, so a sparse layer moves tokens: every token's hidden state goes to the GPUs of
its top-k experts (dispatch) and their outputs come back (combine). As DeepEP's low-latency
kernels send them (https://github.com/deepseek-ai/DeepEP, README: "128 tokens per batch, 7168
hidden, top-8 experts, FP8 dispatching and BF16 combining"), a token sends one copy per chosen
expert, k in all, of which k/N land on its own GPU and move nothing. Dispatch carries FP8 values
with one float32 scale per 128 of them when the model is served in fp8 (16-bit values
otherwise); combine carries 16-bit outputs.

A GPU's remote copies go to its node's other GPUs over the interconnect (NVLink) and to the
other nodes' GPUs through its own network adapter, both at once: an all-to-all takes the slower
of the two shares, plus one message's latency of the slowest link it uses (a floor: a batch of
one token still waits for it). Routing is uniform (every expert k/E of the tokens), and all
GPUs send and receive alike, so a GPU's receive side equals its send side."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..models.dtypes import bytes_per_element

FP8_SCALE_GROUP = 128  # DeepEP's FP8 dispatch: one float32 scale per 128 channels of a token
FP8_SCALE_BYTES = 4


@dataclass(frozen=True)
class AllToAllLinks:
    """The links one GPU of the group uses and how many of its peers sit behind each."""

    ep: int
    gpus_per_node: int
    nvlink_bytes_per_s: float
    nvlink_latency_s: float
    network_bytes_per_s: float
    network_latency_s: float

    @property
    def peers_in_node(self) -> int:
        return min(self.ep, self.gpus_per_node) - 1

    @property
    def peers_across_nodes(self) -> int:
        return self.ep - 1 - self.peers_in_node


def dispatch_bytes_per_copy(hidden: int, weight_dtype: str, act_dtype: str) -> float:
    """One token copy sent to one expert: FP8 values and their scales under fp8 serving."""
    if weight_dtype == "fp8":
        return hidden * 1.0 + FP8_SCALE_BYTES * hidden / FP8_SCALE_GROUP
    return hidden * float(bytes_per_element(act_dtype))


def combine_bytes_per_copy(hidden: int, act_dtype: str) -> float:
    return hidden * float(bytes_per_element(act_dtype))


class AllToAll:
    """Time of one dispatch and one combine for arrays of one GPU's token counts."""

    def __init__(self, links: AllToAllLinks, experts_per_token: int, dispatch_bytes: float, combine_bytes: float):
        self.links, self.k = links, experts_per_token
        self.dispatch_bytes_per_copy, self.combine_bytes_per_copy = dispatch_bytes, combine_bytes

    def remote_copies_per_token(self) -> tuple[float, float]:
        """(copies to this node's other GPUs, copies to other nodes' GPUs) per token: each of its k
        copies lands on any of the N GPUs alike."""
        ln = self.links
        return self.k * ln.peers_in_node / ln.ep, self.k * ln.peers_across_nodes / ln.ep

    def bytes_sent(self, tokens: float, bytes_per_copy: float) -> float:
        """Bytes one GPU sends for `tokens` of its own: its remote copies, every link together."""
        return float(tokens) * sum(self.remote_copies_per_token()) * bytes_per_copy

    @property
    def link(self) -> str:
        """The links the remote copies take: "node" (the interconnect), "network" (other nodes), or both
        ("node+network", where the slower share sets the time)."""
        in_node, across = self.remote_copies_per_token()
        return "+".join(name for name, copies in (("node", in_node), ("network", across)) if copies) or "none"

    def time_s(self, tokens, bytes_per_copy: float) -> np.ndarray:
        ln = self.links
        tokens = np.asarray(tokens, dtype=np.float64)
        in_node, across = self.remote_copies_per_token()
        nvlink = in_node * bytes_per_copy * tokens / ln.nvlink_bytes_per_s if in_node else 0.0 * tokens
        network = across * bytes_per_copy * tokens / ln.network_bytes_per_s if across else 0.0 * tokens
        latency = ln.network_latency_s if ln.peers_across_nodes else ln.nvlink_latency_s
        return latency + np.maximum(nvlink, network)

    def dispatch_time_s(self, tokens) -> np.ndarray:
        return self.time_s(tokens, self.dispatch_bytes_per_copy)

    def combine_time_s(self, tokens) -> np.ndarray:
        return self.time_s(tokens, self.combine_bytes_per_copy)
