"""The structure checks of ``make lint``: function size/complexity, package import cycles and
the engine's layering (no built-in operator imports, no hook probes, no control tags read
outside ``types.py``).

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
layering = _script("check_layering")


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


def test_the_engine_keeps_to_the_operator_contract() -> None:
    assert layering.violations() == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "zephon" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "zephon"


def test_a_forbidden_import_is_reported_wherever_it_is(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "_engine/a.py": "def f():\n    from zephon._ops.batch import BatchOp\n",
            "capture/b.py": "import zephon._engine.stage\n",
            "work/c.py": "from zephon import _ops\n",
            "_ops/d.py": "import zephon._engine.stage\n",  # allowed: operators may use it
        },
    )
    found = layering.violations(package)
    assert found == [
        "_engine/a.py:2: _engine must not import _ops (zephon._ops.batch)",
        "capture/b.py:1: capture must not import _engine (zephon._engine.stage)",
        "work/c.py:1: work must not import _ops (zephon._ops)",
    ]


def test_a_hook_probe_or_unlisted_getattr_in_the_engine_is_reported(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "_engine/stage.py": (
                "x = getattr(acc, 'state_dict', None)\n"
                "y = hasattr(source, 'seed')\n"
                "z = getattr(exc, 'zephon_op_name', None)\n"  # listed in ALLOWED
                "w = getattr(op, 'something_else', None)\n"
            ),
            "ops/e.py": "x = getattr(acc, 'state_dict', None)\n",  # outside the engine
        },
    )
    assert layering.violations(package) == [
        "_engine/stage.py:1: probes hook 'state_dict'; use its typed protocol",
        "_engine/stage.py:2: probes hook 'seed'; use its typed protocol",
        "_engine/stage.py:4: getattr/hasattr of 'something_else' is not in ALLOWED",
    ]


def test_a_type_ignore_at_a_hook_call_is_reported(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "_engine/states.py": (
                "acc.load_state_dict(lane, state)  # type: ignore[attr-defined]\n"
                "other(1)  # type: ignore[arg-type]\n"
            )
        },
    )
    assert layering.violations(package) == [
        "_engine/states.py:1: '# type: ignore' at a use of hook 'load_state_dict'"
    ]


def test_a_control_tag_named_outside_types_is_reported(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "_engine/tail.py": (
                "from zephon.types import TAG_TOMBSTONE, TAG_PACKING\n"
                "dead = TAG_TOMBSTONE in meta.tags\n"
                "packed = TAG_PACKING in meta.tags\n"  # not a control tag
            ),
            "_ops/pack.py": "import zephon.types as t\nx = meta.tags[t.TAG_SNAPSHOT_REPLAY]\n",
            "types.py": "TAG_TOMBSTONE = '_tombstone'\nx = {TAG_TOMBSTONE: True}\n",
        },
    )
    assert layering.violations(package) == [
        "_engine/tail.py:1: names TAG_TOMBSTONE; read the typed SampleMeta.control",
        "_engine/tail.py:2: names TAG_TOMBSTONE; read the typed SampleMeta.control",
        "_ops/pack.py:2: names TAG_SNAPSHOT_REPLAY; read the typed SampleMeta.control",
    ]


def test_a_private_module_imported_from_outside_its_package_is_reported(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "io/__init__.py": "from zephon.io._converted import X\n",  # its own package
            "io/_converted.py": "X = 1\n",
            "io/sub/a.py": "import zephon.io._converted\n",  # inside io: allowed
            "convert/b.py": "from zephon.io._converted import X\n",
            "convert/c.py": "def f():\n    from zephon.io import _converted\n",
            "training.py": "from zephon._ops._chat_spans import LossScope\n",
            "_ops/_chat_spans.py": "LossScope = str\n",
            "_ops/d.py": "from zephon._ops._chat_spans import LossScope\n",
            "capture/e.py": "from zephon.capture._kit import _Ctx\n",  # a name, not a module
            "capture/_kit.py": "_Ctx = 1\n",
            "cli/f.py": "from zephon._running import running_operator\n",  # held by zephon
        },
    )
    assert layering.violations(package) == [
        "convert/b.py:1: imports zephon.io._converted, private to zephon.io; import what "
        "zephon.io exports instead",
        "convert/c.py:2: imports zephon.io._converted, private to zephon.io; import what "
        "zephon.io exports instead",
        "training.py:1: imports zephon._ops._chat_spans, private to zephon._ops; import what "
        "zephon._ops exports instead",
    ]


def test_the_command_line_does_not_import_the_engine(tmp_path: Path) -> None:
    package = _tree(tmp_path, {"cli/_leave.py": "from zephon._engine.joins import f\n"})
    assert layering.violations(package) == [
        "cli/_leave.py:1: cli must not import _engine (zephon._engine.joins)"
    ]


def test_every_private_import_allowed_is_still_made() -> None:
    package = ROOT / "src" / "zephon"
    for rel, module in layering.PRIVATE_ALLOWED:
        text = (package / rel).read_text()
        assert module.rpartition(".")[2] in text, (rel, module)
