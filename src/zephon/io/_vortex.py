"""Vortex files (``.vortex``), read with ``vortex-data``: rows by index, columns projected.

Vortex takes strictly increasing row indices, so a read asks for the sorted distinct rows once
and puts them back in the order asked (repeats included).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon._optional import require
from zephon.errors import DataFormatError
from zephon.io._dataset import Row, checked_indices, missing_columns
from zephon.io._file_shard import FileShard

VORTEX_SUFFIXES = (".vortex", ".vtx")


class VortexShard(FileShard):
    """One local Vortex file (needs ``zephon[vortex]``)."""

    _TRANSIENT = ("_file", "_lock")

    def _init_transient(self) -> None:
        self._file: Any = None
        self._lock = threading.Lock()

    def _open(self) -> Any:
        with self._lock:
            if self._file is None:
                vx = require("vortex", "Vortex shards")
                try:
                    opened = self._blob.local(vx.open)
                except RuntimeError as e:
                    raise DataFormatError(
                        f"{self._url} is corrupt or not Vortex ({str(e).splitlines()[0]}); "
                        "re-copy or rewrite the file"
                    ) from None
                if opened is None:
                    raise DataFormatError(
                        f"{self._url}: Vortex shards are read from a local copy; pass "
                        "cache=CacheOptions(dir=...) to keep remote ones in a node cache"
                    )
                self._file = opened
                names = self._file.dtype.to_arrow_schema().names
                missing_columns(self._url, self._columns, names)
            return self._file

    def _count(self) -> int:
        return int(self._open().footer.row_count)

    def read(self, indices: Sequence[int]) -> list[Row]:
        idx = checked_indices(indices, len(self), self._url)
        if not len(idx):
            return []
        vx = require("vortex", "Vortex shards")
        import pyarrow as pa

        wanted, where = np.unique(idx, return_inverse=True)
        try:
            table = (
                self._open()
                .to_arrow(self._columns, indices=vx.array(pa.array(wanted, pa.uint64())))
                .read_all()
            )
        except RuntimeError as e:
            raise DataFormatError(
                f"{self._url}: rows cannot be read ({str(e).splitlines()[0]}); the file is "
                "damaged, re-copy or rewrite it"
            ) from None
        rows = table.to_pylist()
        return [dict(rows[i]) for i in where.tolist()]
