"""Speculative decoding on real models: a draft model (or several, Minions) proposes s tokens
per sequence, the target verifies them in one forward pass, rejected tokens' KV roll back.
See docs/executor-speculative.md.

- `sequence.py`: a request and each model's view of it (tokens, cached count, block table);
- `draft.py` / `target.py`: the draft (SSM) and the target, each with its own paged KV cache;
- `verify.py`: greedy acceptance and rejection sampling (Leviathan et al. / Chen et al.);
- `proposers.py`, `minions.py`: no draft, one draft, or Minions (the simulator's majority
  voter and SSM weights);
- `decoder.py`: the coupled loop (draft, then verify) with continuous batching;
- `pipeline.py`: Minions' pipeline (drafting thread + verifying thread + bounded pool);
- `attention.py`, `fused.py`: fewer calls per step (batched short-query attention, a fused
  Llama forward for drafts);
- `record.py`: acceptance by position -> the simulator's acceptance-table YAML;
- `build.py`: assembling a decoder from model names; `engine.py`: `sim exec` for workloads
  with a `speculation:` section."""

# the validation matrix's hooks (analysis/validate/modes.py); imports nothing heavy
from .validate_hooks import execute, recorded_statistics, simulator_updates  # noqa: E402,F401
