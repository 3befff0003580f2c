"""The ``zephon`` command line."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from zephon.cli._parser import Parser

__all__ = ["build_parser", "main"]

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a tool killed by it

# Subcommand modules; each exposes ``register(subparsers)`` that sets ``func`` on its parser.
_COMMANDS = (
    "zephon.cli._demo",
    "zephon.cli._run",
    "zephon.cli._explain",
    "zephon.cli._index",
    "zephon.cli._cache",
    "zephon.cli._checkpoint",
    "zephon.cli._bench",
    "zephon.cli._capture",
    "zephon.cli._trace",
    "zephon.cli._diff",
    "zephon.cli._convert",
)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="zephon", description="Exactly reproducible LLM training data and RL token capture"
    )
    from zephon import __version__

    parser.add_argument("--version", action="version", version=f"zephon {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["run"]:  # the command itself, not a caller
        from zephon.cli._signals import install_startup_handlers

        install_startup_handlers()  # before the subcommands import the engine
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code = int(func(args) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``zephon explain p.yaml | head -1``): stop quietly, as a
        # Unix tool killed by SIGPIPE would, and keep the interpreter's final flush silent.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":
    sys.exit(main())
