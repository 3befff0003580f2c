"""Datasets: named, sharded collections of rows with O(1) random access by ``(shard, index)``.

A :class:`Dataset` is a list of :class:`Shard` s. Shard ids are positions in that list (for
files: the sorted listing). Datasets are pickled into worker processes, so shards open files
lazily and never pickle open handles.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from zephon.errors import ConfigError, DataFormatError

if TYPE_CHECKING:
    from zephon.io._cache import CacheOptions
    from zephon.io._stats import SourceStats

Row = dict[str, Any]
PathArg = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


class Shard(abc.ABC):
    """One unit of storage (a file, a row group set, an in-memory list)."""

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the shard lives, for error messages (a path or URL)."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of rows."""

    @abc.abstractmethod
    def read(self, indices: Sequence[int]) -> list[Row]:
        """Rows at ``indices``, in the order asked. Errors name the file and line or row."""

    def pin(self) -> None:
        """Record what the shard's files are now; a run calls it before its first read, so
        every process compares against the same files. Nothing to record by default."""
        return

    def release(self) -> None:
        """Close what reading opened (a store client, say); called when a run's reader is
        torn down, in every process that read. A later read reopens it. Nothing by default."""
        return

    def check_unchanged(self) -> None:
        """Raise ``DataError`` naming the file when it is no longer what :meth:`pin` saw
        (called after every read of a micro-batch). Checks nothing by default."""
        return


def checked_indices(indices: Sequence[int], n: int, location: str) -> np.ndarray:
    """``indices`` as an int64 array; one outside ``[0, n)`` raises ``IndexError`` naming it."""
    idx = np.asarray(indices, dtype=np.int64)
    if len(idx) and (idx.min() < 0 or idx.max() >= n):
        bad = int(idx[(idx < 0) | (idx >= n)][0])
        raise IndexError(f"row {bad} out of range for shard {location} with {n} rows")
    return idx


def missing_columns(location: str, wanted: Sequence[str] | None, names: Sequence[str]) -> None:
    """Raise ``DataFormatError`` when a projected column is not in the shard."""
    if wanted is None:
        return
    missing = [c for c in wanted if c not in set(names)]
    if missing:
        raise DataFormatError(
            f"shard {location} has no column(s) {missing}; available: {sorted(names)}. "
            "Fix `columns=` or the data"
        )


class InMemoryShard(Shard):
    """Rows held in memory; used by :meth:`Dataset.from_records` and in tests."""

    def __init__(self, rows: Sequence[Row], location: str = "<memory>") -> None:
        self._rows = list(rows)
        self._location = location

    @property
    def location(self) -> str:
        return self._location

    def __len__(self) -> int:
        return len(self._rows)

    def read(self, indices: Sequence[int]) -> list[Row]:
        rows = self._rows
        # Copy so an operator mutating its payload never changes the dataset.
        return [dict(rows[i]) for i in indices]

    def __deepcopy__(self, memo: dict[int, Any]) -> InMemoryShard:
        """The rows are never written (reads copy them), so a worker's copy of an operator
        shares them: copying every row per worker thread cost more than reading them."""
        return self


class Dataset:
    """A named dataset: shards plus their row counts."""

    def __init__(self, name: str, shards: Sequence[Shard]) -> None:
        if not name:
            raise ConfigError("a dataset needs a non-empty name")
        self.name = name
        self.shards: list[Shard] = list(shards)
        self._counts = [len(s) for s in self.shards]

    def __repr__(self) -> str:
        return f"Dataset({self.name!r}, shards={len(self.shards)}, rows={self.total()})"

    def counts(self) -> list[int]:
        """Rows per shard, by shard id."""
        return list(self._counts)

    def total(self) -> int:
        return sum(self._counts)

    def __len__(self) -> int:
        return self.total()

    def shard_count(self) -> int:
        return len(self.shards)

    def read(self, shard_id: int, indices: Sequence[int]) -> list[Row]:
        """Rows ``indices`` of shard ``shard_id``, in the order asked."""
        return self.shards[shard_id].read(indices)

    def locate(self, shard_id: int, row: int) -> str:
        """Where row ``row`` of shard ``shard_id`` is, for error messages: ``FILE, line N``
        for JSON Lines, ``FILE, row N`` otherwise (1-based)."""
        shard = self.shards[shard_id]
        line_of = getattr(shard, "line_of", None)
        where = f"line {line_of(row)}" if line_of is not None else f"row {row + 1}"
        return f"{shard.location}, {where}"

    def stats(self) -> SourceStats:
        """I/O of this dataset's shards in this process so far (bytes fetched, requests,
        retries, node-cache hits, downloads, evictions, refetches)."""
        from zephon.io._stats import total

        return total(s.location for s in self.shards)

    @classmethod
    def from_records(
        cls, name: str, rows: Iterable[Row], *, shard_size: int | None = None
    ) -> Dataset:
        """An in-memory dataset; ``shard_size`` splits the rows into several shards."""
        rows = list(rows)
        if shard_size is None or shard_size >= len(rows):
            return cls(name, [InMemoryShard(rows, f"<memory:{name}>")])
        if shard_size < 1:
            raise ConfigError(f"shard_size must be >= 1, got {shard_size}")
        shards: list[Shard] = [
            InMemoryShard(rows[i : i + shard_size], f"<memory:{name}#{i // shard_size}>")
            for i in range(0, len(rows), shard_size)
        ]
        return cls(name, shards)

    @classmethod
    def from_dict(cls, name: str, shards: Mapping[int, Shard]) -> Dataset:
        """A dataset from explicit shards keyed by shard id (ids must be 0..n-1)."""
        ids = sorted(shards)
        if ids != list(range(len(ids))):
            raise ConfigError(f"dataset {name!r}: shard ids must be 0..{len(ids) - 1}, got {ids}")
        return cls(name, [shards[i] for i in ids])

    @overload
    @classmethod
    def from_path(
        cls,
        path: PathArg,
        *,
        name: str | None = None,
        fmt: str | None = None,
        columns: Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache: CacheOptions | None = None,
        decode_images: bool = False,
        allow_pickle: bool = False,
        format_options: Mapping[str, Any] | None = None,
    ) -> Dataset: ...

    @overload
    @classmethod
    def from_path(
        cls,
        name: str,
        path: PathArg,
        *,
        fmt: str | None = None,
        columns: Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache: CacheOptions | None = None,
        decode_images: bool = False,
        allow_pickle: bool = False,
        format_options: Mapping[str, Any] | None = None,
    ) -> Dataset: ...

    @classmethod
    def from_path(
        cls,
        *args: Any,
        fmt: str | None = None,
        columns: Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache: CacheOptions | None = None,
        decode_images: bool = False,
        allow_pickle: bool = False,
        format_options: Mapping[str, Any] | None = None,
        **named: Any,
    ) -> Dataset:
        """A dataset over files: a folder, a glob or a list of files/folders (local or fsspec).

        ``from_path(path)`` names the dataset after the path (its last component before any
        glob, without the format suffix, e.g. ``data/`` -> ``data``; see ``docs/datasets.md``);
        ``from_path(name, path)`` or ``name=`` names it explicitly.
        Formats come from the suffix (``.jsonl``/``.ndjson`` optionally ``.gz``/``.zst``/
        ``.bz2``/``.xz``, ``.parquet``, ``.arrow``/``.feather``, ``.vortex``; pre-tokenized
        Megatron ``.idx`` (+ ``.bin``), datatrove ``.ds`` and ``.npy`` token arrays), from the
        folder (Hugging Face ``save_to_disk``, Lance, MDS, LitData) or from ``fmt``. ``columns``
        projects every format but JSONL. ``hf://org/name[@rev][/config]/split`` reads a Hub
        dataset split at one pinned commit (see ``docs/datasets.md``).
        ``storage_options`` go to fsspec (and Lance). ``cache`` keeps whole remote shards in a
        node-local cache; without it remote shards are read by byte range. Derived files
        (offset indexes, decompressed copies) go to ``cache_dir``, else ``cache.dir``, else
        ``$ZEPHON_CACHE_DIR`` or ``~/.cache/zephon``, never next to the data. An
        ``index.json`` in the folder (``zephon index PATH``) makes discovery instant.
        MDS image columns (``jpeg``, ``png``) are their encoded bytes, or ``uint8`` arrays
        with ``decode_images``; ``pkl`` columns need ``allow_pickle`` (unpickling can run
        code). ``format_options`` go to a format that needs some: an ``npy`` token array takes
        ``token_dtype`` (raw arrays) and ``eos_id`` (see ``docs/pretokenized.md``).
        """
        name, path = _name_and_path(args, named)
        from zephon.io._discover import dataset_from_path

        return dataset_from_path(
            name,
            path,
            fmt=fmt,
            columns=columns,
            storage_options=dict(storage_options) if storage_options else None,
            cache_dir=cache_dir,
            cache=cache,
            decode_images=decode_images,
            allow_pickle=allow_pickle,
            format_options=dict(format_options) if format_options else None,
        )

    @classmethod
    def from_hf(
        cls,
        name: str,
        data: Any,
        *,
        columns: Sequence[str] | None = None,
        shard_size: int | None = None,
    ) -> Dataset:
        """A dataset over a ``datasets.Dataset`` already loaded in this process.

        One shard per Arrow cache file when the object is exactly those files (memory-mapped,
        cheap to send to workers); otherwise (in memory, shuffled, selected) its rows as one
        Arrow table, split into shards of ``shard_size`` rows.
        """
        from zephon.io._hf import from_hf

        return cls(name, from_hf(data, f"<hf:{name}>", columns=columns, shard_size=shard_size))


_FROM_PATH_USE = "call Dataset.from_path(path), from_path(name, path) or from_path(path, name=...)"


def _name_and_path(args: tuple[Any, ...], named: dict[str, Any]) -> tuple[str, PathArg]:
    """``(name, path)`` of a ``from_path`` call, the name derived from the path if not given."""
    unknown = sorted(set(named) - {"name", "path"})
    if unknown:
        raise TypeError(f"Dataset.from_path() got an unexpected keyword argument {unknown[0]!r}")
    if len(args) > 2 or (len(args) == 2 and named) or (len(args) == 1 and len(named) == 2):
        raise TypeError(f"Dataset.from_path() got too many names or paths; {_FROM_PATH_USE}")
    if len(args) == 2:
        name, path = args
    elif len(args) == 1 and "path" in named:
        name, path = args[0], named["path"]
    elif len(args) == 1:
        name, path = named.get("name"), args[0]
    elif "path" in named:
        name, path = named.get("name"), named["path"]
    else:
        raise TypeError(f"Dataset.from_path() needs a path; {_FROM_PATH_USE}")
    if name is None:
        from zephon.io._naming import name_from_path

        return name_from_path(path), path
    if not isinstance(name, str):
        raise TypeError(
            f"a dataset name is a str, got {type(name).__name__} {name!r}; {_FROM_PATH_USE}"
        )
    return name, path
