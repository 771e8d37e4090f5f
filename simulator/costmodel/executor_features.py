"""The features of one engine iteration that the executor's step time is linear in.

The executor (executor/runner.py) runs every token of a batch through the projections in one
matmul, writes K/V per token, and attends in one of two ways: decode-only batches gather all
sequences' blocks into one padded tensor (cost ~ sequences x the longest context, rounded up
to blocks) and make one attention call; any other batch makes one attention call per
sequence (a per-sequence launch cost, plus score pairs). Around the forward pass the engine
spends Python time per iteration and per sequence (scheduling, bookkeeping). On a small model
these fixed and per-sequence costs dominate, which is why a roofline of FLOPs and bytes alone
is far off there and a fit on these features is not."""

from __future__ import annotations

import numpy as np

from .batch import BatchShape

# Two code paths, two sets of terms: a decode-only batch (its constant, per sequence, and the
# padded keys of its one gathered attention call) and any other batch (its constant, per
# sequence — one attention call each —, tokens through the projections, score pairs, keys read).
FEATURE_NAMES = (
    "decode_iteration",
    "decode_sequences",
    "decode_padded_keys",
    "mixed_iteration",
    "mixed_sequences",
    "mixed_tokens",
    "mixed_score_pairs",
    "mixed_keys",
)
# The columns of each code path: a batch's row is zero outside its own path's columns, so the
# two paths share no coefficient and are fitted apart.
PATH_COLUMNS = {"decode": slice(0, 3), "mixed": slice(3, len(FEATURE_NAMES))}


def batch_features(batch: BatchShape, block_size: int) -> np.ndarray:
    """One row of FEATURE_NAMES for a batch."""
    q = np.asarray(batch.query_tokens, dtype=np.float64)
    c = np.asarray(batch.context_tokens, dtype=np.float64)
    n = float(q.size)
    keys = c + q
    if n and bool(np.all(q == 1)):
        # the decode path pads every sequence to the longest one's whole blocks
        padded = n * np.ceil(keys.max() / block_size) * block_size
        return np.array([1.0, n, padded, 0.0, 0.0, 0.0, 0.0, 0.0])
    return np.array([0.0, 0.0, 0.0, 1.0, n, float(q.sum()), float((q * keys).sum()), float(keys.sum())])


def decode_rows(X: np.ndarray) -> np.ndarray:
    """Which rows of a feature matrix are decode-only batches."""
    return X[:, 0] > 0


def feature_matrix(shapes: list[BatchShape], block_size: int) -> np.ndarray:
    if not shapes:
        return np.zeros((0, len(FEATURE_NAMES)))
    return np.vstack([batch_features(b, block_size) for b in shapes])


def shapes_from_batches(batches: dict[str, np.ndarray], iterations: np.ndarray) -> list[BatchShape]:
    """The exact BatchShape of each iteration from iteration_batches.parquet columns
    (iteration, rid, query_tokens, context_tokens, makes_token), in the order of `iterations`."""
    it = np.asarray(batches["iteration"], dtype=np.int64)
    order = np.argsort(it, kind="stable")
    it_sorted = it[order]
    q = np.asarray(batches["query_tokens"], dtype=np.int64)[order]
    c = np.asarray(batches["context_tokens"], dtype=np.int64)[order]
    mk = np.asarray(batches["makes_token"], dtype=np.int64)[order]
    lo = np.searchsorted(it_sorted, iterations, side="left")
    hi = np.searchsorted(it_sorted, iterations, side="right")
    return [BatchShape(q[a:b], c[a:b], mk[a:b]) for a, b in zip(lo, hi)]
