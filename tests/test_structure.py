"""The structure checks of ``make lint``: function size/complexity and package import cycles.

They run on the real source tree (so a test run fails where ``make lint`` would), and on small
synthetic trees to show each check catches what it is for.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


complexity = _script("check_complexity")
cycles = _script("check_import_cycles")


def test_no_function_in_src_is_over_the_limits() -> None:
    assert [f"{path}:{line} {name}" for path, name, line, *_ in complexity.offenders()] == []


def test_a_long_branchy_function_is_reported(tmp_path: Path) -> None:
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(25))
    (tmp_path / "big.py").write_text(f"def branchy(x):\n{branches}    return -1\n")
    body = "".join(f"    y = {i}\n" for i in range(90))
    (tmp_path / "long.py").write_text(f"class C:\n  def long(self):\n{body}    return y\n")
    found = {name: (cc, lines) for _, name, _, cc, lines in complexity.offenders(tmp_path)}
    assert found["branchy"][0] > complexity.MAX_CC
    assert found["C.long"][1] > complexity.MAX_LINES


def test_the_packages_import_no_cycle() -> None:
    assert cycles.cycles(cycles.graph()) == []


def test_a_cycle_between_packages_is_found() -> None:
    edges = {"zephon.a": {"zephon.b"}, "zephon.b": {"zephon.c"}, "zephon.c": {"zephon.a"}}
    edges["zephon.d"] = {"zephon.a"}
    assert cycles.cycles(edges) == [["zephon.a", "zephon.b", "zephon.c"]]


def test_load_time_imports_skip_functions_and_type_checking() -> None:
    import ast

    tree = ast.parse(
        "import zephon.io\n"
        "if TYPE_CHECKING:\n    import zephon.work\n"
        "try:\n    import zephon.capture\nexcept ImportError:\n    pass\n"
        "def f():\n    import zephon.cli\n"
    )
    names = [n.names[0].name for n in cycles._load_time_imports(tree.body)]
    assert names == ["zephon.io", "zephon.capture"]
