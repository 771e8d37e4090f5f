"""The runner's tree path (what speculative and Medusa verification stand on): a token tree
verified in one pass gives, on each root-to-node path, the same logits as that path run as a
plain sequence; keep_path + truncate leave a cache that decodes like the linear one."""

import pytest

import infersim.executor  # noqa: F401

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.torch

from infersim.executor.kvcache import KVCacheConfig, runner_cache  # noqa: E402
from infersim.executor.models import load_model  # noqa: E402
from infersim.executor.runner import TokenSeq, build_runner, plan_batch  # noqa: E402


@pytest.mark.parametrize("model", ["zoo-target", "zoo-opt"])
def test_tree_verification_matches_linear_paths(model, zoo_dir):
    lm = load_model(model)
    r = build_runner(lm)
    cache = runner_cache(r, KVCacheConfig(64, 4, cpu_blocks=1, dtype=torch.float32))
    prompt = [5, 17, 300, 42, 99, 7, 8]
    a, b, x, y = 11, 12, 13, 14
    # linear references: prompt + a + b, and prompt + x + y
    refs = [TokenSeq(prompt + [a, b]), TokenSeq(prompt + [x, y])]
    ref_logits = []
    for ref in refs:
        cache.grow_to(ref, ref.num_tokens)
        ref_logits.append(r.forward(plan_batch(cache, [(ref, ref.num_tokens)], "cpu", all_logits=True), cache))
    s = TokenSeq(prompt)
    cache.grow_to(s, len(prompt))
    r.forward(plan_batch(cache, [(s, len(prompt))], "cpu"), cache)
    s.computed = len(prompt)
    # tree in topological order: x (depth 0), a (depth 0), b (child of a), y (child of x)
    s.tokens += [x, a, b, y]
    anc = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [1, 0, 0, 1]], dtype=torch.bool)
    cache.grow_to(s, s.num_tokens)
    lg = r.forward(plan_batch(cache, [(s, 4)], "cpu", all_logits=True, trees=[([0, 0, 1, 1], anc)]), cache)
    n = len(prompt)
    for row, (ref, pos) in {0: (1, n), 1: (0, n), 2: (0, n + 1), 3: (1, n + 1)}.items():
        assert torch.allclose(lg[row], ref_logits[ref][pos], atol=1e-4), row
    # accept path a, b: the cache then decodes the next token like the linear prompt + a + b
    cache.keep_path(s, n, [1, 2])
    s.tokens = prompt + [a, b, 3]
    s.computed = n + 2
    freed = cache.truncate(s, n + 2)
    assert len(s.block_table) == cache.blocks_for_tokens(n + 2) and freed >= 0
    cache.grow_to(s, s.num_tokens)
    ref = refs[0]
    ref.tokens.append(3)
    ref.computed = n + 2
    cache.grow_to(ref, ref.num_tokens)
    got = r.forward(plan_batch(cache, [(s, 1)], "cpu"), cache)
    want = r.forward(plan_batch(cache, [(ref, 1)], "cpu"), cache)
    assert torch.allclose(got, want, atol=1e-4)
