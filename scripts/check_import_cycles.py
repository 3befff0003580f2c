"""Fail when the packages of src/zephon import each other in a cycle.

Each top-level unit of ``zephon`` is one node: a subpackage with everything below it
(``zephon.capture`` holds ``capture.stores`` and ``capture.proxy``), or a top-level module
(``zephon.config``). The root ``zephon/__init__.py`` only re-exports, so it is no node and an
import of ``zephon`` itself draws no edge. An edge is an import executed when a module loads:
imports inside functions and under ``if TYPE_CHECKING:`` are left out, because they run later
(or never) and so cannot make loading fail; they are how an optional or heavy dependency, or a
deliberate upward call, is reached. Prints each cycle found.

Run: ``python scripts/check_import_cycles.py`` (part of ``make lint``).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "zephon"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit(module: str) -> str | None:
    """The node ``module`` belongs to (``zephon.capture.stores._file`` -> ``zephon.capture``)."""
    parts = module.split(".")
    if parts[0] != "zephon" or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _load_time_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports at module level, also inside ``try``/``if`` blocks, but not in functions."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node):
                yield from _load_time_imports(node.body)
            yield from _load_time_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _load_time_imports(block)
            for handler in node.handlers:
                yield from _load_time_imports(handler.body)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        anchor = module.split(".")
        anchor = anchor if is_package else anchor[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    yield base
    if base == "zephon":  # ``from zephon import capture`` imports the subpackage
        yield from (f"zephon.{alias.name}" for alias in node.names)


def _exists(node: str) -> bool:
    path = PACKAGE.parent / node.replace(".", "/")
    return path.is_dir() or path.with_suffix(".py").is_file()


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Node -> the nodes it imports at load time (self-edges left out)."""
    edges: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        module = _module_name(path)
        source = unit(module)
        if source is None:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        out = edges.setdefault(source, set())
        for node in _load_time_imports(tree.body):
            for target in _targets(node, module, path.name == "__init__.py"):
                dest = unit(target)
                if dest is not None and dest != source and _exists(dest):
                    out.add(dest)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def main() -> int:
    edges = graph()
    found = cycles(edges)
    for component in found:
        links = [
            f"{a} -> {b}" for a in component for b in sorted(edges.get(a, ())) if b in component
        ]
        print(f"import cycle between {', '.join(component)}: {'; '.join(links)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
