"""Every command's --help is its reference: each option that takes a value and has a default
says which, and each positional argument says what it is."""

import argparse

import pytest

from infersim.cli.commands import COMMANDS
from infersim.cli.main import build_parser


def _options(command: str) -> list[argparse.Action]:
    parser = build_parser([command])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices[command]._actions if not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_with_a_default_names_it(command):
    missing = [
        "/".join(a.option_strings)
        for a in _options(command)
        if a.option_strings and a.nargs != 0 and a.default not in (None, [], ()) and "default" not in (a.help or "")
    ]
    assert missing == [], f"sim {command}: options whose help does not give their default: {missing}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_positional_argument_is_explained(command):
    actions = [
        a for a in _options(command) if not isinstance(a, argparse._SubParsersAction)
    ]  # sub-commands list theirs
    bare = [a.dest for a in actions if not a.option_strings and not a.help]
    assert bare == [], f"sim {command}: positional arguments without help: {bare}"
