"""Batched Medusa decoding over the paged KV cache, and plain greedy decoding on the same
runner (the baseline Medusa is measured against and must equal under greedy acceptance).

A Medusa step, for every running sequence at once:
1. candidates: each sequence's tree filled from its heads' top-k guesses (one gather);
2. one verification forward over all sequences' trees (tree attention: each node sees the
   cached context and its ancestors, position = context + depth), logits and last hidden
   states at every node;
3. acceptance (greedy or typical, `acceptance.py`): the longest accepted path and the bonus
   token from its last node's logits;
4. KV: `keep_path` moves the accepted nodes' K/V to consecutive positions and `truncate` frees
   the blocks past them; the bonus token becomes the next root (committed, not yet cached);
5. the heads read the last accepted node's hidden state and propose the next step's guesses.

Invariant between steps: seq.tokens = prompt + generated, seq.computed = len(tokens) - 1 (the
last token, the root of the next tree, is not in the cache yet)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from infersim.simulator.errors import InfersimError

from ..kvcache import KVCacheConfig, runner_cache
from ..runner import TokenSeq, plan_batch
from .acceptance import Acceptance, accept, accept_greedy_lists
from .tree import TreeLayout


@dataclass
class DecodeStats:
    """What a run measured. A "step" is one forward pass over the running batch after the
    prefill; tokens count only what the requests asked for (tokens a step produces past a
    request's length are discarded)."""

    method: str
    batch: int
    steps: int = 0
    seq_steps: int = 0  # sum over steps of the sequences in the batch
    decode_tokens: int = 0  # tokens produced by decode steps (the prefill makes each request's first)
    prefill_time_s: float = 0.0
    decode_time_s: float = 0.0
    step_times_s: list[float] = field(default_factory=list)
    # CPU time of this thread per step: on a shared machine wall time includes the slices other
    # processes take (measured: 10 ms stalls every few 1 ms steps at load 7 on 2 cores); with one
    # torch thread on cpu all the work runs in this thread, so its CPU time is the work itself
    step_cpu_s: list[float] = field(default_factory=list)
    decode_cpu_s: float = 0.0
    # parts of a Medusa step, on the clock of `work_clock` (thread CPU time on cpu, wall on cuda)
    verify_time_s: float = 0.0  # building the plan and the verification forward pass
    heads_time_s: float = 0.0  # the heads' proposals
    accepted_hist: dict[int, int] = field(default_factory=dict)  # candidates accepted beyond the root -> count

    @property
    def acceleration_rate(self) -> float:
        """Mean tokens per sequence per decoding step (Medusa's acceleration rate)."""
        return self.decode_tokens / self.seq_steps if self.seq_steps else float("nan")

    @property
    def mean_step_time_s(self) -> float:
        return self.decode_time_s / self.steps if self.steps else float("nan")

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "batch": self.batch,
            "steps": self.steps,
            "seq_steps": self.seq_steps,
            "decode_tokens": self.decode_tokens,
            "prefill_time_s": self.prefill_time_s,
            "decode_time_s": self.decode_time_s,
            "acceleration_rate": self.acceleration_rate,
            "mean_step_time_s": self.mean_step_time_s,
            "decode_cpu_s": self.decode_cpu_s,
            "verify_time_s": self.verify_time_s,
            "heads_time_s": self.heads_time_s,
            "accepted_hist": {str(k): v for k, v in sorted(self.accepted_hist.items())},
        }


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def work_clock(device):
    """The clock that measures this process's own work: thread CPU time on cpu (one torch
    thread runs its kernels inline), wall time on cuda (the work is on the GPU)."""
    return time.perf_counter if torch.device(device).type == "cuda" else time.thread_time


def make_cache(runner, prompts, max_new, extra_tokens: int, device, dtype=torch.float32, block_size: int = 16):
    """A cache big enough for every prompt + output + one tree's worth of candidates."""
    news = _as_list(max_new, len(prompts))
    blocks = sum(-(-(len(p) + n + extra_tokens + 1) // block_size) for p, n in zip(prompts, news)) + 1
    return runner_cache(runner, KVCacheConfig(blocks, block_size, cpu_blocks=1, dtype=dtype), device)


def _as_list(max_new, n: int) -> list[int]:
    return [int(max_new)] * n if isinstance(max_new, int) else [int(x) for x in max_new]


def compact_paths(cache, moves) -> None:
    """keep_path for a whole batch: moves = [(seq, start, path)]; every accepted node's K/V
    goes to consecutive positions from `start`, with one gather and one scatter per layer and
    pool for all sequences together (PagedKVCache.keep_path does one sequence at a time).
    Sequences whose path is already in place (a chain of first children) move nothing."""
    src, dst = [], []
    for seq, start, path in moves:
        if list(path) == list(range(len(path))):
            continue
        slots = cache.slots(seq.block_table, start, start + max(path) + 1)
        src.extend(slots[j] for j in path)
        dst.extend(slots[: len(path)])
    if not src:
        return
    src_t = torch.tensor(src, dtype=torch.long, device=cache.device)
    dst_t = torch.tensor(dst, dtype=torch.long, device=cache.device)
    for layer in range(cache.num_layers):
        for pool in cache.flat(layer):
            # gathered into a new tensor before the copy: overlapping moves are safe
            pool.index_copy_(0, dst_t, pool.index_select(0, src_t))


def _prefill(runner, cache, seqs, device, return_hidden: bool):
    for s in seqs:
        cache.grow_to(s, s.num_tokens)
    plan = plan_batch(cache, [(s, s.num_tokens) for s in seqs], device)
    out = runner.forward(plan, cache, return_hidden=return_hidden)
    for s in seqs:
        s.computed = s.num_tokens
    return out


def greedy_decode(runner, cache, prompts, max_new, device="cpu") -> tuple[list[list[int]], DecodeStats]:
    """Plain greedy decoding: a batched prefill, then one token per sequence per step
    (decode-only batches). Returns each prompt's max_new new tokens and the stats."""
    news = _as_list(max_new, len(prompts))
    seqs = [TokenSeq(p) for p in prompts]
    st = DecodeStats("greedy", len(prompts))
    _sync(device)
    t0 = time.perf_counter()
    logits = _prefill(runner, cache, seqs, device, False)
    for s, t in zip(seqs, logits.argmax(-1).tolist()):
        s.tokens.append(t)
    _sync(device)
    st.prefill_time_s = time.perf_counter() - t0
    plens = [len(p) for p in prompts]
    active = [i for i in range(len(seqs)) if news[i] > 1]
    while active:
        t0, c0 = time.perf_counter(), time.thread_time()
        batch = [seqs[i] for i in active]
        for s in batch:
            cache.grow_to(s, s.computed + 1)
        logits = runner.forward(plan_batch(cache, [(s, 1) for s in batch], device), cache)
        for s, t in zip(batch, logits.argmax(-1).tolist()):
            s.computed += 1
            s.tokens.append(t)
        _sync(device)
        st.decode_tokens += len(batch)
        _count_step(st, len(batch), time.perf_counter() - t0, time.thread_time() - c0)
        active = [i for i in active if len(seqs[i].tokens) - plens[i] < news[i]]
    for s in seqs:
        cache.free(s)
    return [s.tokens[n : n + m] for s, n, m in zip(seqs, plens, news)], st


@dataclass
class _MedusaRun:
    """One medusa_decode call: what every step uses, and the batch's state between steps."""

    runner: Any
    heads: Any  # the Medusa heads (their propose)
    tree: TreeLayout  # on the device
    cache: Any
    acceptance: Acceptance
    device: Any
    seqs: list  # TokenSeq per prompt
    plens: list  # prompt lengths
    news: list  # new tokens asked for, per prompt
    st: DecodeStats
    clock: Any = None  # work_clock(device): times the verify and heads parts
    active: list = field(default_factory=list)  # indices of the prompts still decoding
    props: Any = None  # [len(active), depth, top_k] the heads' guesses for the next step


def medusa_decode(
    runner, heads, tree: TreeLayout, cache, prompts, max_new, acceptance: Acceptance = Acceptance(), device="cpu"
) -> tuple[list[list[int]], DecodeStats]:
    """Medusa decoding of a batch of prompts (see the module docstring). Returns each prompt's
    max_new new tokens and the stats."""
    news = _as_list(max_new, len(prompts))
    if tree.heads_used > heads.num_heads:
        raise InfersimError(f"tree '{tree.name}' is {tree.depth} deep but there are only {heads.num_heads} heads")
    st = DecodeStats(f"medusa {tree.name} ({acceptance.mode})", len(prompts))
    seqs, plens = [TokenSeq(p) for p in prompts], [len(p) for p in prompts]
    r = _MedusaRun(runner, heads, tree.on(device), cache, acceptance, device, seqs, plens, news, st, work_clock(device))
    _medusa_prefill(r)
    while r.active:
        _medusa_step(r)
    for s in r.seqs:
        cache.free(s)
    return [s.tokens[n : n + m] for s, n, m in zip(r.seqs, r.plens, r.news)], st


def _medusa_prefill(r: _MedusaRun) -> None:
    """The prompts' batched prefill, each one's first token, and the heads' first guesses for
    the prompts that want more than one token."""
    _sync(r.device)
    t0 = time.perf_counter()
    logits, hidden = _prefill(r.runner, r.cache, r.seqs, r.device, True)
    for s, t in zip(r.seqs, logits.argmax(-1).tolist()):
        s.tokens.append(t)
    props = r.heads.propose(hidden, r.tree.top_k, r.tree.depth)  # [B, depth, top_k]
    _sync(r.device)
    r.st.prefill_time_s = time.perf_counter() - t0
    r.active = [i for i in range(len(r.seqs)) if r.news[i] > 1]
    r.props = props[r.active] if len(r.active) != len(r.seqs) else props


def _medusa_step(r: _MedusaRun) -> None:
    """One Medusa step over the active prompts (steps 1-5 of the module docstring)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    batch = [r.seqs[i] for i in r.active]
    tokens = _fill_trees(r, batch)
    logits, hidden = _verify_trees(r, batch)
    tok_list = tokens.tolist()
    accepted = _accept_trees(r, tokens, tok_list, logits.view(len(batch), r.tree.nodes, -1))
    _propose_next(r, hidden, accepted[0])
    keep = _commit_paths(r, batch, tok_list, accepted)
    _sync(r.device)
    _count_step(r.st, len(batch), time.perf_counter() - t0, time.thread_time() - c0)
    if len(keep) != len(batch):
        r.active = [r.active[j] for j in keep]
        r.props = r.props[torch.tensor(keep, dtype=torch.long, device=r.props.device)]


def _fill_trees(r: _MedusaRun, batch) -> torch.Tensor:
    """Each sequence's tree from its heads' guesses (one gather), appended to its tokens and
    cache; returns the trees' tokens [B, nodes], roots first."""
    tree = r.tree
    roots = torch.tensor([s.tokens[-1] for s in batch], dtype=torch.long, device=r.device)
    cand = r.props[:, tree.head, tree.rank]  # [B, n]
    tokens = torch.cat([roots[:, None], cand], dim=1)  # [B, n+1]
    for s, c in zip(batch, cand.tolist()):
        s.tokens.extend(c)
        r.cache.grow_to(s, s.computed + tree.nodes)
    return tokens


def _verify_trees(r: _MedusaRun, batch):
    """One forward pass over every tree (tree attention): logits and hidden states at every node."""
    n1 = r.tree.nodes
    tree_spec = (r.tree.depths, r.tree.ancestors)
    t1 = r.clock()
    plan = plan_batch(r.cache, [(s, n1) for s in batch], r.device, all_logits=True, trees=[tree_spec] * len(batch))
    logits, hidden = r.runner.forward(plan, r.cache, return_hidden=True)
    _sync(r.device)
    r.st.verify_time_s += r.clock() - t1
    return logits, hidden


def _accept_trees(r: _MedusaRun, tokens, tok_list, logits) -> tuple[list, list, list]:
    """(last accepted node, candidates accepted, bonus token) per sequence."""
    if r.acceptance.mode == "greedy":
        return accept_greedy_lists(r.tree, tok_list, logits)
    best, n_acc, bonus = accept(r.tree, tokens, logits, r.acceptance)
    return best.tolist(), n_acc.tolist(), bonus.tolist()


def _propose_next(r: _MedusaRun, hidden, best_l) -> None:
    """The heads read each sequence's last accepted node's hidden state."""
    n1 = r.tree.nodes
    rows = [j * n1 + b for j, b in enumerate(best_l)]
    t3 = r.clock()
    r.props = r.heads.propose(hidden[rows], r.tree.top_k, r.tree.depth)
    _sync(r.device)
    r.st.heads_time_s += r.clock() - t3


def _commit_paths(r: _MedusaRun, batch, tok_list, accepted) -> list[int]:
    """Accepted paths' K/V moved into place, their tokens and the bonus token committed, the
    cache past them freed; returns the batch positions of the sequences that go on."""
    tree, st = r.tree, r.st
    best_l, nacc_l, bonus_l = accepted
    keep = []
    compact_paths(r.cache, [(s, s.computed, tree.node_paths[b]) for s, b in zip(batch, best_l)])
    for j, (s, b, na, nb) in enumerate(zip(batch, best_l, nacc_l, bonus_l)):
        path = tree.node_paths[b]
        start = s.computed  # position of the root
        del s.tokens[start + 1 :]
        s.tokens.extend(tok_list[j][k] for k in path[1:])
        s.tokens.append(nb)
        s.computed = start + len(path)
        r.cache.truncate(s, s.computed)
        i = r.active[j]
        before = len(s.tokens) - (na + 1) - r.plens[i]
        st.decode_tokens += min(na + 1, r.news[i] - before)  # tokens past the request's length are dropped
        st.accepted_hist[na] = st.accepted_hist.get(na, 0) + 1
        if len(s.tokens) - r.plens[i] < r.news[i]:
            keep.append(j)
    return keep


def _count_step(st: DecodeStats, batch: int, dt: float, dc: float) -> None:
    """A decoding step of `batch` sequences that took dt seconds of wall and dc of CPU time."""
    st.steps += 1
    st.seq_steps += batch
    st.decode_time_s += dt
    st.step_times_s.append(dt)
    st.decode_cpu_s += dc
    st.step_cpu_s.append(dc)
