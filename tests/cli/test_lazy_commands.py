"""The ``zephon`` command imports a subcommand's module only when that command runs: help and
the light subcommands start without the engine and the heavy libraries."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from zephon.cli import _COMMANDS, build_parser

HEAVY = ("pyarrow", "numpy", "torch", "transformers", "tokenizers", "fsspec", "zephon._engine")


RUN_AND_LIST = """
import atexit, runpy, sys
atexit.register(lambda: print(*sorted(sys.modules), sep="\\n", file=sys.stderr))
sys.argv = ["zephon", *sys.argv[1:]]
runpy.run_module("zephon", run_name="__main__", alter_sys=True)
"""
"""``python -m zephon ARGV``, then the names of the modules it imported, on stderr."""


def _imported(*argv: str) -> tuple[set[str], str]:
    """The modules ``zephon ARGV`` imported, and its stdout."""
    proc = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST, *argv], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = set(proc.stderr.split())
    assert "zephon.cli" in modules  # stderr is the list
    return modules, proc.stdout


LIGHT_HELP = [(c, "--help") for c in _COMMANDS if c != "demo"]  # demo's imports the engine


@pytest.mark.parametrize(
    "argv", [("--help",), ("--version",), ("checkpoint", "inspect", "--help"), *LIGHT_HELP]
)
def test_help_imports_no_heavy_library(argv: tuple[str, ...]) -> None:
    modules, _ = _imported(*argv)
    heavy = sorted(m for m in modules if m.startswith(HEAVY))
    assert heavy == []


def test_help_lists_every_command_without_importing_their_modules() -> None:
    modules, out = _imported("--help")
    for name, (module, help_line) in _COMMANDS.items():
        assert re.search(rf"^    {name}\s", out, re.M), name
        assert help_line.split()[0] in out
        assert module not in modules


def test_the_chosen_command_alone_is_imported() -> None:
    modules, out = _imported("diff", "--help")
    assert "usage: zephon diff" in out
    assert "zephon.cli._diff" in modules
    assert not modules & {m for m, _ in _COMMANDS.values() if m != "zephon.cli._diff"}


def test_full_parser_loads_every_command_with_its_help_line() -> None:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    assert list(commands.choices) == list(_COMMANDS)
    assert [a.help for a in commands._get_subactions()] == [h for _, h in _COMMANDS.values()]
    for name, sub in commands.choices.items():
        assert sub.get_default("func") is not None or sub._subparsers is not None, name


def test_a_command_module_that_passes_its_own_help_line_is_refused() -> None:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    with pytest.raises(ValueError, match="add it to _COMMANDS"):
        commands.add_parser("demo", help="a second help line")
