"""The ``zephon`` command line."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from zephon.cli._parser import Parser

__all__ = ["build_parser", "main"]

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a tool killed by it

# Each subcommand: its module, which exposes ``register(subparsers)`` (it adds the parser of
# that name and sets ``func`` on it), and the line ``zephon --help`` shows for it.
_COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "zephon.cli._demo",
        "generate a small corpus and run decode -> tokenize -> batch on it",
    ),
    "run": ("zephon.cli._run", "run a pipeline described in YAML (progress, checkpoints, resume)"),
    "explain": (
        "zephon.cli._explain",
        "show the compiled plan of a YAML pipeline (text, json, mermaid, dot)",
    ),
    "index": (
        "zephon.cli._index",
        "scan a dataset folder once and write index.json (row counts per shard)",
    ),
    "cache": ("zephon.cli._cache", "list or clean the node-local shard cache"),
    "checkpoint": ("zephon.cli._checkpoint", "inspect a pipeline checkpoint or compare two"),
    "bench": (
        "zephon.cli._bench",
        "run the benchmarks (small sizes), write a JSON report and PNG plots",
    ),
    "capture": ("zephon.cli._capture", "token capture tools"),
    "trace": (
        "zephon.cli._trace",
        "the documents of training step N, or the steps that trained on a document",
    ),
    "diff": (
        "zephon.cli._diff",
        "first step at which two runs (provenance logs or records) differ",
    ),
    "convert": (
        "zephon.cli._convert",
        "tokenize a pipeline's datasets into Megatron .bin/.idx shards (resumable)",
    ),
}


class _Commands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """The subcommands, each module imported only when its command is parsed: ``zephon
    --help`` or ``zephon checkpoint inspect`` then loads neither the engine nor numpy and
    pyarrow, which every ``zephon`` call would otherwise pay for at start."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unloaded: dict[str, str] = {}
        for name, (module, help_line) in _COMMANDS.items():
            super().add_parser(name, help=help_line)  # a placeholder until it is chosen
            self._unloaded[name] = module

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """The real parser of ``name`` (its help line stays the one of :data:`_COMMANDS`)."""
        if "help" in kwargs or name not in _COMMANDS:
            raise ValueError(f"subcommand {name!r}: add it to _COMMANDS, with its help line")
        del self._name_parser_map[name]
        parser: argparse.ArgumentParser = super().add_parser(name, **kwargs)
        return parser

    def load(self, name: str) -> None:
        module = self._unloaded.pop(name, None)
        if module is not None:
            importlib.import_module(module).register(self)

    def load_all(self) -> None:
        for name in list(self._unloaded):
            self.load(name)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        self.load(values[0])  # argparse checked it is one of the names
        super().__call__(parser, namespace, values, option_string)


def _parser() -> tuple[argparse.ArgumentParser, _Commands]:
    parser = Parser(
        prog="zephon", description="Exactly reproducible LLM training data and RL token capture"
    )
    from zephon import __version__

    parser.add_argument("--version", action="version", version=f"zephon {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", action=_Commands)
    assert isinstance(commands, _Commands)
    return parser, commands


def build_parser() -> argparse.ArgumentParser:
    """The whole parser, every subcommand loaded (``main`` loads only the one it runs)."""
    parser, commands = _parser()
    commands.load_all()
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["run"]:  # the command itself, not a caller
        from zephon.cli._signals import install_startup_handlers

        install_startup_handlers()  # before the subcommands import the engine
    parser, _ = _parser()
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
