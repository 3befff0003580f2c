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

from zephon.errors import ConfigError, DataError, DataFormatError
from zephon.io._dataset import Dataset, Shard
from zephon.io._jsonl import JsonlShard, is_jsonl
from zephon.io._paths import get_fs, split_protocol, strip_protocol

INDEX_NAME = "index.json"
INDEX_VERSION = 1
KNOWN_SUFFIXES = "*.jsonl, *.ndjson, *.jsonl.gz, *.jsonl.zst, *.parquet"
_SIDECARS = (".zidx", ".raw", ".tmp")

PathArg = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def detect_format(path: str) -> str | None:
    """``"jsonl"``, ``"parquet"`` or ``None`` from the file name."""
    if path.endswith((".parquet", ".pq")):
        return "parquet"
    if is_jsonl(path):
        return "jsonl"
    return None


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
        files = sorted(_as_url(protocol, p) for p in fs.glob(path) if not fs.isdir(p))
        return files, None
    if not fs.exists(path):
        raise DataError(f"dataset path {entry} does not exist")
    if fs.isdir(path):
        names = sorted(_as_url(protocol, p) for p in fs.ls(path, detail=False) if not fs.isdir(p))
        return names, path
    return [path if protocol == "file" else entry], None


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


def make_shard(
    url: str,
    fmt: str,
    rows: int | None,
    *,
    columns: Sequence[str] | None,
    storage_options: dict[str, Any] | None,
    cache_dir: str | os.PathLike[str] | None,
) -> Shard:
    if fmt == "jsonl":
        return JsonlShard(url, rows, storage_options=storage_options, cache_dir=cache_dir)
    if fmt == "parquet":
        from zephon.io._parquet import ParquetShard

        return ParquetShard(url, rows, columns=columns, storage_options=storage_options)
    raise ConfigError(f"unknown format {fmt!r} for {url}; use 'jsonl' or 'parquet'")


def discover(
    path: PathArg,
    *,
    fmt: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[tuple[str, str, int | None]]:
    """``[(url, format, rows or None)]`` for every shard of ``path``, in shard-id order."""
    entries = (
        [os.fspath(path)] if isinstance(path, str | os.PathLike) else [os.fspath(p) for p in path]
    )
    if not entries:
        raise DataError("dataset path list is empty; pass a folder, a glob or a list of shards")
    if fmt is not None and fmt not in ("jsonl", "parquet"):
        raise ConfigError(f"fmt must be 'jsonl' or 'parquet', got {fmt!r}")
    out: list[tuple[str, str, int | None]] = []
    for entry in entries:
        files, folder = _expand(entry, storage_options)
        protocol, _ = split_protocol(entry)
        if folder is not None:
            index = _read_index(folder, protocol, storage_options)
            if index is not None:
                for item in index["shards"]:
                    url = _join(protocol, folder, item["path"])
                    out.append(
                        (
                            _as_url(protocol, url),
                            item.get("format") or index["format"],
                            int(item["rows"]),
                        )
                    )
                continue
        unknown: list[str] = []
        found = 0
        for f in files:
            base = os.path.basename(f)
            if base == INDEX_NAME or base.endswith(_SIDECARS) or base.startswith("."):
                continue
            kind = fmt or detect_format(f)
            if kind is None:
                if folder is None and len(files) == 1:
                    raise DataError(
                        f"unknown shard format for {f}: expected one of {KNOWN_SUFFIXES} "
                        "(or pass fmt='jsonl' / fmt='parquet')"
                    )
                unknown.append(base)
                continue
            out.append((f, kind, None))
            found += 1
        if not found:
            hint = f"; unsupported files found: {', '.join(unknown[:5])}" if unknown else ""
            raise DataError(f"no shards found in {entry} (looked for {KNOWN_SUFFIXES}){hint}")
    return out


def dataset_from_path(
    name: str,
    path: PathArg,
    *,
    fmt: str | None = None,
    columns: Sequence[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Dataset:
    shards = [
        make_shard(
            url,
            kind,
            rows,
            columns=columns,
            storage_options=storage_options,
            cache_dir=cache_dir,
        )
        for url, kind, rows in discover(path, fmt=fmt, storage_options=storage_options)
    ]
    return Dataset(name, shards)


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
    index_file = _join(protocol, folder, INDEX_NAME)
    if fs.exists(index_file):
        fs.rm(index_file)  # rebuild from the files, not from the stale index
    shards = []
    for url, kind, _ in discover(entry, fmt=fmt, storage_options=storage_options):
        shard = make_shard(
            url, kind, None, columns=None, storage_options=storage_options, cache_dir=cache_dir
        )
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
