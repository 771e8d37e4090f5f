"""`sim medusa-train`: registered here, implemented in executor/medusa/cli.py (which imports
torch only when the command runs)."""

from infersim.executor.medusa.cli import add_parser as _add_executor_parser
from infersim.executor.medusa.cli import run

from .commands import COMMANDS

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    _add_executor_parser(sub, help=COMMANDS["medusa-train"].help)
