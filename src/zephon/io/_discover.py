"""Shard discovery: a folder, a glob, a list of paths or URLs -> a :class:`Dataset`.

Shard ids are positions in the sorted listing. When the folder holds an ``index.json`` (written by
:func:`build_index` / ``zephon index PATH``) row counts come from it and no shard is opened, so
discovery of large datasets is instant; otherwise every shard is scanned once (and JSONL offset
indexes are cached as a side effect).
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Sequence
from typing import Any

import zephon.io._builtin_formats  # noqa: F401 - registers the built-in formats
from zephon.errors import ConfigError, DataError, DataFormatError, did_you_mean
from zephon.io._cache import CacheOptions
from zephon.io._dataset import Dataset, Shard
from zephon.io._folders import one_probe
from zephon.io._formats import (
    ReadOptions,
    file_format_names,
    find_format,
    folder_format_names,
    format_names,
    format_spec,
    formats,
    known_suffixes,
)
from zephon.io._hub import hub_files, is_hub_path
from zephon.io._paths import derived_dir, get_fs, split_protocol, strip_protocol
from zephon.io._remote import request, with_retries

INDEX_NAME = "index.json"
INDEX_VERSION = 1
_SIDECARS = (".zidx", ".raw", ".tmp", ".tar.idx")  # .tar.idx: a WebDataset shard's index

PathArg = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def detect_format(path: str) -> str | None:
    """The registered file format of ``path`` from its name (``"jsonl"``, ...), or None."""
    return find_format(path)


def folder_format(entry: str, storage_options: dict[str, Any] | None) -> str | None:
    """The registered folder format (``"hf"``, ``"lance"``, ...) ``entry`` is, or None."""
    with one_probe():
        for spec in formats():
            if spec.detect is not None and spec.detect(entry, storage_options):
                return spec.name
    return None


def _check_fmt(fmt: str | None, names: tuple[str, ...], where: str = "") -> None:
    if fmt is not None and fmt not in names:
        raise ConfigError(
            f"fmt must be one of {', '.join(names)}{where}, got {fmt!r}{did_you_mean(fmt, names)}"
        )


def _join(protocol: str, base: str, name: str) -> str:
    if protocol == "file":
        return os.path.join(base, name)
    return _as_url(protocol, posixpath.join(strip_protocol(protocol, base), name))


def _as_url(protocol: str, path: str) -> str:
    """A canonical URL for a path returned by fsspec (which strips the protocol)."""
    if protocol == "file":
        return path
    if "://" in path:
        path = strip_protocol(protocol, path)
    return f"{protocol}://{path}"


def _expand(entry: str, storage_options: dict[str, Any] | None) -> tuple[list[str], str | None]:
    """Files under ``entry`` (a folder, glob or file) and the folder when it is one."""
    protocol, path = split_protocol(entry)
    fs = get_fs(protocol, storage_options)
    if any(c in path for c in "*?["):
        found = with_retries(
            entry, "list", lambda: request(fs, "glob", entry, "list", path, detail=True)
        )
        files = sorted(_as_url(protocol, p) for p, i in found.items() if i["type"] != "directory")
        return files, None
    if not with_retries(entry, "stat", lambda: request(fs, "exists", entry, "stat", path)):
        raise DataError(f"dataset path {entry} does not exist{_bucket_hint(fs, protocol, path)}")
    if with_retries(entry, "stat", lambda: request(fs, "isdir", entry, "stat", path)):
        listing = with_retries(
            entry, "list", lambda: request(fs, "ls", entry, "list", path, detail=True)
        )
        names = sorted(_as_url(protocol, i["name"]) for i in listing if i["type"] != "directory")
        return names, path
    return [path if protocol == "file" else entry], None


def _bucket_hint(fs: Any, protocol: str, path: str) -> str:
    """For object stores: say whether the bucket itself is missing."""
    if protocol == "file":
        return ""
    bucket = strip_protocol(protocol, path).split("/", 1)[0]
    try:
        exists = fs.exists(bucket)
    except OSError:
        return ""
    return "" if exists else f" (bucket {bucket!r} does not exist at this endpoint)"


def _read_index(folder: str, protocol: str, storage_options: dict[str, Any] | None) -> Any:
    fs = get_fs(protocol, storage_options)
    index_path = _join(protocol, folder, INDEX_NAME)
    if not fs.exists(index_path):
        return None
    try:
        with fs.open(index_path, "rb") as f:
            data = json.loads(f.read())
        if data.get("version") != INDEX_VERSION or not isinstance(data.get("shards"), list):
            raise ValueError("unknown version or no 'shards' list")
        return data
    except (ValueError, KeyError, AttributeError) as e:
        raise DataFormatError(
            f"{_as_url(protocol, index_path)} is not a valid zephon index ({e}); "
            "rebuild it with `zephon index PATH` or delete it"
        ) from e


def make_shard(url: str, fmt: str, rows: int | None, options: ReadOptions) -> Shard:
    """One file of the registered file format ``fmt`` as a shard."""
    return format_spec(fmt).shard(url, rows, options)


def _indexed(
    folder: str, protocol: str, storage_options: dict[str, Any] | None
) -> list[tuple[str, str, int | None]] | None:
    """The shards a folder's index lists, or None when it has no index."""
    index = _read_index(folder, protocol, storage_options)
    if index is None:
        return None
    return [
        (
            _as_url(protocol, _join(protocol, folder, item["path"])),
            item.get("format") or index["format"],
            int(item["rows"]),
        )
        for item in index["shards"]
    ]


def _listed(
    entry: str, files: list[str], folder: str | None, fmt: str | None
) -> list[tuple[str, str, int | None]]:
    """The shards among ``files`` (index, sidecars and hidden files left out)."""
    unknown: list[str] = []
    out: list[tuple[str, str, int | None]] = []
    for f in files:
        base = os.path.basename(f)
        if base == INDEX_NAME or base.endswith(_SIDECARS) or base.startswith("."):
            continue
        kind = fmt or detect_format(f)
        if kind is None:
            if folder is None and len(files) == 1:
                raise DataError(
                    f"unknown shard format for {f}: expected one of {known_suffixes()} "
                    f"(or pass fmt= one of {', '.join(format_names())})"
                )
            unknown.append(base)
            continue
        out.append((f, kind, None))
    if not out:
        hint = f"; unsupported files found: {', '.join(unknown[:5])}" if unknown else ""
        raise DataError(f"no shards found in {entry} (looked for {known_suffixes()}){hint}")
    return out


def discover(
    path: PathArg,
    *,
    fmt: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[tuple[str, str, int | None]]:
    """``[(url, format, rows or None)]`` for every shard of ``path``, in shard-id order."""
    entries = _entries(path)
    if not entries:
        raise DataError("dataset path list is empty; pass a folder, a glob or a list of shards")
    _check_fmt(fmt, file_format_names(), " here")
    out: list[tuple[str, str, int | None]] = []
    for entry in entries:
        files, folder = _expand(entry, storage_options)
        protocol, _ = split_protocol(entry)
        indexed = None if folder is None else _indexed(folder, protocol, storage_options)
        out += indexed if indexed is not None else _listed(entry, files, folder, fmt)
    return out


def _entries(path: PathArg) -> list[str]:
    if isinstance(path, str | os.PathLike):
        return [os.fspath(path)]
    return [os.fspath(p) for p in path]


def dataset_from_path(
    name: str,
    path: PathArg,
    *,
    fmt: str | None = None,
    columns: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache: CacheOptions | None = None,
    decode_images: bool = False,
    allow_pickle: bool = False,
    format_options: dict[str, Any] | None = None,
) -> Dataset:
    _check_fmt(fmt, format_names())
    derived = derived_dir(cache_dir, cache)
    shards: list[Shard] = []
    for entry in _entries(path):
        if is_hub_path(entry):
            shards += _hub_shards(entry, columns=columns, cache_dir=derived)
            continue
        kind = fmt if fmt in folder_format_names() else None
        if fmt is None and not any(c in entry for c in "*?[") and detect_format(entry) is None:
            kind = folder_format(entry, storage_options)  # a file name needs no probe
        if kind is not None:
            shards += format_spec(kind).folder_shards(
                entry,
                ReadOptions(columns, storage_options, cache, derived, decode_images, allow_pickle),
            )
            continue
        options = ReadOptions(
            columns, storage_options, cache, derived, format_options=format_options
        )
        shards += [
            make_shard(url, found, rows, options)
            for url, found, rows in discover(entry, fmt=fmt, storage_options=storage_options)
        ]
    return Dataset(name, shards)


def _hub_shards(entry: str, *, columns: Sequence[str] | None, cache_dir: str | None) -> list[Shard]:
    """The shards of an ``hf://`` split: its files, downloaded at one pinned commit."""
    files = hub_files(entry, lambda name: detect_format(name) is not None)
    options = ReadOptions(columns, None, None, cache_dir)
    return [make_shard(f, detect_format(f) or "parquet", None, options) for f in files]


def build_index(
    path: str | os.PathLike[str],
    *,
    fmt: str | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Scan every shard of the folder ``path`` once and write ``<path>/index.json``.

    The index lists each shard's path (relative to the folder), format and row count; JSONL
    offset indexes are built and cached along the way. Returns the index as a dict.
    """
    entry = os.fspath(path)
    protocol, folder = split_protocol(entry)
    fs = get_fs(protocol, storage_options)
    if not fs.exists(folder) or not fs.isdir(folder):
        raise DataError(f"{entry} is not a folder; `zephon index` takes a dataset folder")
    kind = folder_format(entry, storage_options)
    if kind is not None:
        raise DataError(
            f"{entry} is a {kind} folder, which lists its own shards; it needs no zephon index"
        )
    index_file = _join(protocol, folder, INDEX_NAME)
    if fs.exists(index_file):
        fs.rm(index_file)  # rebuild from the files, not from the stale index
    shards = []
    options = ReadOptions(None, storage_options, None, cache_dir)
    for url, kind, _ in discover(entry, fmt=fmt, storage_options=storage_options):
        shard = make_shard(url, kind, None, options)
        if protocol == "file":
            rel = os.path.relpath(split_protocol(url)[1], folder)
        else:
            rel = posixpath.relpath(strip_protocol(protocol, url), strip_protocol(protocol, folder))
        shards.append({"path": rel, "format": kind, "rows": len(shard)})
    formats = {s["format"] for s in shards}
    index = {
        "version": INDEX_VERSION,
        "format": formats.pop() if len(formats) == 1 else "mixed",
        "total_rows": sum(int(s["rows"]) for s in shards),  # type: ignore[call-overload]
        "shards": shards,
    }
    with fs.open(index_file, "wb") as f:
        f.write(json.dumps(index, indent=1).encode())
    return index


def list_shards(
    path: PathArg, *, fmt: str | None = None, storage_options: dict[str, Any] | None = None
) -> list[tuple[str, str, int | None]]:
    """``[(url, format, rows or None)]`` of a dataset path from metadata alone: listings and
    ``index.json``; no shard is opened, scanned, indexed or decompressed (for ``explain``).
    A self-describing folder (hf, lance, mds) is one entry with unknown rows."""
    _check_fmt(fmt, format_names())
    out: list[tuple[str, str, int | None]] = []
    for entry in _entries(path):
        kind = fmt if fmt in folder_format_names() else None
        if is_hub_path(entry):
            kind = "hub"  # resolving the split's files is a network call: left to the run
        elif fmt is None and not any(c in entry for c in "*?[") and detect_format(entry) is None:
            kind = folder_format(entry, storage_options)
        if kind is not None:
            out.append((entry, kind, None))
            continue
        out += discover(entry, fmt=fmt, storage_options=storage_options)
    return out
