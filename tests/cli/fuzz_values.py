"""Hypothesis strategies of hostile values and of mutations of a valid YAML mapping, shared by
the fuzz tests."""

from __future__ import annotations

import copy
import math

from hypothesis import strategies as st

NUMBERS = st.sampled_from(
    [-1, 0, 1, 3, 2**31, 10**12, 2**63, 10**30, -(10**12), 0.5, -0.5, 1e-300, 1e300, math.nan, math.inf, -math.inf]
) | st.integers(-10, 100)
STRINGS = st.sampled_from(["", "abc", "1e12", "1e3", "nan", ".inf", "-1", "ten", "\u263a", "none", "../x.yaml"])
OTHERS = st.sampled_from([None, True, False, [], [1], ["a", "b"], {}, {"x": 1}, {"type": "nosuch"}])
VALUES = st.one_of(NUMBERS, STRINGS, OTHERS)


def leaf_paths(data, prefix=()) -> list[tuple]:
    """Every key path of a nested mapping, sections included."""
    out = []
    for k, v in data.items():
        out.append(prefix + (k,))
        if isinstance(v, dict):
            out.extend(leaf_paths(v, prefix + (k,)))
    return out


def _parent(data, path):
    node = data
    for k in path[:-1]:
        if not isinstance(node, dict):
            return None
        node = node.get(k)
    return node if isinstance(node, dict) else None


@st.composite
def mutated(draw, base: dict, extra_paths: tuple = (), values=VALUES, keep: tuple = ()):
    """`base` with one to three mutations: a value replaced by a hostile one, a key deleted, or an
    unknown key added. `extra_paths` are optional keys the mutations may also set; the dotted
    paths in `keep` are never deleted (their defaults would make a case slow, not different)."""
    data = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = leaf_paths(data) + [tuple(p.split(".")) for p in extra_paths]
        path = draw(st.sampled_from(paths))
        parent = _parent(data, path)
        if parent is None:
            continue
        action = draw(st.sampled_from(["replace", "replace", "replace", "delete", "unknown"]))
        if action == "delete" and ".".join(path) in keep:
            action = "replace"
        if action == "replace":
            parent[path[-1]] = copy.deepcopy(draw(values))  # sampled constants must stay unchanged
        elif action == "delete":
            parent.pop(path[-1], None)
        else:
            parent["unknown_" + path[-1]] = copy.deepcopy(draw(values))
    return data
