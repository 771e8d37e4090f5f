"""Medusa inside the speculative engine (`sim exec` with `speculation: {method: medusa}`).

The speculative engine (executor/speculative/engine.py, decoder.py) owns arrivals, admission
(FCFS, a request's whole KV reserved up front, so nothing is preempted), continuous batching,
the run directory and its metrics. Medusa plugs in as a decoder whose round is one Medusa step:

- `MedusaProposer`: the trained heads, the tree and the acceptance rule; it keeps each running
  sequence's latest head proposals (the heads read the last accepted node's hidden state, so
  the next step's candidates exist as soon as a step ends) and scores every proposal against
  the tokens the sequence finally commits (the head accuracies measured in the run);
- `MedusaDecoder(SpeculativeDecoder)`: `round(prefill, ready)` is one forward pass that
  prefills the newly admitted sequences and verifies every running sequence's tree, then
  acceptance, KV compaction (`compact_paths` + `truncate`) and one heads call for all;
- `resolve_tree`: the tree the simulator would build for the same section (same table, same
  builders in simulator/speculative/medusa_tree.py), cut to the heads that were trained.

A sequence with one token left verifies its root only (a plain decode step), as the
simulator's MedusaProposer plans it; a step that accepts past a request's output length keeps
only the tokens the request asked for.

Rows of speculation_rounds.parquet for Medusa: `s` = the tree's depth, `drafted_tokens` = tree
candidates verified (nodes - 1 per sequence with a tree), `accepted_tokens` = accepted
candidates (before the cut at the output length), `draft_s` = the heads' time (proposing),
`verify_s` = the forward pass + acceptance + KV compaction, `draft_steps` = heads calls."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml

from infersim.simulator.errors import InfersimError
from infersim.simulator.speculative.medusa_heads import HeadAccuracies, load_accuracies
from infersim.simulator.speculative.medusa_tree import cartesian_tree, choices_tree, greedy_tree, restrict
from infersim.simulator.yamlio import atomic_path, write_atomic

from ..runner import plan_batch
from ..speculative.decoder import SpeculativeDecoder, round_row
from ..speculative.target import TargetModel
from .acceptance import Acceptance, accept, accept_greedy_lists
from .decode import compact_paths
from .store import ensure_heads
from .tree import TreeLayout, layout

ACCURACIES_FILE = "medusa_accuracies.yaml"


def acceptance_for(sp) -> Acceptance:
    """The section's sampling as Medusa's acceptance rule: greedy, typical, or rejection
    sampling at temperature 0 (which is greedy); sampling above 0 is not implemented here."""
    smp = sp.sampling
    if smp.mode == "typical":
        return Acceptance("typical", float(smp.temperature), float(smp.epsilon), float(smp.delta))
    if smp.mode == "sampling" and float(smp.temperature) > 0:
        raise InfersimError(
            "speculation.sampling: Medusa in sim exec accepts greedily or typically "
            "(mode: greedy | typical); rejection sampling at a temperature is not implemented"
        )
    return Acceptance("greedy")


def resolve_tree(mc, num_heads: int) -> tuple[TreeLayout, object, int]:
    """(layout, accuracy table, heads used) for a `speculation.medusa` section, built as the
    simulator builds it (simulator/speculative/proposers.py MedusaProposer) from the named
    accuracy table, then cut to the `num_heads` heads the executor has."""
    table = load_accuracies(mc.accuracies)
    acc = table.rank_accuracies()
    if mc.heads is not None and mc.heads > num_heads:
        raise InfersimError(f"speculation.medusa.heads: {mc.heads} heads asked for, the trained heads are {num_heads}")
    heads = min(mc.heads or acc.shape[0], acc.shape[0], num_heads)
    tc = mc.tree
    if tc.type == "choices":
        tree = choices_tree(tc.choices if tc.choices is not None else table.tree)
        name = "choices" if tc.choices is not None else (table.tree_name or f"{table.name} tree")
    elif tc.type == "cartesian":
        tree, name = cartesian_tree(tc.sizes), "cartesian " + "x".join(str(s) for s in tc.sizes)
    else:
        tree, name = greedy_tree(acc[:heads], int(tc.nodes)), f"greedy {tc.nodes}"
    cut = restrict(tree, heads, int(acc.shape[1]))
    if not cut:
        raise InfersimError(f"speculation.medusa.tree: the tree is empty once cut to {heads} heads")
    return layout(cut, name), table, heads


class MedusaProposer:
    """Heads + tree + acceptance, and the per-sequence proposals between steps."""

    samples_with_rejection = False
    names: list = []

    def __init__(self, heads, tree: TreeLayout, acceptance: Acceptance, device):
        if tree.heads_used > heads.num_heads:
            raise InfersimError(f"tree '{tree.name}' is {tree.depth} deep but there are only {heads.num_heads} heads")
        self.heads = heads
        self.layout = tree  # on the cpu (lists for the Python walk)
        self.tree = tree.on(device)
        self.acceptance = acceptance
        self.device = device
        self.props: dict[int, torch.Tensor] = {}  # rid -> [depth, top_k] the next step's guesses
        # rid -> [(index of the token whose hidden state proposed, guesses [depth][top_k])]
        self._history: dict[int, list] = {}
        self.hits = np.zeros((tree.depth, tree.top_k), dtype=np.int64)  # head j, rank i right
        self.scored = np.zeros(tree.depth, dtype=np.int64)  # positions scored per head
        self.accepted_hist: dict[int, int] = {}  # accepted candidates per tree step -> count
        self.calls = 0

    def propose(self, seqs, hidden: torch.Tensor) -> None:
        """One heads call for every sequence that goes on: hidden [N, h] at each one's last
        committed-and-cached token (the token before its next root)."""
        if not seqs:
            return
        t = self.tree
        props = self.heads.propose(hidden, t.top_k, t.depth)  # [N, depth, top_k]
        self.calls += 1
        plist = props.tolist()
        for j, seq in enumerate(seqs):
            self.props[seq.rid] = props[j]
            self._history.setdefault(seq.rid, []).append((len(seq.tokens) - 2, plist[j]))

    def release(self, seq) -> None:
        """The sequence is finished: score its proposals against what it committed."""
        self.props.pop(seq.rid, None)
        toks = seq.tokens
        for base, guesses in self._history.pop(seq.rid, []):
            for j, g in enumerate(guesses):
                idx = base + j + 2  # head j+1 predicts j+1 tokens past the LM head's (base + 1)
                if idx >= len(toks):
                    break
                self.scored[j] += 1
                if toks[idx] in g:
                    self.hits[j, g.index(toks[idx])] += 1

    def per_rank(self) -> np.ndarray:
        """Measured per-rank accuracies [depth, top_k] (rows of heads never scored are 0)."""
        return self.hits / np.maximum(self.scored, 1)[:, None]


@dataclass
class _TreeStep:
    """One Medusa step's working state: the batch laid out for the forward pass, then what
    acceptance decided and what the step counted."""

    npf: int  # prefilled sequences (first in the batch and in the logit rows)
    batch: list = field(default_factory=list)  # (seq, query tokens) for plan_batch
    trees: list = field(default_factory=list)  # per batch entry: (depths, ancestors), None: no tree
    rows: list = field(default_factory=list)  # logit rows: a prefill's last token, every node of a ready sequence
    n: int = 0  # query tokens laid out so far
    full: list = field(default_factory=list)  # per ready sequence: verifies a whole tree (False: its root only)
    fseqs: list = field(default_factory=list)  # the ready sequences with a tree
    tok_lists: list = field(default_factory=list)  # per ready sequence: root + candidate tokens
    starts: list = field(default_factory=list)  # per ready sequence: its root's position
    best: list = field(default_factory=list)  # per tree: the accepted path's last node
    n_accepted: list = field(default_factory=list)  # per tree: candidates accepted
    bonus: list = field(default_factory=list)  # per tree: the token after the accepted path
    go_on: list = field(default_factory=list)  # sequences not done: the heads propose for them
    h_rows: list = field(default_factory=list)  # their hidden-state rows
    drafted: int = 0  # tree candidates verified
    accepted: int = 0  # candidates accepted (before the cut at the output length)
    gained: int = 0  # tokens committed by verifications

    def add(self, seq, q: int, tree, every_row: bool) -> None:
        """Lay out q query tokens of seq; logits at all of them or at the last."""
        self.batch.append((seq, q))
        self.trees.append(tree)
        self.rows.extend(range(self.n, self.n + q) if every_row else [self.n + q - 1])
        self.n += q


class MedusaDecoder(SpeculativeDecoder):
    """The speculative engine's decoder with a Medusa step as its round. s = the tree's depth
    (reported), s_max = its nodes (what a verification writes into the KV cache: reserved)."""

    def __init__(self, target, proposer: MedusaProposer, *, max_batch_size: int = 256):
        super().__init__(
            target,
            proposer,
            s=proposer.layout.depth,
            temperature=0.0,
            max_batch_size=max_batch_size,
            s_max=proposer.layout.nodes,
        )

    def round(self, prefill, ready, t_start: float = 0.0):
        s = self.s
        if not self.s_series or self.s_series[-1][1] != s:
            self.s_series.append((self._round, s))
        t0 = time.perf_counter()
        st = _TreeStep(len(prefill))
        self._lay_out_prefills(st, prefill)
        self._lay_out_trees(st, ready)
        if not st.batch:
            return []
        logits, hidden = self._forward(st)
        self._commit_prefills(st, prefill, logits)
        self._accept_trees(st, logits)
        released = self.target.released_blocks
        out = self._commit_verified(st, ready, logits)
        self._sync()
        t1 = time.perf_counter()
        if st.go_on:
            self.proposer.propose(st.go_on, hidden[torch.tensor(st.h_rows, dtype=torch.long, device=hidden.device)])
        self._sync()
        t2 = time.perf_counter()
        times_s = (t_start, t_start + (t2 - t0), t2 - t1, t1 - t0)
        counts = (s, st.drafted, st.accepted, len(prefill) + st.gained, 1 if st.go_on else 0)
        self._close_round(
            prefill, ready, round_row(self._round, times_s, (len(prefill), len(ready)), counts, self.target, released)
        )
        return out

    def _lay_out_prefills(self, st: _TreeStep, prefill) -> None:
        for seq in prefill:
            q = seq.num_tokens - seq.computed
            self.target.cache.grow_to(seq, seq.num_tokens)
            st.add(seq, q, None, every_row=False)

    def _lay_out_trees(self, st: _TreeStep, ready) -> None:
        """Each ready sequence's root and its tree's candidates from the heads' last proposals,
        appended to its tokens and cache."""
        P, cache = self.proposer, self.target.cache
        tree, lay = P.tree, P.layout
        # a sequence with one token left verifies its root only (as the simulator plans it)
        st.full = [seq.remaining > 1 for seq in ready]
        st.fseqs = [seq for seq, f in zip(ready, st.full) if f]
        cand = []
        if st.fseqs:
            props = torch.stack([P.props[seq.rid] for seq in st.fseqs])
            cand = props[:, tree.head, tree.rank].tolist()  # [B, n] the trees' candidate tokens
        ci = 0
        spec = (lay.depths, lay.ancestors)
        for seq, f in zip(ready, st.full):
            start = seq.computed  # the root's position: committed, not cached yet
            c = cand[ci] if f else []
            ci += f
            st.tok_lists.append([seq.tokens[-1]] + c)
            st.starts.append(start)
            seq.tokens.extend(c)
            cache.grow_to(seq, start + 1 + len(c))
            st.add(seq, 1 + len(c), spec if f else None, every_row=True)

    def _forward(self, st: _TreeStep):
        """One pass over prefills and trees: (logits at st.rows, last hidden states)."""
        tgt = self.target
        plan = plan_batch(tgt.cache, st.batch, tgt.device, all_logits=True, trees=st.trees if st.fseqs else None)
        plan.logit_rows = torch.tensor(st.rows, dtype=torch.long, device=tgt.device)
        logits, hidden = tgt.runner.forward(plan, tgt.cache, return_hidden=True)
        tgt.steps += 1
        return logits, hidden

    def _commit_prefills(self, st: _TreeStep, prefill, logits) -> None:
        """Each prefilled sequence's first token (greedy)."""
        for j, (seq, t) in enumerate(zip(prefill, logits[: st.npf].argmax(-1).tolist())):
            seq.computed = seq.num_tokens
            seq.tokens.append(int(t))
            if not seq.done:
                st.go_on.append(seq)
                st.h_rows.append(j)

    def _accept_trees(self, st: _TreeStep, logits) -> None:
        """Acceptance of every tree in one go, then the accepted paths' K/V moved into place."""
        if not st.fseqs:
            return
        P, dev = self.proposer, self.target.device
        lay, n1 = P.layout, P.layout.nodes
        idx = [i for i, f in enumerate(st.full) if f]
        off = st.npf
        offs = []
        for f in st.full:
            offs.append(off)
            off += n1 if f else 1
        lg = torch.stack([logits[offs[i] : offs[i] + n1] for i in idx])  # [B, n1, V]
        toks = [st.tok_lists[i] for i in idx]
        if P.acceptance.mode == "greedy":
            st.best, st.n_accepted, st.bonus = accept_greedy_lists(lay, toks, lg)
        else:
            b, na, bo = accept(P.tree, torch.tensor(toks, dtype=torch.long, device=dev), lg, P.acceptance)
            st.best, st.n_accepted, st.bonus = b.tolist(), na.tolist(), bo.tolist()
        moves = [(seq, st.starts[i], lay.node_paths[b]) for i, seq, b in zip(idx, st.fseqs, st.best)]
        compact_paths(self.target.cache, moves)

    def _commit_verified(self, st: _TreeStep, ready, logits) -> list:
        """Each ready sequence keeps its accepted path (or its root) and the bonus token;
        returns (accepted, last token) per sequence."""
        n1 = self.proposer.layout.nodes
        out = []
        row, fi = st.npf, 0
        for i, (seq, f) in enumerate(zip(ready, st.full)):
            start = st.starts[i]
            if f:
                h_row = row + st.best[fi]
                path, bonus = self._keep_accepted_path(st, fi, i, seq)
                fi += 1
                row += n1
            else:
                path, bonus = [0], int(logits[row].argmax(-1))
                del seq.tokens[start + 1 :]
                h_row = row
                row += 1
            gained = self._commit_bonus(seq, start, path, bonus)
            st.gained += gained
            out.append((gained - 1, seq.tokens[-1]))
            if not seq.done:
                st.go_on.append(seq)
                st.h_rows.append(h_row)
        return out

    def _keep_accepted_path(self, st: _TreeStep, fi: int, i: int, seq) -> tuple[list, int]:
        """Tree fi (ready sequence i): its accepted candidates replace the tree in seq.tokens,
        counted in the step and the acceptance record; (the path's nodes, the bonus token)."""
        P = self.proposer
        lay = P.layout
        path, na = lay.node_paths[st.best[fi]], st.n_accepted[fi]
        st.drafted += lay.nodes - 1
        st.accepted += na
        self.stats.recorder.add(lay.depth, na)
        P.accepted_hist[na] = P.accepted_hist.get(na, 0) + 1
        del seq.tokens[st.starts[i] + 1 :]
        seq.tokens.extend(st.tok_lists[i][k] for k in path[1:])
        return path, st.bonus[fi]

    def _commit_bonus(self, seq, start: int, path, bonus) -> int:
        """Append the bonus token, free the cache past the accepted path, cut what goes past the
        request's output length; returns the tokens the step gained."""
        tgt = self.target
        seq.tokens.append(int(bonus))
        seq.computed = start + len(path)
        tgt.released_blocks += tgt.cache.truncate(seq, seq.computed)
        gained = len(path)  # accepted candidates + the bonus token
        if seq.generated > seq.output_len:  # a step past the request's end: keep what it asked for
            cut = seq.generated - seq.output_len
            del seq.tokens[len(seq.tokens) - cut :]
            gained -= cut
        return gained

    # ---- what the engine writes beside its own files ------------------------------------------
    def summary_extra(self) -> dict:
        P = self.proposer
        lay = P.layout
        return {
            "medusa": {
                "tree": lay.name,
                "tree_nodes": lay.nodes,
                "tree_depth": lay.depth,
                "tree_paths": [list(p) for p in lay.paths],
                "top_k": lay.top_k,
                "acceptance": P.acceptance.mode,
                "heads_calls": P.calls,
                "accepted_hist": {str(k): v for k, v in sorted(P.accepted_hist.items())},
                "head_positions_scored": P.scored.tolist(),
                "per_rank_measured": P.per_rank().tolist(),
                "accuracies_file": ACCURACIES_FILE,
            }
        }

    def write_extra(self, folder: Path, *, target: str, source: str) -> None:
        """medusa_accuracies.yaml: the head accuracies measured in this run, as a simulator
        accuracy table (with the executed tree), loadable as speculation.medusa.accuracies."""
        write_accuracy_table(Path(folder) / ACCURACIES_FILE, self.proposer, target=target, source=source)

    def plot_extra(self, folder: Path) -> None:
        """plots/medusa.png: accepted candidates per tree step, and each head's top-i accuracy
        as measured in this run."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        P = self.proposer
        fig, (a0, a1) = plt.subplots(1, 2, figsize=(9, 3.4))
        ks = np.arange(P.layout.depth + 1)
        a0.bar(ks, [P.accepted_hist.get(int(k), 0) for k in ks])
        a0.set(
            xlabel="candidates accepted in a tree step",
            ylabel="sequence-steps",
            title=f"tree {P.layout.name} ({P.layout.nodes} nodes)",
        )
        top = np.cumsum(P.per_rank(), axis=1)
        for j, row in enumerate(top):
            a1.plot(np.arange(1, row.size + 1), row, "o-", ms=3, label=f"head {j + 1}")
        a1.set(xlabel="top-i", ylabel="accuracy in this run", ylim=(0, 1), title="head accuracies (measured)")
        a1.legend(fontsize=7)
        fig.tight_layout()
        (Path(folder) / "plots").mkdir(exist_ok=True)
        with atomic_path(Path(folder) / "plots" / "medusa.png") as tmp:
            fig.savefig(tmp, dpi=110)
        plt.close(fig)


def write_accuracy_table(path: Path, P: MedusaProposer, *, target: str, source: str) -> Path:
    lay = P.layout
    # rounded down so that no head's ranks add up past 1 after rounding
    per_rank = [[float(np.floor(a * 1e4) / 1e4) for a in row] for row in P.per_rank()]
    data = {
        "name": Path(path).stem,
        "model": target,
        "source": source,
        "top_k": int(lay.top_k),
        "per_rank": per_rank,
        "tree_name": lay.name,
        "tree_source": "the tree the executor verified (cut to the trained heads)",
        "tree": [list(p) for p in lay.paths],
    }
    HeadAccuracies.model_validate(data)  # never write a table the simulator would refuse
    header = (
        "# Medusa head accuracies measured by `sim exec` (executor/medusa/serve.py): per_rank[k][i] = the\n"
        "# fraction of proposals in which head k+1's rank-i guess was the token the sequence committed k+2\n"
        f"# positions past the proposing token; positions scored per head: {P.scored.tolist()}\n"
    )
    write_atomic(path, header + yaml.safe_dump(data, sort_keys=False, width=100))
    return Path(path)


def build_medusa_decoder(
    lm,
    sp,
    *,
    gpu_blocks: int,
    block_size: int = 16,
    max_batch_size: int = 256,
    heads=None,
    tree: TreeLayout | None = None,
) -> MedusaDecoder:
    """A Medusa decoder for a `speculation:` section on a loaded target: its cached heads
    (trained first if missing), the section's tree and acceptance."""
    if heads is None:
        heads, _, _ = ensure_heads(lm)
    if tree is None:
        tree, _, _ = resolve_tree(sp.medusa, heads.num_heads)
    tm = TargetModel(lm, gpu_blocks=gpu_blocks, block_size=block_size)
    return MedusaDecoder(tm, MedusaProposer(heads, tree, acceptance_for(sp), lm.device), max_batch_size=max_batch_size)
