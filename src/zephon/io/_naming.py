"""A dataset's default name, from its path: what ``Dataset.from_path(path)`` calls it.

The name is the path's last component before any glob, without a registered format suffix
(``.jsonl.zst``, ``.parquet``, ...), with every character outside ``A-Z a-z 0-9 . _ -`` turned
into ``_``: ``data/`` -> ``data``, ``books-0.parquet`` -> ``books-0``, ``s3://b/code/*.jsonl``
-> ``code``, ``hf://org/corpus@v1/train`` -> ``corpus``. A list of paths is named by the common
start of its entries' names (``books-0``, ``books-1`` -> ``books``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from zephon.errors import ConfigError
from zephon.io._formats import formats
from zephon.io._hub import is_hub_path, parse_hub_path

__all__ = ["name_from_path"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_GLOB = frozenset("*?[")
_FIX = "pass the name first: Dataset.from_path(NAME, path)"


def name_from_path(path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> str:
    """The default dataset name of ``path`` (a ``ConfigError`` when none can be derived)."""
    if isinstance(path, str | os.PathLike):
        entries = [os.fspath(path)]
    else:
        entries = [os.fspath(p) for p in path]
    if not entries:
        raise ConfigError(f"an empty path list names no dataset; {_FIX}")
    names = [_entry_name(e) for e in entries]
    if len(set(names)) == 1:
        return names[0]
    common = _common_start(names).rstrip("._-")
    if not common:
        raise ConfigError(
            f"the paths {entries} name different datasets ({', '.join(names)}); {_FIX}"
        )
    return common


def _common_start(names: list[str]) -> str:
    """The characters every name starts with (names, not paths: ``books-0``, ``books-1``)."""
    common = names[0]
    for name in names[1:]:
        while not name.startswith(common):
            common = common[:-1]
    return common


def _entry_name(entry: str) -> str:
    if is_hub_path(entry):
        return _clean(parse_hub_path(entry).repo_id.rsplit("/", 1)[-1], entry)
    _, scheme, rest = entry.rpartition("://")
    if not scheme:
        rest = os.path.abspath(entry)  # "." and ".." name the folder they stand for
    parts = [p for p in rest.replace(os.sep, "/").split("/") if p]
    for i, part in enumerate(parts):
        if _GLOB & set(part):
            parts = parts[:i]
            break
    if not parts:
        raise ConfigError(f"{entry!r} has no folder or file name to call the dataset; {_FIX}")
    return _clean(_without_suffix(parts[-1]), entry)


def _without_suffix(name: str) -> str:
    """``name`` without the longest registered file suffix it ends with (if more remains)."""
    longest = max(
        (s for spec in formats() for s in spec.suffixes if name.endswith(s) and len(s) < len(name)),
        key=len,
        default="",
    )
    return name[: len(name) - len(longest)]


def _clean(name: str, entry: str) -> str:
    cleaned = _UNSAFE.sub("_", name).strip("._-")
    if not cleaned:
        raise ConfigError(f"{entry!r} gives no usable dataset name; {_FIX}")
    return cleaned
