"""Fail when the modules of src/zephon import each other in a cycle nobody justified.

Each module (file) of ``zephon`` is one node; an edge is any import of another zephon module,
made when the module loads or later inside a function: an import deferred into a function
still ties the two modules together, so it hides a cycle from load-time checks without
breaking it. Only imports under ``if TYPE_CHECKING:`` are left out (they never run). ``from
zephon.x import y`` draws an edge to ``zephon.x.y`` where that is a module, else to
``zephon.x`` (a package's ``__init__`` is not counted for an import of its submodule); an
import of the root ``zephon`` (which only re-exports) draws none.

A cycle found must lie within one entry of ``JUSTIFIED``, which says why those modules are
allowed to import each other; anything larger, or anywhere else, fails with its edges.

Run: ``python scripts/check_import_cycles.py [package root]`` (part of ``make lint``).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "zephon"

_IO_FORMATS = (
    "arrow builtin_formats converted dataset datatrove discover file_shard folders formats hf "
    "jsonl lance litdata mds megatron naming npy_tokens parquet token_files vortex webdataset"
)

JUSTIFIED: dict[frozenset[str], str] = {
    frozenset(f"zephon.io._{name}" for name in _IO_FORMATS.split()): (
        "the format registry loads the built-in formats on first use, and each format "
        "registers itself and opens datasets through the registry"
    ),
    frozenset(
        [
            "zephon.types",
            "zephon.training",
            "zephon._packed_images",
            "zephon.provenance._extract",
            "zephon.provenance._origin",
            "zephon.provenance._cuts",
        ]
    ): (
        "SampleBatch.to_training/provenance/fingerprint are the documented shorthand for "
        "zephon.training and zephon.provenance, which read SampleBatch"
    ),
    frozenset(
        [
            "zephon.pipeline",
            "zephon.config",
            "zephon.provenance",
            "zephon.provenance._trace",
            "zephon.capture.streaming",
        ]
    ): (
        "trace() rebuilds the pipeline from its config, and a pipeline hands its batches a "
        "provenance Origin; a config's capture_stream source is a StreamingCaptureSource, "
        "whose pipeline() builds a Pipeline"
    ),
}
"""``modules that may import each other: why``. A cycle must lie within one entry."""


def _module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(nodes: list[ast.AST]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import in ``nodes``, in functions too, but not under ``if TYPE_CHECKING:``."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from _imports(list(node.orelse))
        else:
            yield from _imports(list(ast.iter_child_nodes(node)))


def _targets(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: set[str]
) -> Iterator[str]:
    """The modules ``node`` imports: ``from x import y`` imports ``x.y`` where that is a
    module, else ``x`` (the module a dotted name is in: ``zephon.io.Dataset`` -> ``zephon.io``)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            anchor = module.split(".")
            anchor = anchor if is_package else anchor[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        names = [f"{base}.{alias.name}" for alias in node.names]
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            yield name


def graph(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """Module -> {module it imports: line of the first such import} (the root left out)."""
    paths = {_module_name(p, package): p for p in sorted(package.rglob("*.py"))}
    root = package.name
    edges: dict[str, dict[str, int]] = {}
    for module, path in paths.items():
        out = edges.setdefault(module, {})
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _imports([tree]):
            for dest in _targets(node, module, path.name == "__init__.py", set(paths)):
                if dest not in (module, root):
                    out.setdefault(dest, node.lineno)
    return edges


def cycles(edges: dict[str, dict[str, int]] | dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges) + 1000))
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def unjustified(
    edges: dict[str, dict[str, int]], justified: dict[frozenset[str], str] = JUSTIFIED
) -> list[str]:
    """One line per cycle that lies within no ``justified`` entry, naming its edges."""
    errors = []
    for component in cycles(edges):
        if any(set(component) <= allowed for allowed in justified):
            continue
        inside = set(component)
        links = [f"{a}:{edges[a][b]} -> {b}" for a in component for b in edges[a] if b in inside]
        errors.append(
            f"import cycle of {len(component)} modules: {'; '.join(links)}; move the code an "
            "upward import needs into the layer below, or justify the cycle in JUSTIFIED"
        )
    return errors


def main(argv: list[str]) -> int:
    package = Path(argv[1]) if len(argv) > 1 else PACKAGE
    errors = unjustified(graph(package))
    for error in errors:
        print(error)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
