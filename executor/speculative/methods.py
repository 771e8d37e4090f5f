"""Speculative methods whose proposals and verification live in their own package (Medusa's
heads and token trees: executor/medusa) plug into the speculative engine here. The package
registers a `TreeDecoding` under the method's name when it is imported, so the engine serves
the method without importing the package that builds on it."""

from __future__ import annotations

from typing import Any, Protocol

from infersim.simulator.registry import Registry


class TreeDecoding(Protocol):
    """What the engine asks of such a method, in the order it asks."""

    def acceptance_mode(self, sp) -> str:
        """The acceptance rule the `speculation:` section asks for (greedy, typical)."""

    def prepare(self, lm, sp, log=None) -> tuple[Any, Any]:
        """(heads, tree) for the loaded target: the tree's `nodes` tokens are written into the KV
        cache by each verification, so the engine reserves room for them."""

    def build_decoder(self, lm, sp, *, gpu_blocks: int, block_size: int, max_batch_size: int, heads, tree):
        """The decoder that serves the run (the engine's coupled loop drives it)."""


TREE_DECODINGS: Registry[TreeDecoding] = Registry("speculative method with its own decoder")
