"""The pipelined decoder's drafting engine in a process of its own.

Two threads of one Python process contend for the interpreter: measured on this project's CPU
(docs/validation.md), a loop of small matmuls ran 2.3-2.9x slower with a second thread doing
the same, and 1.00x with a second *process* doing it. Small draft models are mostly
interpreter work, so the pipeline's overlap was eaten by that contention, and how much of it
varied from run to run. Here the drafts, their KV caches and the proposer that votes over them
live in a child process; the pipelined decoder's drafting thread hands it a group of sequences
and waits on a pipe (which releases the interpreter), so the verifying thread has the parent's
interpreter to itself and each engine has a core.

What crosses the pipe per round: each sequence's committed tokens added since the last round it
was drafted for (the child keeps a mirror of each sequence and the drafts' `Track`s, as the
in-process proposer keeps them on the sequence), the speculation lengths, and the voting weights
(the verifying side reweights the SSMs; the child votes with the latest weights); back come the
proposal (voted tokens, every SSM's draft, the voted SSM) and the drafts' step and rollback
counters, added to the parent's draft objects so the run's statistics read as before."""

from __future__ import annotations

import contextlib
import multiprocessing as mp

import numpy as np

from infersim.simulator.errors import InfersimError

from ..models import dtype_name
from .minions import MinionsProposer
from .proposers import Proposal

READY_TIMEOUT_S = 300.0  # loading the drafts in the child (torch import included)


def _config(proposer) -> dict:
    drafts = list(getattr(proposer, "drafts", []))
    if not drafts:
        raise InfersimError("a drafting process needs draft models (method draft or minions)")
    return {
        "kind": "minions" if isinstance(proposer, MinionsProposer) else "draft",
        "drafts": [
            {
                "path": str(d.lm.path),
                "name": d.name,
                "index": d.index,
                "gpu_blocks": d.cache.total_gpu,
                "block_size": d.cache.block_size,
            }
            for d in drafts
        ],
        "device": str(drafts[0].lm.device),
        "dtype": dtype_name(drafts[0].lm.dtype),
        "acr_scope": getattr(proposer, "acr_scope", "all"),
        "seed": int(getattr(proposer, "seed", 0)),
    }


class RemoteProposer:
    """`propose` / `release` of `proposer` (a SingleDraft or MinionsProposer), run by a child
    process on its own copies of the draft models. Greedy drafting only (the pipeline verifies
    greedily)."""

    def __init__(self, proposer, threads: int = 1):
        self.local = proposer
        cfg = _config(proposer)
        cfg["threads"] = int(threads)
        ctx = mp.get_context("spawn")  # a forked child would inherit torch's thread pools mid-state
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, cfg), name="ssm-drafting-engine", daemon=True)
        self.proc.start()
        child.close()
        self.sent: dict[int, int] = {}  # rid -> committed tokens the child has
        self.closed = False
        if not self.conn.poll(READY_TIMEOUT_S):
            self.close()
            raise InfersimError(f"the drafting process did not load its models within {READY_TIMEOUT_S:.0f} s")
        self._expect("ready")

    def _expect(self, what: str):
        try:
            msg = self.conn.recv()
        except EOFError:
            raise InfersimError(f"the drafting process exited (code {self.proc.exitcode})") from None
        if msg[0] == "error":
            raise InfersimError(f"the drafting process failed: {msg[1]}")
        if msg[0] != what:
            raise InfersimError(f"the drafting process answered {msg[0]!r}, expected {what!r}")
        return msg

    def propose(self, seqs, s_list, temperature=0.0, generator=None) -> Proposal:
        if temperature > 0:
            raise InfersimError("the drafting process drafts greedily only (speculation.sampling.mode: greedy)")
        items = []
        for seq in seqs:
            n = self.sent.get(seq.rid, 0)
            items.append((seq.rid, len(seq.drafts), seq.tokens[n:]))
            self.sent[seq.rid] = len(seq.tokens)
        w = getattr(self.local, "weights", None)
        with getattr(self.local, "lock", None) or contextlib.nullcontext():
            weights = None if w is None else w.weights.tolist()
        self.conn.send(("propose", items, [int(s) for s in s_list], weights))
        _, tokens, outputs, voted, steps, counters = self._expect("proposal")
        for d, (st, rel) in zip(self.local.drafts, counters):
            d.steps += st
            d.released_blocks += rel
        return Proposal(tokens, None, outputs, voted, draft_steps=steps)

    def tick_start(self) -> None:
        """Time the clock's reference kernel in the drafting process, now (a speed tick of its
        core, executor/clock.py); only while no proposal is in flight."""
        self.conn.send(("tick",))

    def tick_finish(self) -> float:
        return float(self._expect("tick")[1])

    def release(self, seq) -> None:
        if self.sent.pop(seq.rid, None) is not None:
            self.conn.send(("release", [seq.rid]))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.conn.send(("stop",))
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)
        self.conn.close()


def _serve(conn, cfg: dict) -> None:
    """The child: load the drafts, then answer propose / release until stop."""
    try:
        import torch

        import infersim.executor  # noqa: F401  (its environment defaults for torch's thread pools)
        from infersim.simulator.speculative.minions import SSMWeights

        from ..clock import reference_kernel_s
        from ..models import load_model
        from .build import warm_up_drafts
        from .draft import DraftModel
        from .minions import MinionsProposer
        from .proposers import SingleDraft
        from .sequence import SpecSequence

        torch.set_num_threads(cfg["threads"])
        drafts = [
            DraftModel(
                load_model(d["path"], device=cfg["device"], dtype=cfg["dtype"]),
                index=d["index"],
                gpu_blocks=d["gpu_blocks"],
                block_size=d["block_size"],
                name=d["name"],
            )
            for d in cfg["drafts"]
        ]
        if cfg["kind"] == "minions":
            proposer = MinionsProposer(
                drafts, SSMWeights(np.ones(len(drafts))), acr_scope=cfg["acr_scope"], seed=cfg["seed"]
            )
        else:
            proposer = SingleDraft(drafts[0])
        warm_up_drafts(drafts)  # first calls of new shapes, paid before the engine's clock
        reference_kernel_s()  # its tensors and first call, paid before the engine's clock too
        seqs: dict[int, SpecSequence] = {}
        conn.send(("ready",))
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                return
            if msg[0] == "tick":
                conn.send(("tick", reference_kernel_s()))
                continue
            if msg[0] == "release":
                for rid in msg[1]:
                    seq = seqs.pop(rid, None)
                    if seq is not None:
                        proposer.release(seq)
                continue
            _, items, s_list, weights = msg
            group = []
            for rid, n_drafts, delta in items:
                seq = seqs.get(rid)
                if seq is None:
                    seq = seqs[rid] = SpecSequence(rid, delta, 1, n_drafts)
                else:
                    seq.tokens.extend(delta)
                group.append(seq)
            if weights is not None:
                proposer.weights.weights = np.asarray(weights, dtype=np.float64)
            before = [(d.steps, d.released_blocks) for d in drafts]
            prop = proposer.propose(group, s_list, 0.0, None)
            conn.send(
                (
                    "proposal",
                    prop.tokens,
                    prop.outputs,
                    prop.voted,
                    prop.draft_steps,
                    [(d.steps - s, d.released_blocks - r) for d, (s, r) in zip(drafts, before)],
                )
            )
    except (EOFError, KeyboardInterrupt):
        return
    except BaseException as exc:  # reported to the parent as one line
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        except (BrokenPipeError, OSError):
            pass
