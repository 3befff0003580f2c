"""Arrow shards: Arrow IPC / Feather v2 files (file or stream format) and in-memory tables.

A local (or node-cached) file is memory-mapped and read with zero copies: the table costs
address space, not memory, and pages are shared by every process of the node. Its descriptor
is closed as soon as the table is read (the mapping outlives it), so shards hold no open file.
Remote files without a cache are fetched whole once per process (the stream format cannot be
read at random offsets); configure a node cache for them. A read is one ``take`` of the
projected columns.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from zephon.errors import DataFormatError
from zephon.io._dataset import Row, Shard, checked_indices, missing_columns
from zephon.io._file_shard import FileShard

ARROW_SUFFIXES = (".arrow", ".feather", ".ipc", ".arrows")


def read_ipc(source: Any, location: str) -> Any:
    """The whole table of an Arrow IPC source, whichever of the two formats it uses."""
    import pyarrow as pa

    try:
        try:
            return pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_stream(source).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise DataFormatError(
            f"arrow shard {location} is corrupt or not Arrow IPC / Feather v2 ({e}); "
            "re-create or re-download it"
        ) from e


def take_rows(table: Any, indices: Sequence[int], location: str) -> list[Row]:
    """Rows ``indices`` of ``table`` as dicts: one vectorised ``take``, then one conversion."""
    idx = checked_indices(indices, table.num_rows, location)
    rows: list[Row] = table.take(idx).to_pylist()
    return rows


def project(table: Any, columns: Sequence[str] | None, location: str) -> Any:
    missing_columns(location, columns, table.column_names)
    return table if columns is None else table.select(list(columns))


class ArrowShard(FileShard):
    """One Arrow IPC / Feather v2 file (local, node-cached or remote)."""

    _TRANSIENT = ("_lock", "_table")

    def _init_transient(self) -> None:
        self._lock = threading.Lock()
        self._table: Any = None

    def _count(self) -> int:
        return int(self.table().num_rows)

    def table(self) -> Any:
        """The projected table (mapped or fetched once per process)."""
        table = self._table
        if table is None:
            with self._lock:
                if self._table is None:
                    self._table = project(self._load(), self._columns, self._url)
                table = self._table
        return table

    def _load(self) -> Any:
        import pyarrow as pa

        def mapped(path: str) -> Any:
            try:
                source = pa.memory_map(path)
            except FileNotFoundError as e:
                raise DataFormatError(f"arrow shard {self._url} does not exist") from e
            with source:  # the table keeps the mapping, not the descriptor
                return read_ipc(source, self._url)

        table = self._blob.local(mapped)
        if table is None:
            data = self._blob.read_range(0, self._blob.size())
            table = read_ipc(pa.BufferReader(data), self._url)
        self._check_rows(table.num_rows)
        return table

    def read(self, indices: Sequence[int]) -> list[Row]:
        return take_rows(self.table(), indices, self._url)


class ArrowTableShard(Shard):
    """An Arrow table held in memory (pickles with its data)."""

    def __init__(self, table: Any, location: str, columns: Sequence[str] | None = None) -> None:
        self._table = project(table, columns, location)
        self._location = location

    @property
    def location(self) -> str:
        return self._location

    def __len__(self) -> int:
        return int(self._table.num_rows)

    def read(self, indices: Sequence[int]) -> list[Row]:
        return take_rows(self._table, indices, self._location)
