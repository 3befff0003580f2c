"""docs/architecture.md names real code: its layout names modules and folders that exist, and
its layer order is the one ``scripts/check_layering.py`` enforces."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
SRC = ROOT / "src" / "zephon"


def _text_blocks() -> list[str]:
    return re.findall(r"```text\n(.*?)```", PAGE.read_text(), flags=re.S)


def _layering() -> object:
    spec = importlib.util.spec_from_file_location("layering", ROOT / "scripts/check_layering.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_layout_names_only_modules_and_folders_that_exist() -> None:
    (layout,) = [b for b in _text_blocks() if b.startswith("src/zephon/")]
    named = re.findall(r"^  (\S+(?:\.py|/))", layout, flags=re.M)
    assert len(named) > 10
    assert [name for name in named if not (SRC / name).exists()] == []


def test_the_page_states_the_layer_order_that_lint_enforces() -> None:
    (order,) = [b for b in _text_blocks() if b.startswith("errors ")]
    layers = tuple(tuple(line.split()) for line in order.splitlines())
    assert layers == _layering().LAYERS  # type: ignore[attr-defined]


def test_the_page_states_the_engine_layer_order_that_lint_enforces() -> None:
    (order,) = [b for b in _text_blocks() if b.startswith("stats ")]
    layers = tuple(tuple(line.split()) for line in order.splitlines())
    assert layers == _layering().ENGINE_LAYERS  # type: ignore[attr-defined]


def test_every_file_and_zephon_name_the_page_cites_exists() -> None:
    text = PAGE.read_text()
    files = set(re.findall(r"`((?:[\w]+/)+\w+\.py)`", text))
    missing = [f for f in files if not (SRC / f).exists() and not (ROOT / f).exists()]
    names = set(re.findall(r"`(zephon(?:\.\w+)+)`", text))
    assert len(files) > 5 and len(names) > 5
    assert sorted(missing) == []
    assert sorted(name for name in names if not _resolves(name)) == []


def _resolves(dotted: str) -> bool:
    """``dotted`` is a module of zephon, or an attribute of one."""
    module, _, attr = dotted.rpartition(".")
    try:
        importlib.import_module(dotted)
        return True
    except ImportError:
        return hasattr(importlib.import_module(module), attr)
