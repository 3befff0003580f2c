"""Datasets: named, sharded collections of rows with O(1) random access by ``(shard, index)``.

A :class:`Dataset` is a list of :class:`Shard` s. Shard ids are positions in that list (for
files: the sorted listing). Datasets are pickled into worker processes, so shards open files
lazily and never pickle open handles.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from zephon.errors import ConfigError

Row = dict[str, Any]


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

    @classmethod
    def from_path(
        cls,
        name: str,
        path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        fmt: str | None = None,
        columns: Sequence[str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> Dataset:
        """A dataset over files: a folder, a glob or a list of files/folders (local or fsspec).

        Formats come from the suffix (``.jsonl``/``.ndjson`` optionally ``.gz``/``.zst``,
        ``.parquet``) or ``fmt``. ``columns`` projects Parquet shards. ``storage_options`` go to
        fsspec. Derived files (offset indexes, decompressed copies) of read-only or remote data
        go to ``cache_dir`` (default ``$ZEPHON_CACHE_DIR`` or ``~/.cache/zephon``). An
        ``index.json`` in the folder (``zephon index PATH``) makes discovery instant.
        """
        from zephon.io._discover import dataset_from_path

        return dataset_from_path(
            name,
            path,
            fmt=fmt,
            columns=columns,
            storage_options=dict(storage_options) if storage_options else None,
            cache_dir=cache_dir,
        )
