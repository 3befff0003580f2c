"""Parquet shards: random access grouped by row group, with optional column projection.

A read maps the requested rows to row groups (binary search over the row-group offsets),
decodes each needed row group once (only the projected columns) and takes the rows from it.
Decoded row groups are kept in a per-process LRU cache shared by all shards (256 MiB by default,
``$ZEPHON_PARQUET_CACHE_MB``), so sequential, block-local or shuffled-within-shard access
decodes each row group about once. pyarrow's file readers are not shared between threads: one
lock per shard serialises its reads (different shards read in parallel).

Remote shards without a node cache are read through ranged requests: the footer, then only
the column chunks of the row groups a read needs, never the whole file.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from zephon.errors import DataFormatError
from zephon.io._dataset import Row, checked_indices, missing_columns
from zephon.io._descriptors import DESCRIPTORS
from zephon.io._file_shard import FileShard


class _RowGroupCache:
    """Process-wide LRU of decoded row groups, bounded in bytes (always keeps the newest)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._items: OrderedDict[tuple[int, int], Any] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[int, int]) -> Any:
        with self._lock:
            table = self._items.get(key)
            if table is not None:
                self._items.move_to_end(key)
            return table

    def put(self, key: tuple[int, int], table: Any) -> None:
        with self._lock:
            if key in self._items:
                return
            self._items[key] = table
            self._bytes += int(table.nbytes)
            while self._bytes > self.budget and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._bytes -= int(old.nbytes)


_OPEN_TOKENS = itertools.count()
_CACHE = _RowGroupCache(int(os.environ.get("ZEPHON_PARQUET_CACHE_MB", "256")) << 20)


def _close(handle: tuple[Any, Any]) -> None:
    """Close a ``ParquetFile`` and the file under it (which it does not close itself)."""
    pf, source = handle
    pf.close()
    source.close()


class ParquetShard(FileShard):
    """One Parquet file. ``columns`` projects the rows to these fields (all when ``None``).

    The open file is leased from the process's bounded pool (:mod:`zephon.io._descriptors`):
    the footer is parsed once and kept, the file itself is closed when the pool evicts it and
    opened again (reusing that footer) when read again.
    """

    _TRANSIENT = ("_lock", "_meta", "_rg_starts", "_open_token")

    def _init_transient(self) -> None:
        self._lock = threading.Lock()
        self._meta: Any = None
        self._rg_starts: np.ndarray | None = None
        # this copy's own pool key and row-group cache entries (pyarrow's readers are not
        # shared between threads, nor between shards projecting different columns)
        self._open_token = next(_OPEN_TOKENS)

    def _count(self) -> int:
        with self._lock, self._leased():
            return int(self._meta.num_rows)

    def _open(self) -> tuple[Any, Any]:
        """(``ParquetFile``, its source) for the pool: a local file, or ranged reads."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            source = self._blob.local(pa.OSFile)
            if source is None:  # remote, no cache: every read below is one ranged request
                source = pa.PythonFile(self._blob.file(), mode="r")
        except FileNotFoundError as e:
            raise DataFormatError(f"parquet shard {self._url} does not exist") from e
        try:
            return pq.ParquetFile(source, metadata=self._meta), source
        except (pa.ArrowInvalid, OSError) as e:
            source.close()
            raise DataFormatError(
                f"parquet shard {self._url} is corrupt or not Parquet: {e}"
            ) from e
        except BaseException:
            source.close()
            raise

    @contextmanager
    def _leased(self) -> Iterator[Any]:
        """The open ``ParquetFile``, leased from the pool (the caller holds the lock); the
        first open reads and checks the footer."""
        key = f"parquet{self._open_token}:{self._url}"
        with DESCRIPTORS.lease(key, self._open, _close) as (pf, _source):
            if self._meta is None:
                self._load_footer(pf)
            yield pf

    def _load_footer(self, pf: Any) -> None:
        missing_columns(self._url, self._columns, pf.schema_arrow.names)
        md = pf.metadata
        self._check_rows(md.num_rows)
        sizes = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
        self._rg_starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self._meta = md

    def _row_group(self, rg: int) -> Any:
        """Row group ``rg`` decoded: from the cache, else read (the file opened only then)."""
        key = (self._open_token, rg)
        table = _CACHE.get(key)
        if table is not None:
            return table
        import pyarrow as pa

        with self._leased() as pf:
            try:
                table = pf.read_row_group(rg, columns=self._columns)
            except (pa.ArrowInvalid, OSError) as e:
                raise DataFormatError(
                    f"parquet shard {self._url}: row group {rg} cannot be decoded: {e}"
                ) from e
        _CACHE.put(key, table)
        return table

    def read(self, indices: Sequence[int]) -> list[Row]:
        if not len(indices):
            return []
        idx = checked_indices(indices, len(self), self._url)
        out: list[Row] = [{}] * len(idx)
        with self._lock:
            if self._meta is None:
                with self._leased():
                    pass  # reads and checks the footer
            starts = self._rg_starts
            assert starts is not None
            rgs = np.searchsorted(starts, idx, side="right") - 1
            order = np.argsort(rgs, kind="stable")
            sorted_rgs = rgs[order]
            bounds = np.flatnonzero(np.diff(sorted_rgs)) + 1
            for group in np.split(order, bounds):
                rg = int(rgs[group[0]])
                table = self._row_group(rg)
                rows = table.take(idx[group] - starts[rg]).to_pylist()
                for pos, row in zip(group.tolist(), rows, strict=True):
                    out[pos] = row
        return out
