"""The structure checks of ``make lint``: function size/complexity, package import cycles and
the engine's layering (no built-in operator imports, no hook probes, no control tags read
outside ``types.py``).

They run on the real source tree (so a test run fails where ``make lint`` would), and on small
synthetic trees to show each check catches what it is for.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "zephon" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "zephon"


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


def test_the_modules_import_no_cycle_but_the_justified_ones() -> None:
    assert cycles.unjustified(cycles.graph()) == []


def test_every_justified_cycle_is_a_cycle_found_today() -> None:
    """The list stays tight: a cycle that shrank or went is taken off it."""
    found = {frozenset(component) for component in cycles.cycles(cycles.graph())}
    assert set(cycles.JUSTIFIED) == found


def test_a_cycle_between_modules_is_found() -> None:
    edges = {"zephon.a": {"zephon.b"}, "zephon.b": {"zephon.c"}, "zephon.c": {"zephon.a"}}
    edges["zephon.d"] = {"zephon.a"}
    assert cycles.cycles(edges) == [["zephon.a", "zephon.b", "zephon.c"]]


def _run_cycles(package: Path) -> subprocess.CompletedProcess[str]:
    script = ROOT / "scripts" / "check_import_cycles.py"
    return subprocess.run(
        [sys.executable, str(script), str(package)], capture_output=True, text=True, timeout=120
    )


def test_a_cycle_closed_inside_a_function_fails_the_check(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": "def f():\n    if True:\n        from zephon.high import g\n",
            "high.py": "from zephon.low import f\n",
            "other.py": "import zephon.low\n",
        },
    )
    result = _run_cycles(package)
    assert result.returncode == 1
    assert result.stdout == (
        "import cycle of 2 modules: zephon.high:1 -> zephon.low; zephon.low:3 -> zephon.high; "
        "move the code an upward import needs into the layer below, or justify the cycle in "
        "JUSTIFIED\n"
    )


def test_type_checking_imports_draw_no_edge(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "low.py": "if TYPE_CHECKING:\n    from zephon.high import g\nelse:\n    g = None\n",
            "high.py": "from zephon.low import g\n",
        },
    )
    assert _run_cycles(package).returncode == 0


def test_an_import_of_a_submodule_is_an_edge_to_it_not_to_its_package(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "from zephon.pkg.a import A\n",
            "pkg/a.py": "A = 1\n",
            "pkg/b.py": "def f():\n    from zephon.pkg import a\n    from . import c\n",
            "pkg/c.py": "from zephon.pkg import A\n",
        },
    )
    assert cycles.graph(package) == {
        "zephon.pkg": {"zephon.pkg.a": 1},
        "zephon.pkg.a": {},
        "zephon.pkg.b": {"zephon.pkg.a": 2, "zephon.pkg.c": 3},
        "zephon.pkg.c": {"zephon.pkg": 1},
    }


def test_a_cycle_passes_only_within_one_justified_set() -> None:
    edges = {"zephon.a": {"zephon.b": 1}, "zephon.b": {"zephon.a": 2}}
    assert cycles.unjustified(edges, {frozenset({"zephon.a", "zephon.b"}): "why"}) == []
    edges["zephon.b"]["zephon.c"] = 3
    edges["zephon.c"] = {"zephon.a": 4}  # the justified cycle grew by one module
    (error,) = cycles.unjustified(edges, {frozenset({"zephon.a", "zephon.b"}): "why"})
    assert error.startswith("import cycle of 3 modules: zephon.a:1 -> zephon.b; ")


def test_the_engine_keeps_to_the_operator_contract() -> None:
    assert layering.violations() == []


def test_an_import_that_is_not_downward_is_reported_wherever_it_is(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "_engine/run/a.py": "def f():\n    from zephon._ops.batch import BatchOp\n",
            "work/c.py": "from zephon import _ops\n",
            "ops/s.py": "if TYPE_CHECKING:\n    from zephon.pipeline import Pipeline\n",
            "ops/t.py": "import zephon.training\n",  # a unit of the same layer
            "_ops/d.py": "import zephon._engine.state.stage\n",  # downward: operators may use it
            "config.py": "from zephon.pipeline import Pipeline\n",  # downward
        },
    )
    fix = "which is not below it; move what it needs down, or list the import in UPWARD_ALLOWED "
    fix += "with why"
    n = {unit: index for index, units in enumerate(layering.LAYERS) for unit in units}
    assert layering.violations(package) == [
        f"_engine/run/a.py:2: _engine (layer {n['_engine']}) imports zephon._ops.batch "
        f"(layer {n['_ops']}), {fix}",
        f"ops/s.py:2: ops (layer {n['ops']}) imports zephon.pipeline "
        f"(layer {n['pipeline']}), {fix}",
        f"ops/t.py:1: ops (layer {n['ops']}) imports zephon.training "
        f"(layer {n['training']}), {fix}",
        f"work/c.py:1: work (layer {n['work']}) imports zephon._ops (layer {n['_ops']}), {fix}",
    ]


def test_the_layering_script_fails_on_an_upward_import(tmp_path: Path) -> None:
    package = _tree(tmp_path, {"io/x.py": "def f():\n    import zephon.config\n"})
    script = ROOT / "scripts" / "check_layering.py"
    result = subprocess.run(
        [sys.executable, str(script), str(package)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    n = {unit: index for index, units in enumerate(layering.LAYERS) for unit in units}
    expected = f"io/x.py:2: io (layer {n['io']}) imports zephon.config (layer {n['config']})"
    assert result.stdout.startswith(expected)


def test_an_upward_import_listed_with_its_reason_passes(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "types.py": "def f():\n    from zephon.training import to_training\n",
            "types2.py": "X = 1\n",
        },
    )
    assert ("types.py", "training") in layering.UPWARD_ALLOWED
    assert layering.violations(package) == [
        "types2.py:1: types2 has no place in LAYERS; add it to the layer it belongs to"
    ]


def test_the_layers_name_every_unit_once_and_each_exception_goes_upward() -> None:
    units = [unit for layer in layering.LAYERS for unit in layer]
    src = ROOT / "src" / "zephon"
    present = {p.stem for p in src.glob("*.py")} | {
        p.parent.name for p in src.glob("*/__init__.py")
    }
    assert len(units) == len(set(units)) and set(units) == present
    for (rel, target), _why in layering.UPWARD_ALLOWED.items():
        unit = rel.split("/")[0].removesuffix(".py")
        assert layering._LAYER[target] >= layering._LAYER[unit], (rel, target)
        assert f"zephon.{target}" in (ROOT / "src" / "zephon" / rel).read_text(), (rel, target)


def test_an_engine_part_importing_one_not_below_it_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = _tree(
        tmp_path,
        {
            "_engine/workers/a.py": "def f():\n    from zephon._engine.run.runners import X\n",
            "_engine/state/b.py": "from zephon._engine import plan\n",
            "_engine/plan/c.py": "import zephon._engine.handoff.shm\n",  # same layer
            "_engine/plan/plan.py": "from zephon._engine.run.runners import REGISTRY\n",  # listed
            "_engine/run/d.py": "from zephon._engine.state.stage import StageCore\n",  # down
            "_engine/cache/e.py": "X = 1\n",
        },
    )
    n = layering._ENGINE_LAYER
    fix = "which is not below it; move what it needs down, or list the import in "
    fix += "ENGINE_UPWARD_ALLOWED with why"
    monkeypatch.setitem(layering.ENGINE_UPWARD_ALLOWED, ("_engine/plan/plan.py", "run"), "why")
    assert layering.violations(package) == [
        "_engine/cache/e.py:1: _engine part cache has no place in ENGINE_LAYERS; add it to its "
        "layer",
        f"_engine/plan/c.py:1: _engine part plan (layer {n['plan']}) imports "
        f"zephon._engine.handoff.shm (layer {n['handoff']}), {fix}",
        f"_engine/state/b.py:1: _engine part state (layer {n['state']}) imports "
        f"zephon._engine.plan (layer {n['plan']}), {fix}",
        f"_engine/workers/a.py:2: _engine part workers (layer {n['workers']}) imports "
        f"zephon._engine.run.runners (layer {n['run']}), {fix}",
    ]


def test_the_engine_parts_each_have_one_layer_and_each_exception_goes_upward() -> None:
    parts = [part for layer in layering.ENGINE_LAYERS for part in layer]
    engine = ROOT / "src" / "zephon" / "_engine"
    present = {p.stem for p in engine.glob("*.py")} | {p.parent.name for p in engine.glob("*/*.py")}
    assert len(parts) == len(set(parts)) and set(parts) == present
    for (rel, target), _why in layering.ENGINE_UPWARD_ALLOWED.items():
        part = rel.split("/")[1]
        assert layering._ENGINE_LAYER[target] >= layering._ENGINE_LAYER[part], (rel, target)
        text = (ROOT / "src" / "zephon" / rel).read_text()
        assert f"zephon._engine.{target}" in text, (rel, target)


def test_a_hook_probe_or_unlisted_getattr_in_the_engine_is_reported(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "_engine/state/stage.py": (
                "x = getattr(acc, 'state_dict', None)\n"
                "y = hasattr(source, 'seed')\n"
                "z = getattr(exc, 'zephon_op_name', None)\n"  # listed in ALLOWED
                "w = getattr(op, 'something_else', None)\n"
            ),
            "ops/e.py": "x = getattr(acc, 'state_dict', None)\n",  # outside the engine
        },
    )
    assert layering.violations(package) == [
        "_engine/state/stage.py:1: probes hook 'state_dict'; use its typed protocol",
        "_engine/state/stage.py:2: probes hook 'seed'; use its typed protocol",
        "_engine/state/stage.py:4: getattr/hasattr of 'something_else' is not in ALLOWED",
    ]


def test_a_type_ignore_at_a_hook_call_is_reported(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "_engine/state/states.py": (
                "acc.load_state_dict(lane, state)  # type: ignore[attr-defined]\n"
                "other(1)  # type: ignore[arg-type]\n"
            )
        },
    )
    assert layering.violations(package) == [
        "_engine/state/states.py:1: '# type: ignore' at a use of hook 'load_state_dict'"
    ]


def test_a_control_tag_named_outside_types_is_reported(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "_engine/handoff/tail.py": (
                "from zephon.types import TAG_TOMBSTONE, TAG_PACKING\n"
                "dead = TAG_TOMBSTONE in meta.tags\n"
                "packed = TAG_PACKING in meta.tags\n"  # not a control tag
            ),
            "_ops/pack.py": "import zephon.types as t\nx = meta.tags[t.TAG_SNAPSHOT_REPLAY]\n",
            "types.py": "TAG_TOMBSTONE = '_tombstone'\nx = {TAG_TOMBSTONE: True}\n",
        },
    )
    assert layering.violations(package) == [
        "_engine/handoff/tail.py:1: names TAG_TOMBSTONE; read the typed SampleMeta.control",
        "_engine/handoff/tail.py:2: names TAG_TOMBSTONE; read the typed SampleMeta.control",
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
            "config.py": "from zephon._ops._chat_spans import LossScope\n",
            "_ops/_chat_spans.py": "LossScope = str\n",
            "_ops/d.py": "from zephon._ops._chat_spans import LossScope\n",
            "capture/e.py": "from zephon.capture._kit import _Ctx\n",  # a name, not a module
            "capture/_kit.py": "_Ctx = 1\n",
            "cli/f.py": "from zephon._running import running_operator\n",  # held by zephon
        },
    )
    assert layering.violations(package) == [
        "config.py:1: imports zephon._ops._chat_spans, private to zephon._ops; import what "
        "zephon._ops exports instead",
        "convert/b.py:1: imports zephon.io._converted, private to zephon.io; import what "
        "zephon.io exports instead",
        "convert/c.py:2: imports zephon.io._converted, private to zephon.io; import what "
        "zephon.io exports instead",
    ]


def test_capture_and_the_command_line_do_not_reach_past_the_pipeline(tmp_path: Path) -> None:
    package = _tree(
        tmp_path,
        {
            "cli/_leave.py": "from zephon._engine.workers.joins import f\n",
            "capture/b.py": "import zephon._engine.stats\n",
            "capture/c.py": "from zephon.pipeline import Pipeline\n",
        },
    )
    assert layering.violations(package) == [
        "capture/b.py:1: capture must not import _engine (zephon._engine.stats); use Pipeline",
        "cli/_leave.py:1: cli must not import _engine (zephon._engine.workers.joins); use Pipeline",
    ]


def test_every_private_import_allowed_is_still_made() -> None:
    package = ROOT / "src" / "zephon"
    for rel, module in layering.PRIVATE_ALLOWED:
        text = (package / rel).read_text()
        assert module.rpartition(".")[2] in text, (rel, module)
