"""Fail when a module imports upward, or the engine reaches past the operator contracts.

Five rules over ``src/zephon``:

- layering: every top-level unit of ``zephon`` (a subpackage with everything below it, or a
  top-level module) has its place in ``LAYERS``, bottom to top, and imports only from layers
  below its own; an import upward or sideways (within one layer) fails unless
  ``UPWARD_ALLOWED`` lists it with why. So ``_engine`` imports nothing from ``_ops``
  (built-in operators are operators like any other) and ``work`` nothing from ``_ops``.
  ``capture`` and ``cli``, high as they are, drive the engine through ``Pipeline`` and never
  import ``_engine`` (``PAST_PIPELINE``). Inside ``_engine`` its parts (a sub-package, or a
  module beside them) keep an order of their own, ``ENGINE_LAYERS``, with exceptions in
  ``ENGINE_UPWARD_ALLOWED``. Every import counts, also those inside functions and under
  ``TYPE_CHECKING``;
- private modules: a module whose name starts with ``_`` (and whatever is inside it) is
  imported only from inside the package that holds it: ``zephon.io._converted`` from
  ``zephon.io``, ``zephon._ops._chat_spans`` from ``zephon._ops``; others use what that
  package exports (``PRIVATE_ALLOWED`` lists the exceptions, with why);
- no probing: a ``getattr``/``hasattr`` in ``_engine`` must be listed in ``ALLOWED`` with why,
  and no entry there may name an operator or source hook (``HOOKS``): the engine reads hooks
  through the typed protocols of ``zephon.ops.state`` and ``zephon.work``;
- no ``# type: ignore`` on a line that calls or reads a hook: a hook is typed, so mypy checks it;
- no control tag (``TAG_TOMBSTONE``, ``TAG_SNAPSHOT``, ...) named outside ``types.py``: control
  records are read through the typed ``SampleMeta.control``; the tag form is only what
  ``types.py`` converts checkpoints from and to.

Run: ``python scripts/check_layering.py [package root]`` (part of ``make lint``).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "zephon"

LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "errors",
        "_startup",
        "_exit",
        "_console",
        "_chat_encode",
        "_atomic",
        "_image_fields",
        "_fingerprint",
    ),
    ("_optional", "options", "_operator_defs", "_pixel_values", "_mrope", "_tokenizers"),
    ("io",),
    ("types",),
    ("_packed_images",),
    ("ops", "training", "_snapshot_codec"),
    ("checkpoints", "work", "_running"),
    ("_engine", "_config_values"),
    ("_ops",),
    ("_progress", "metrics", "_shared_batch", "_mixture_config"),
    ("provenance",),
    ("pipeline",),
    ("torch_data", "config", "testing"),
    ("torch_loader", "capture", "convert", "distributed", "demo"),
    ("integrations",),
    ("cli",),
    ("__main__", "__init__"),
)
"""The top-level units of ``zephon``, bottom to top: each imports only from the layers below
its own (the units of one layer are independent of each other). ``__init__`` is the root
package, which re-exports; importing it draws no edge."""

UPWARD_ALLOWED = {
    ("types.py", "training"): "SampleBatch.to_training() is the documented shorthand",
    ("types.py", "provenance"): "SampleBatch.provenance()/fingerprint() are the shorthand",
    ("pipeline.py", "torch_data"): "Pipeline.to_torch_dataset() is the shorthand",
    ("pipeline.py", "capture"): (
        "the builder's RL group operators (drop_equal_rewards, ...) read a capture store"
    ),
    ("config.py", "capture"): "a YAML source of kind capture_stream is a StreamingCaptureSource",
    ("provenance/_trace.py", "pipeline"): "trace() rebuilds the pipeline that made a batch",
    ("provenance/_trace.py", "config"): "trace() rebuilds it from its config file",
}
"""``(module, unit it imports from the same or a higher layer): why``."""

ENGINE_LAYERS: tuple[tuple[str, ...], ...] = (
    ("stats", "feed"),
    ("state",),
    ("handoff", "plan"),
    ("workers",),
    ("run",),
    ("__init__",),
)
"""The parts of ``_engine`` (its sub-packages, and ``stats.py`` beside them), bottom to top, by
the rule of ``LAYERS``: ``state`` (the stage core and what a restore starts from) under the
plan and the hand-off messages, those under the worker pools that carry them out, and those
under ``run`` (the runners, the engine and the engine process, which drive them all)."""

ENGINE_UPWARD_ALLOWED: dict[tuple[str, str], str] = {}
"""``(module of _engine, part it imports from the same or a higher layer): why``."""

PAST_PIPELINE = {"capture": ("_engine",), "cli": ("_engine",)}
"""``unit: units below it that it must still not import`` (it goes through ``Pipeline``)."""

HOOKS = frozenset(
    {
        "state_dict",
        "load_state_dict",
        "state_holds_records",
        "state_payloads_lazy",
        "on_marker",
        "pending_target",
        "reads_payload",
        "reassemble",
        "extract",
        "assemble",
        "seed",
        "fingerprint",
        "mixture",
    }
)

CONTROL_TAGS = frozenset(
    {
        "TAG_TOMBSTONE",
        "TAG_FLUSH_SENTINEL",
        "TAG_END_OF_DATA",
        "TAG_SNAPSHOT",
        "TAG_SNAPSHOT_REPLAY",
        "TAG_BOUNDARY_CID",
        "TAG_SKIPPED",
        "TAG_ERROR",
        "TAG_DROPPED_TOKENS",
        "TAG_CUT_TOKENS",
    }
)
CONTROL_TAGS_HOME = "types.py"
"""The one module that may name ``CONTROL_TAGS`` (it defines them and converts the tag form)."""

ALLOWED = {
    ("_engine/workers/ray_pool.py", "_private"): "ray's session name (no public API for it)",
    ("_engine/workers/ray_pool.py", "worker"): "ray's session name",
    ("_engine/workers/ray_pool.py", "global_worker"): "ray's session name",
    ("_engine/workers/ray_pool.py", "node"): "ray's session name",
    ("_engine/workers/ray_pool.py", "session_name"): "ray's session name",
    ("_engine/workers/worker_start.py", "_inheriting"): "multiprocessing's bootstrapping flag",
    ("_engine/workers/worker_start.py", "__file__"): "the main module's file, for an error message",
    ("_engine/workers/worker_start.py", "sched_getaffinity"): "absent on some platforms",
    ("_engine/state/stage.py", "zephon_op_name"): "an exception note the engine sets itself",
    ("_engine/stats.py", "name"): "the counters of OpStats, by field name",
}


PRIVATE_ALLOWED = {
    ("pipeline.py", "zephon._ops._chat_spans"): "Pipeline's signatures name the Literal types",
    ("pipeline.py", "zephon._ops._pack_groups"): "Pipeline's signatures name the Literal types",
    ("pipeline.py", "zephon._ops._packing_algos"): "Pipeline's signatures name the Literal types",
    ("pipeline.py", "zephon._ops._token_measure"): "token calibration measures through the ops",
    ("types.py", "zephon.provenance._extract"): "SampleBatch.provenance/fingerprint call the "
    "implementation: the package also holds trace(), which rebuilds whole pipelines",
    ("cli/_convert.py", "zephon.convert._plan"): "the default of --documents-per-shard",
    ("convert/_driver.py", "zephon.io._converted"): "convert writes the format io reads",
    ("convert/_shard.py", "zephon.io._converted"): "convert writes the format io reads",
    ("convert/_out.py", "zephon.io._converted"): "convert writes the format io reads",
    ("convert/_out.py", "zephon.io._paths"): "OUT is resolved as io resolves a dataset's URL",
    ("convert/_shard.py", "zephon.io._megatron"): "convert writes the format io reads",
}
"""``(module, private module it imports from outside that one's package): why``."""


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "zephon" and len(parts) > 1 else None


def _imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every absolute import in ``tree``, wherever it is."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            if node.module == "zephon":  # ``from zephon import _ops``
                yield from ((node.lineno, f"zephon.{alias.name}") for alias in node.names)


def _private_module(module: str) -> str | None:
    """``module`` up to its innermost ``_``-named part (None: no part is), the part that
    makes it private to the package above it."""
    parts = module.split(".")
    private = [i for i, p in enumerate(parts) if i and p.startswith("_") and p[:2] != "__"]
    return ".".join(parts[: private[-1] + 1]) if private else None


def _module_imports(tree: ast.AST, package: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every absolute import of a zephon module, with the modules of
    ``from zephon.x import _y`` (a name that is a file or folder under ``package``)."""
    for line, module in _imports(tree):
        if module.startswith("zephon."):
            yield line, module
    for node in ast.walk(tree):
        # ``from zephon import _ops`` is one of ``_imports`` already
        if isinstance(node, ast.ImportFrom) and node.module not in (None, "zephon"):
            if node.level:
                continue
            base = package.parent.joinpath(*node.module.split("."))
            for alias in node.names:
                if (base / alias.name).is_dir() or base.joinpath(f"{alias.name}.py").exists():
                    yield node.lineno, f"{node.module}.{alias.name}"


def _private_imports(rel: str, tree: ast.AST, package: Path) -> Iterator[str]:
    parts = ["zephon", *rel.removesuffix(".py").split("/")]
    importer = ".".join(parts[:-1])  # the package the module is in (its own, for __init__)
    for line, module in sorted(set(_module_imports(tree, package))):
        private = _private_module(module)
        if private is None or (rel, private) in PRIVATE_ALLOWED:
            continue
        holder = private.rpartition(".")[0]
        if importer != holder and not importer.startswith(f"{holder}."):
            yield (
                f"{rel}:{line}: imports {module}, private to {holder}; import what {holder} "
                "exports instead"
            )


def _probes(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, attribute)`` of every ``getattr``/``hasattr`` call (source text if dynamic)."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
        ):
            arg = node.args[1]
            name = arg.value if isinstance(arg, ast.Constant) else ast.unparse(arg)
            yield node.lineno, str(name)


def _control_tag_uses(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, name)`` of every import, name or attribute that is a control tag."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        else:
            continue
        yield from ((node.lineno, name) for name in names if name in CONTROL_TAGS)


def _ignored_hook_lines(text: str) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(text.splitlines(), 1):
        code, sep, comment = line.partition("#")
        if not sep or "type: ignore" not in comment:
            continue
        for hook in HOOKS:
            if f".{hook}" in code or f'"{hook}"' in code:
                yield number, hook


_LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}


def _upward_imports(rel: str, unit: str, tree: ast.AST) -> Iterator[str]:
    """An import of a unit in the same or a higher layer, or past the pipeline."""
    if unit not in _LAYER:
        yield f"{rel}:1: {unit} has no place in LAYERS; add it to the layer it belongs to"
        return
    for line, module in sorted(set(_imports(tree))):
        target = _unit(module)
        if target is None or target == unit or (rel, target) in UPWARD_ALLOWED:
            continue
        if target in PAST_PIPELINE.get(unit, ()):
            yield f"{rel}:{line}: {unit} must not import {target} ({module}); use Pipeline"
        elif _LAYER.get(target, -1) >= _LAYER[unit]:
            yield (
                f"{rel}:{line}: {unit} (layer {_LAYER[unit]}) imports {module} (layer "
                f"{_LAYER[target]}), which is not below it; move what it needs down, or "
                "list the import in UPWARD_ALLOWED with why"
            )


_ENGINE_LAYER = {part: level for level, parts in enumerate(ENGINE_LAYERS) for part in parts}


def _engine_part(module: str) -> str | None:
    """The part of ``_engine`` that ``module`` is in (None: not in ``_engine``)."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["zephon", "_engine"] and len(parts) > 2 else None


def _engine_imports(rel: str, tree: ast.AST) -> Iterator[str]:
    """An import, by a module of ``_engine``, of a part of it not below the module's own."""
    part = rel.split("/")[1].removesuffix(".py")
    if part not in _ENGINE_LAYER:
        yield f"{rel}:1: _engine part {part} has no place in ENGINE_LAYERS; add it to its layer"
        return
    imports = set(_imports(tree))
    for node in ast.walk(tree):  # ``from zephon._engine import run``
        if isinstance(node, ast.ImportFrom) and node.module == "zephon._engine":
            imports.update((node.lineno, f"zephon._engine.{a.name}") for a in node.names)
    for line, module in sorted(imports):
        target = _engine_part(module)
        if target is None or target == part or (rel, target) in ENGINE_UPWARD_ALLOWED:
            continue
        if _ENGINE_LAYER.get(target, len(ENGINE_LAYERS)) >= _ENGINE_LAYER[part]:
            yield (
                f"{rel}:{line}: _engine part {part} (layer {_ENGINE_LAYER[part]}) imports "
                f"{module} (layer {_ENGINE_LAYER.get(target, '?')}), which is not below it; "
                "move what it needs down, or list the import in ENGINE_UPWARD_ALLOWED with why"
            )


def check_file(path: Path, package: Path) -> list[str]:
    """The violations in one module of ``package``."""
    rel = path.relative_to(package).as_posix()
    unit = rel.split("/")[0].removesuffix(".py")
    text = path.read_text()
    tree = ast.parse(text, str(path))
    errors = list(_upward_imports(rel, unit, tree))
    errors.extend(_private_imports(rel, tree, package))
    if unit == "_engine":
        errors.extend(_engine_imports(rel, tree))
        for line, name in _probes(tree):
            if name in HOOKS:
                errors.append(f"{rel}:{line}: probes hook {name!r}; use its typed protocol")
            elif (rel, name) not in ALLOWED:
                errors.append(f"{rel}:{line}: getattr/hasattr of {name!r} is not in ALLOWED")
    for line, hook in _ignored_hook_lines(text):
        errors.append(f"{rel}:{line}: '# type: ignore' at a use of hook {hook!r}")
    if rel != CONTROL_TAGS_HOME:
        for line, name in sorted(set(_control_tag_uses(tree))):
            errors.append(f"{rel}:{line}: names {name}; read the typed SampleMeta.control")
    return errors


def violations(package: Path = PACKAGE) -> list[str]:
    """Every violation under ``package``; an ``ALLOWED`` entry naming a hook is one too."""
    errors = [f"ALLOWED names hook {name!r} ({rel})" for rel, name in ALLOWED if name in HOOKS]
    for path in sorted(package.rglob("*.py")):
        errors.extend(check_file(path, package))
    return errors


def main(argv: list[str]) -> int:
    package = Path(argv[1]) if len(argv) > 1 else PACKAGE
    errors = violations(package)
    for error in errors:
        print(error)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
