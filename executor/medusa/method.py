"""Medusa as the speculative engine's `TreeDecoding` (executor/speculative/methods.py): the
engine serves a `speculation: {method: medusa}` workload through these three calls. The
package registers it on import; the work is in store.py (the cached heads) and serve.py (the
tree, the acceptance rule and the decoder), imported when called because they need torch."""

from __future__ import annotations

from ..speculative.methods import TREE_DECODINGS


class MedusaDecoding:
    def acceptance_mode(self, sp) -> str:
        from .serve import acceptance_for

        return acceptance_for(sp).mode

    def prepare(self, lm, sp, log=None):
        from .serve import resolve_tree
        from .store import ensure_heads

        heads, _, _ = ensure_heads(lm, log=log)
        tree, _, _ = resolve_tree(sp.medusa, heads.num_heads)
        return heads, tree

    def build_decoder(self, lm, sp, *, gpu_blocks: int, block_size: int, max_batch_size: int, heads, tree):
        from .serve import build_medusa_decoder

        return build_medusa_decoder(
            lm, sp, gpu_blocks=gpu_blocks, block_size=block_size, max_batch_size=max_batch_size, heads=heads, tree=tree
        )


TREE_DECODINGS.register("medusa")(MedusaDecoding())
