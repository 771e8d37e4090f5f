"""The manual points at real things: every relative link in README.md and docs/ names a file of
the repository (and a heading of it, when it has an anchor), and every `sim` command in a code
block or code span of README.md and docs/ names a subcommand, flags its parser accepts and files the
repository holds, as every `python -m infersim...` module and `python script.py` they name exists,
and every name a Python example imports (or a code span spells `infersim.a.b.name`) is defined
where it says."""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from infersim.cli.commands import COMMANDS
from infersim.cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# [text](target) and ![alt](target); a target ends at whitespace (an optional "title" follows)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", flags=re.S | re.M)
INLINE = re.compile(r"`(sim [^`]+)`")
FLAG = re.compile(r"(?<![\w./-])(--?[A-Za-z][\w-]*)")
# a path inside the repository as commands write it (outputs and placeholders aside)
REPO_PATH = re.compile(r"^(?:examples|hwprofiles|traces|benchmarks|docs)/[^<>*]+$")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (links live there)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def relative_links(path: Path) -> list[str]:
    targets = LINK.findall(_prose(path.read_text()))
    return [t for t in targets if not re.match(r"^[a-z][a-z+.-]*:", t)]  # http:, mailto: ...


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text.replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", FENCE.sub("", path.read_text()), flags=re.M):
        base = slug(heading)
        name, n = base, 0
        while name in found:  # GitHub numbers repeated headings: x, x-1, x-2
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


LINKS = [(doc, target) for doc in DOCS for target in relative_links(doc)]


@pytest.mark.parametrize("doc,target", LINKS, ids=[f"{_rel(d)}->{t}" for d, t in LINKS])
def test_relative_link_resolves(doc, target):
    file_part, _, anchor = target.partition("#")
    dest = (doc.parent / file_part).resolve() if file_part else doc
    assert dest.exists(), f"{_rel(doc)}: link to {target}: no such file"
    assert dest.is_relative_to(ROOT), f"{_rel(doc)}: link to {target} leaves the repository"
    if anchor and dest.suffix == ".md":
        assert anchor in anchors(dest), f"{_rel(doc)}: link to {target}: no heading #{anchor} in {_rel(dest)}"


def _commands_in(line: str) -> list[str]:
    """The `sim ...` commands of one shell line: each segment of a && / ; / pipe chain that
    starts with `sim` (a `$ ` prompt allowed); output lines (`sim run: error: ...`) are not."""
    line = re.sub(r"(^|\s)#.*$", "", line)
    segments = re.split(r"\s(?:&&|\|\||;|\|)\s", line)
    found = [re.sub(r"^\s*(?:\$\s+)?", "", s) for s in segments]
    return [s.strip() for s in found if re.match(r"sim\s+[\w-]+(\s|$)", s)]


def documented_commands(path: Path) -> list[str]:
    """`sim` commands in the page's fenced shell blocks (continuation lines joined) and inline
    code spans."""
    text = path.read_text()
    commands = []
    for lang, body in FENCE.findall(text):
        if lang.strip() in ("", "bash", "sh", "shell", "console"):
            for line in re.sub(r"\\\n\s*", " ", body).splitlines():
                commands += _commands_in(line)
    return commands + [c for c in INLINE.findall(FENCE.sub("", text)) if _commands_in(c)]


def subparser(words: list[str]) -> argparse.ArgumentParser:
    """The parser of `sim WORDS...`: the subcommand's, or its action's (`sim zoo build`)."""
    parser = build_parser(words)
    for word in words:
        choices = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if not choices or word not in choices:
            break
        parser = choices[word]
    return parser


@functools.cache
def accepted_flags(words: tuple[str, ...]) -> tuple[str, frozenset[str]]:
    """The prog and the option strings `sim WORDS... --help` lists (hidden ones aside), built
    once per command (many pages quote the same ones)."""
    parser = subparser(list(words))
    listed = [a for a in parser._actions if a.help != argparse.SUPPRESS]
    return parser.prog, frozenset(flag for action in listed for flag in action.option_strings)


COMMAND_LINES = [(doc, c) for doc in DOCS for c in documented_commands(doc)]


@pytest.mark.parametrize("doc,command", COMMAND_LINES, ids=[f"{_rel(d)}: {c}" for d, c in COMMAND_LINES])
def test_documented_command_exists(doc, command):
    words = command.split()
    assert words[1] in COMMANDS, f"{_rel(doc)}: `{command}`: no subcommand {words[1]!r}"
    prog, accepted = accepted_flags(tuple(w for w in words[1:3] if re.fullmatch(r"\w[\w-]*", w)))
    unknown = [f for f in FLAG.findall(command.replace("/--", " --")) if f not in accepted]
    assert not unknown, f"{_rel(doc)}: `{command}`: {prog} has no {', '.join(unknown)}"
    for token in shlex.split(re.sub(r"[\[\]]", " ", command)):
        value = token.partition("=")[2] if token.startswith("-") else token
        if REPO_PATH.match(value):
            assert (ROOT / value).exists(), f"{_rel(doc)}: `{command}` names {value}, not in the repository"


def python_commands(path: Path) -> list[str]:
    """The modules (`python -m M`) and scripts (`python FILE.py`) the page runs, in code."""
    code = "\n".join(body for _, body in FENCE.findall(path.read_text())) + "\n".join(
        re.findall(r"`([^`]+)`", FENCE.sub("", path.read_text()))
    )
    return re.findall(r"\bpython3?\s+(-m\s+[\w.]+|[\w./-]+\.py)\b", code)


PYTHON = [(doc, c) for doc in DOCS for c in python_commands(doc)]


@pytest.mark.parametrize("doc,command", PYTHON, ids=[f"{_rel(d)}: python {c}" for d, c in PYTHON])
def test_documented_python_command_exists(doc, command):
    if command.startswith("-m"):
        module = command.split()[1]
        assert module == "pytest" or module.startswith("infersim."), f"{_rel(doc)}: python {command}: not infersim's"
        assert importlib.util.find_spec(module) is not None, f"{_rel(doc)}: python {command}: no such module"
    else:
        assert (ROOT / command).is_file(), f"{_rel(doc)}: python {command}: no such file"


# the repository's own top-level folders install under `infersim.`: `from simulator.x import y`
# runs only from a checkout's root, never for a user
REPO_PACKAGES = {"simulator", "executor", "analysis"}
IMPORT_LINE = re.compile(r"^\s*from\s+([\w.]+)\s+import\s+(\([^)]*\)|[^\n#]+)|^\s*import\s+([\w.]+)", re.M)
DOTTED = re.compile(r"`(infersim(?:\.\w+)+)")


def python_names(path: Path) -> list[tuple[str, str]]:
    """(module, name) pairs the page's Python examples import (name "" for `import M`), and the
    `infersim.a.b.name` spelled in its prose code spans (the last part the name)."""
    text = path.read_text()
    found = []
    for lang, body in FENCE.findall(text):
        if lang.strip() not in ("python", "py"):
            continue
        for module, names, plain in IMPORT_LINE.findall(body):
            if plain:
                found.append((plain, ""))
            for name in filter(None, (n.split(" as ")[0].strip() for n in names.strip("()").split(","))):
                found.append((module, name))
    for dotted in DOTTED.findall(FENCE.sub("", text)):
        module, _, name = dotted.rpartition(".")
        found.append((module, name))
    return found


@functools.cache
def top_level_names(module: str) -> frozenset[str] | None:
    """What `module` defines at its top level, read from its source (nothing is imported but
    its parent packages); None when there is no such module."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None if spec is None else frozenset({"*"})
    names = set()
    for node in ast.parse(Path(spec.origin).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for tgt in targets for n in ast.walk(tgt) if isinstance(n, ast.Name))
    return frozenset(names)


def defines(module: str, name: str) -> bool:
    """`from module import name` works: a module of that name, or a name its source defines."""
    try:
        if importlib.util.find_spec(f"{module}.{name}") is not None:
            return True
    except ModuleNotFoundError:
        pass
    names = top_level_names(module)
    return names is not None and (name in names or "*" in names or "__getattr__" in names)


PY_NAMES = [(doc, m, n) for doc in DOCS for m, n in python_names(doc)]


@pytest.mark.parametrize("doc,module,name", PY_NAMES, ids=[f"{_rel(d)}: {m} {n}" for d, m, n in PY_NAMES])
def test_documented_python_name_exists(doc, module, name):
    top = module.split(".")[0]
    assert top not in REPO_PACKAGES, f"{_rel(doc)}: `{module}` is `infersim.{module}` once installed"
    if top != "infersim":
        return  # numpy, torch, ...: not ours to check
    if not name:
        assert importlib.util.find_spec(module) is not None, f"{_rel(doc)}: import {module}: no such module"
        return
    while top_level_names(module) is None and "." in module:  # `infersim.a.b.Class.method`
        module, _, outer = module.rpartition(".")
        name = outer
    assert defines(module, name), f"{_rel(doc)}: {module} has no {name}"


# a path of the repository as prose names it in a code span (`simulator/engine/memory.py`,
# `tests/x.py::test_y`, `executor/medusa/`); placeholders and outputs (<name>, *, NAME, runs/) aside
REPO_TOP = (
    "simulator/",
    "executor/",
    "analysis/",
    "infersim/",
    "hwprofiles/",
    "traces/",
    "benchmarks/",
    "tests/",
    "examples/",
    "docs/",
    ".ci/",
)


def repo_paths(path: Path) -> list[str]:
    """The repository paths the page's prose code spans name."""
    found = []
    for span in re.findall(r"`([^`\n]+)`", FENCE.sub("", path.read_text())):
        for token in re.split(r"[\s,()]+", span):
            token = token.strip(".:;").split("::")[0]
            if token.startswith(REPO_TOP) and not re.search(r"[<>*{}]|NAME|runs/", token):
                found.append(re.sub(r"(\.py)\.\w+$", r"\1", token))  # `x/y.py.function`
    return found


REPO_PATHS = [(doc, p) for doc in DOCS for p in repo_paths(doc)]


@pytest.mark.parametrize("doc,target", REPO_PATHS, ids=[f"{_rel(d)}: {p}" for d, p in REPO_PATHS])
def test_documented_repo_path_exists(doc, target):
    assert (ROOT / target).exists() or (doc.parent / target).exists(), f"{_rel(doc)}: `{target}`: no such file"


def test_the_checks_find_what_they_look_for():
    """The extraction sees the README's two quick-start commands and its links, so an empty
    parametrization cannot pass for a clean manual."""
    readme = documented_commands(ROOT / "README.md")
    assert "sim run --workload chatbot.yaml" in readme
    assert "docs/profiling.md#collectives" in relative_links(ROOT / "README.md")
    assert _commands_in("$ sim run -w x -n 3  # a comment") == ["sim run -w x -n 3"]
    assert _commands_in("sim run: error: bad") == []
    assert "benchmarks/sim_speed.py" in python_commands(ROOT / "README.md")
    assert slug("The pass rule") == "the-pass-rule"
    assert slug("`sim exec` and `--fast`") == "sim-exec-and---fast"
    assert ("infersim.executor.medusa.decode", "medusa_decode") in python_names(ROOT / "docs/executor-medusa.md")
    assert not defines("infersim.simulator.hardware.collectives_fit", "no_such_name")
    assert defines("infersim.simulator.costmodel", "BatchShape")
    assert "simulator/engine/memory.py" in repo_paths(ROOT / "README.md")
