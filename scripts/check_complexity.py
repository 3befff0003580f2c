"""Fail when a function in src/ is too long or too branchy to read in one screen.

Limits: cyclomatic complexity (radon) at most ``MAX_CC`` and at most ``MAX_LINES`` lines per
function, nested functions counted on their own. Offenders are listed as ``file:line``; there
are no exceptions.

Run: ``python scripts/check_complexity.py`` (part of ``make lint``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

from radon.visitors import ComplexityVisitor, Function

MAX_CC = 20
MAX_LINES = 80
ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


def _functions(blocks: list[Function], prefix: str = "") -> Iterator[tuple[str, Function]]:
    """Every function and method, closures included, with its qualified name."""
    for block in blocks:
        name = f"{prefix}{block.name}"
        yield name, block
        yield from _functions(list(block.closures), f"{name}.")


def _blocks(visitor: ComplexityVisitor) -> Iterator[tuple[str, Function]]:
    yield from _functions(list(visitor.functions))
    for cls in visitor.classes:
        yield from _functions(list(cls.methods), f"{cls.name}.")


def offenders(src: Path = SRC) -> list[tuple[str, str, int, int, int]]:
    """``(path, name, line, cc, lines)`` of every function over a limit."""
    out = []
    for path in sorted(src.rglob("*.py")):
        rel = (path.relative_to(ROOT) if path.is_relative_to(ROOT) else path).as_posix()
        visitor = ComplexityVisitor.from_code(path.read_text(), no_assert=True)
        for name, fn in _blocks(visitor):
            lines = fn.endline - fn.lineno + 1
            if fn.complexity > MAX_CC or lines > MAX_LINES:
                out.append((rel, name, fn.lineno, fn.complexity, lines))
    return out


def main() -> int:
    found = offenders()
    for path, name, line, cc, lines in found:
        print(f"{path}:{line}: {name}: CC {cc} (max {MAX_CC}), {lines} lines (max {MAX_LINES})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
