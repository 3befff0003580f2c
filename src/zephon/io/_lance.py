"""Lance datasets: one shard per fragment, pinned to the version seen at discovery.

Pinning the version keeps shard ids and row counts fixed while writers append or delete, so a
restored run reads exactly what the first one did. Rows are fetched with ``fragment.take`` on
the projected columns (Lance needs strictly increasing offsets: we sort, take the unique rows
once and put them back in the order asked). Remote Lance URIs use Lance's own object-store
client (``storage_options`` are passed to it), not fsspec.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon._optional import require
from zephon.errors import DataFormatError
from zephon.io._dataset import Row, Shard, checked_indices, missing_columns
from zephon.io._file_shard import LazyShard


def is_lance(path: str) -> bool:
    return path.rstrip("/").endswith(".lance") or os.path.isdir(os.path.join(path, "_versions"))


def _open(uri: str, version: int | None, storage_options: dict[str, Any] | None) -> Any:
    lance = require("lance", f"reading the lance dataset {uri}")
    try:
        return lance.dataset(uri, version=version, storage_options=storage_options or None)
    except (OSError, ValueError) as e:
        raise DataFormatError(
            f"lance dataset {uri} cannot be opened ({e}); check the path and that the dataset "
            "is not damaged"
        ) from e


def lance_shards(
    uri: str, *, columns: Sequence[str] | None, storage_options: dict[str, Any] | None
) -> list[Shard]:
    """One :class:`LanceShard` per fragment of the dataset's current version."""
    ds = _open(uri, None, storage_options)
    missing_columns(uri, columns, ds.schema.names)
    return [
        LanceShard(uri, f.fragment_id, f.count_rows(), ds.version, columns, storage_options)
        for f in ds.get_fragments()
    ]


class LanceShard(LazyShard):
    _TRANSIENT = ("_lock", "_fragment", "_pid")

    def __init__(
        self,
        uri: str,
        fragment_id: int,
        rows: int,
        version: int,
        columns: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self._uri, self._fid, self._rows, self._version = uri, fragment_id, rows, version
        self._columns = None if columns is None else list(columns)
        self._storage_options = dict(storage_options or {})
        self._init_transient()

    def _init_transient(self) -> None:
        self._lock = threading.Lock()
        self._fragment: Any = None
        self._pid = -1

    @property
    def location(self) -> str:
        return f"{self._uri}#fragment={self._fid}"

    def __len__(self) -> int:
        return self._rows

    def _frag(self) -> Any:
        with self._lock:
            if self._fragment is None or self._pid != os.getpid():
                ds = _open(self._uri, self._version, self._storage_options)
                fragment = ds.get_fragment(self._fid)
                if fragment is None:
                    raise DataFormatError(
                        f"{self.location}: fragment missing from version {self._version}; "
                        "the dataset was damaged or cleaned up, rebuild the Dataset"
                    )
                self._fragment, self._pid = fragment, os.getpid()
            return self._fragment

    def read(self, indices: Sequence[int]) -> list[Row]:
        idx = checked_indices(indices, self._rows, self.location)
        if not len(idx):
            return []
        unique, inverse = np.unique(idx, return_inverse=True)
        try:
            table = self._frag().take(unique.tolist(), columns=self._columns)
        except OSError as e:
            raise DataFormatError(
                f"{self.location}: rows cannot be read ({e}); the fragment's files are damaged"
            ) from e
        rows: list[Row] = table.take(inverse).to_pylist()
        return rows
