"""`sim medusa-train`: registered here, implemented in executor/medusa/cli.py (which imports
torch only when the command runs)."""

from infersim.executor.medusa.cli import add_parser, run

__all__ = ["add_parser", "run"]
