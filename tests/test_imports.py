"""Imports sit at the top of their module. An import inside a function is kept only where it
loads an optional dependency (the `executor`, `search` and `cluster` extras: torch,
transformers, ray, optuna, ...) that its module does not already need, so that the base install
and every command that does not use them start without them; or matplotlib's pyplot, whose
backend is chosen before it loads. Never to hide an upward import or a cycle (import-linter
checks those: tests/test_layers.py)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# folder -> installed package (pyproject.toml's package-dir)
PACKAGES = {
    "infersim": "infersim",
    "simulator": "infersim.simulator",
    "executor": "infersim.executor",
    "analysis": "infersim.analysis",
}
OPTIONAL = {"torch", "transformers", "safetensors", "tokenizers", "optuna", "ray", "selenium"}
LAZY_ALLOWED = {"matplotlib"}


def _modules() -> dict[str, tuple[ast.Module, bool]]:
    """Every project module: name -> (syntax tree, is a package)."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if folder == "infersim" and parts[0] in PACKAGES:
                continue
            is_package = parts[-1] == "__init__"
            name = ".".join([package, *parts[:-1]] if is_package else [package, *parts])
            out[name] = (ast.parse(path.read_text()), is_package)
    return out


MODULES = _modules()


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement loads (relative names resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = module.split(".") if MODULES[module][1] else module.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - node.level + 1]
    target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
    return [target] + [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]


@cache
def _imports(module: str) -> tuple[list, list]:
    """(module-level imports, function-level imports with the statements around them)."""
    tree = MODULES[module][0]
    top, inner = [], []

    def visit(node, around):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (inner if any(isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef)) for a in around) else top).append(
                    (child, around)
                )
            visit(child, around + [child])

    visit(tree, [])
    return top, inner


@cache
def _optional_needed(module: str) -> frozenset[str]:
    """The optional packages importing `module` loads: everything reachable through module-level
    imports (and the packages around each module, which load first)."""
    needed, seen, todo = set(), set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name.split(".")[0] in OPTIONAL:
            needed.add(name.split(".")[0])
        elif name in MODULES:
            todo += [t for node, _ in _imports(name)[0] for t in _targets(name, node)]
            todo.append(name.rsplit(".", 1)[0])
    return frozenset(needed)


def _justified(module: str, node, around) -> bool:
    targets = _targets(module, node)
    if any(isinstance(a, ast.Try) for a in around) or any(t.split(".")[0] in LAZY_ALLOWED for t in targets):
        return True
    return any(not _optional_needed(t) <= _optional_needed(module) for t in targets)


def test_function_level_imports_only_load_what_their_module_must_not_need():
    lazy = [
        f"{module}:{node.lineno} {ast.unparse(node)}"
        for module in sorted(MODULES)
        for node, around in _imports(module)[1]
        if not _justified(module, node, around)
    ]
    assert lazy == [], "move these to the top of their module:\n" + "\n".join(lazy)


def test_the_checker_sees_the_project_and_its_optional_dependencies():
    # the check above means something only if it reads every package and tells optional loads apart
    assert {m.split(".")[1] for m in MODULES if m.count(".")} >= {"simulator", "executor", "analysis", "cli"}
    assert "torch" in _optional_needed("infersim.executor.runner")
    assert _optional_needed("infersim.simulator.simulation") == frozenset()
