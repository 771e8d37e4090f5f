"""`sim`: the command-line entry point. Each subcommand lives in its own module and registers
an argparse parser; user errors (InfersimError) print one line and exit 2."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading

import infersim.executor  # noqa: F401  (registers the zoo's model names, so every command can name them)
from infersim import __version__
from infersim.simulator.errors import InfersimError

from .commands import COMMANDS


class Terminated(KeyboardInterrupt):
    """SIGTERM (a batch scheduler, `timeout`, `kill`), raised like Ctrl-C so that every clean-up
    runs: temporary folders go, previous results stay."""


def _on_sigterm(signum, frame):
    if os.getpid() != _MAIN_PID:  # a forked worker (sweep, plan) dies as before; its parent cleans up
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise Terminated()


_MAIN_PID = os.getpid()


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's usage errors are bad input too: one line, exit 2
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The `sim` parser with full flags for the command `argv` names (every command when it
    names none we can tell) and a one-line entry for each of the others."""
    parser = _Parser(prog="sim", description="infersim: LLM inference roofline modeler and serving simulator")
    parser.add_argument("--version", action="version", version=f"infersim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    chosen = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    if chosen in COMMANDS:
        importlib.import_module(f"infersim.cli.{COMMANDS[chosen].module}").add_parser(sub)
    for name, command in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=command.help)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    global _MAIN_PID
    _MAIN_PID = os.getpid()
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        return int(args.func(args) or 0)
    except InfersimError as exc:
        sys.stderr.write(f"sim {args.command}: error: {exc}\n")
        return exc.exit_code
    except Terminated:
        sys.stderr.write(f"sim {args.command}: terminated (SIGTERM); earlier results left as they were\n")
        return 143
    except MemoryError:  # only reachable past the up-front estimate, with --no-memory-check
        sys.stderr.write(f"sim {args.command}: error: out of memory; make the work smaller\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"sim {args.command}: interrupted (SIGINT); earlier results left as they were\n")
        return 130
    except BrokenPipeError:
        return 0
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
