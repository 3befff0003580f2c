"""docs/cli.md lists, per command, exactly the exit codes its code can return.

The codes a command can return are read from its modules' source: every ``EXIT_*`` constant
they use, every ``return N`` of a literal, and ``fail(...)`` without a code (which is 1); plus
0, and 2 for a bad command line (argparse).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from zephon.cli import _common

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "src" / "zephon" / "cli"
MODULES = {
    "demo": [CLI / "_demo.py", ROOT / "src" / "zephon" / "demo.py"],
    "run": [CLI / "_run.py"],
    "convert": [CLI / "_convert.py"],
    "explain": [CLI / "_explain.py"],
    "index": [CLI / "_index.py"],
    "cache": [CLI / "_cache.py"],
    "checkpoint": [CLI / "_checkpoint.py"],
    "bench": [CLI / "_bench.py"],
    "capture": [CLI / "_capture.py", CLI / "_capture_tools.py"],
    "trace": [CLI / "_trace.py"],
    "diff": [CLI / "_diff.py"],
}


def codes_in(path: Path) -> set[int]:
    found = {0, _common.EXIT_USAGE}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name) and node.id.startswith("EXIT_"):
            found.add(getattr(_common, node.id))
        elif isinstance(node, ast.Return) and type(getattr(node.value, "value", None)) is int:
            found.add(node.value.value)
        elif _is_call(node, "fail") and len(node.args) < 3 and not node.keywords:
            found.add(_common.EXIT_FAILURE)
    return found


def _is_call(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) == name


def documented() -> dict[str, set[int]]:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| ([\d, ]+) \|$", text, flags=re.M)
    return {name: {int(c) for c in codes.split(",")} for name, codes in rows}


def test_docs_list_each_commands_exit_codes() -> None:
    from zephon.cli import _COMMANDS

    commands = {module.rsplit("._", 1)[1] for module, _help in _COMMANDS.values()}
    assert set(MODULES) == commands
    actual = {name: set().union(*(codes_in(p) for p in paths)) for name, paths in MODULES.items()}
    assert documented() == actual


def test_the_scan_sees_real_codes() -> None:
    assert codes_in(CLI / "_run.py") == {0, 1, 2, 130, 143}
    assert codes_in(CLI / "_explain.py") == {0, 2}
