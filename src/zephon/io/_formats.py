"""The registry of dataset formats: one :class:`FormatSpec` per format, built-in or yours.

Why one registry: discovery, ``fmt=`` checks, the YAML schema, the CLI's choices, error
messages and the docs table all read :func:`formats`, so a format registered with
:func:`register_format` works end to end and no list of names can fall behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from zephon.errors import ConfigError, MissingDependencyError, did_you_mean
from zephon.io._cache import CacheOptions
from zephon.io._dataset import Shard

__all__ = [
    "FormatSpec",
    "ReadOptions",
    "file_format_names",
    "find_format",
    "folder_format_names",
    "format_names",
    "format_spec",
    "formats",
    "formats_markdown",
    "known_suffixes",
    "register_format",
    "unregister_format",
]


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """What ``Dataset.from_path`` passes every reader: the projection, fsspec options, the
    node cache, the folder for derived files, MDS's two decoding flags and the options of a
    format that needs some (an ``npy`` token array's ``token_dtype`` and ``eos_id``)."""

    columns: Sequence[str] | None = None
    storage_options: dict[str, Any] | None = None
    cache: CacheOptions | None = None
    cache_dir: str | os.PathLike[str] | None = None
    decode_images: bool = False
    allow_pickle: bool = False
    format_options: dict[str, Any] | None = None


#: ``(url, rows or None, options) -> Shard``: one file of a file format.
FileReader = Callable[[str, "int | None", ReadOptions], Shard]
#: ``(entry, options) -> [Shard]``: every shard of a self-describing folder.
FolderReader = Callable[[str, ReadOptions], "list[Shard]"]
#: ``(entry, storage_options) -> bool``: whether a folder is of this format.
FolderProbe = Callable[[str, "dict[str, Any] | None"], bool]


@dataclass(frozen=True, slots=True)
class FormatSpec:
    """A dataset format. A file format has ``suffixes`` (how a file name is recognised) and
    ``open_file``; a folder format (a folder that lists its own shards) has ``detect`` and
    ``open_folder``. ``extra`` is the ``pip install 'zephon[EXTRA]'`` that provides the
    reader's library (``None``: the core install); ``recognised_by`` says in words how the
    format is found, for error messages and docs."""

    name: str
    recognised_by: str
    suffixes: tuple[str, ...] = ()
    open_file: FileReader | None = None
    detect: FolderProbe | None = None
    open_folder: FolderReader | None = None
    extra: str | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.name.isidentifier():
            raise ConfigError(f"a format name must be an identifier, got {self.name!r}")
        is_file = self.open_file is not None and bool(self.suffixes)
        is_folder = self.open_folder is not None and self.detect is not None
        if is_file == is_folder:
            raise ConfigError(
                f"format {self.name!r}: give either suffixes and open_file (a file format) or "
                "detect and open_folder (a folder format)"
            )

    @property
    def folder(self) -> bool:
        """Whether the format is a self-describing folder (not one file per shard)."""
        return self.open_folder is not None

    def shard(self, url: str, rows: int | None, options: ReadOptions) -> Shard:
        """One file of this file format as a shard."""
        if self.open_file is None:
            raise ConfigError(
                f"{self.name} is a folder format; {url} cannot be read as one file of it"
            )
        try:
            return self.open_file(url, rows, options)
        except ImportError as exc:
            missing = self._missing(exc)
            if missing is None:
                raise
            raise missing from exc

    def folder_shards(self, entry: str, options: ReadOptions) -> list[Shard]:
        """Every shard of the folder ``entry`` of this folder format."""
        if self.open_folder is None:
            raise ConfigError(f"{self.name} is a file format; {entry} is not a folder of it")
        try:
            return self.open_folder(entry, options)
        except ImportError as exc:
            missing = self._missing(exc)
            if missing is None:
                raise
            raise missing from exc

    def _missing(self, exc: ImportError) -> MissingDependencyError | None:
        """A library the reader could not import as an error naming the spec's extra (None:
        the error already names one, or the spec has no extra)."""
        if isinstance(exc, MissingDependencyError) or self.extra is None:
            return None
        module = (exc.name or "").partition(".")[0] or self.extra
        return MissingDependencyError(module, self.extra, f"{self.name} datasets")


_FORMATS: dict[str, FormatSpec] = {}


def register_format(spec: FormatSpec, *, replace: bool = False) -> FormatSpec:
    """Add ``spec`` to the registry (``replace=True`` to redefine a registered name)."""
    if spec.name in _FORMATS and not replace:
        raise ConfigError(f"format {spec.name!r} is already registered (pass replace=True)")
    _FORMATS[spec.name] = spec
    return spec


def unregister_format(name: str) -> None:
    """Remove the format ``name`` from the registry (a test's cleanup)."""
    format_spec(name)
    del _FORMATS[name]


def formats() -> tuple[FormatSpec, ...]:
    """Every registered format, in registration order (the built-ins first)."""
    return tuple(_FORMATS.values())


def format_names() -> tuple[str, ...]:
    return tuple(_FORMATS)


def file_format_names() -> tuple[str, ...]:
    return tuple(s.name for s in _FORMATS.values() if not s.folder)


def folder_format_names() -> tuple[str, ...]:
    return tuple(s.name for s in _FORMATS.values() if s.folder)


def format_spec(name: str) -> FormatSpec:
    """The registered format ``name``; an unknown name is a :class:`ConfigError`."""
    spec = _FORMATS.get(name)
    if spec is None:
        raise ConfigError(
            f"unknown format {name!r}{did_you_mean(name, _FORMATS)}; known formats: "
            f"{', '.join(_FORMATS)}"
        )
    return spec


def find_format(path: str) -> str | None:
    """The file format whose suffix ``path`` ends with (the longest suffix wins), or None."""
    best: tuple[int, str] | None = None
    for spec in _FORMATS.values():
        for suffix in spec.suffixes:
            if path.endswith(suffix) and (best is None or len(suffix) > best[0]):
                best = (len(suffix), spec.name)
    return best[1] if best else None


def known_suffixes() -> str:
    """How every format is recognised, in words (for "no shards found" errors)."""
    files = [s.recognised_by for s in _FORMATS.values() if not s.folder]
    folders = [s.recognised_by for s in _FORMATS.values() if s.folder]
    return ", ".join(files) + (", or " + ", ".join(folders) if folders else "")


def formats_markdown() -> str:
    """The format table of docs/datasets.md, generated from the registry."""
    lines = ["| `fmt=` / `format:` | recognised by | extra |", "|---|---|---|"]
    for spec in _FORMATS.values():
        extra = f"`zephon[{spec.extra}]`" if spec.extra else "(core)"
        shown = spec.recognised_by.replace("*", "\\*")
        lines.append(f"| `{spec.name}` | {shown} | {extra} |")
    return "\n".join(lines) + "\n"
