"""Vortex files (``.vortex``), read with ``vortex-data``: rows by index, columns projected.

Vortex takes strictly increasing row indices, so a read asks for the sorted distinct rows once
and puts them back in the order asked (repeats included).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from zephon._optional import require
from zephon.errors import DataFormatError
from zephon.io._dataset import Row, checked_indices, missing_columns
from zephon.io._descriptors import DESCRIPTORS
from zephon.io._file_shard import FileShard

VORTEX_SUFFIXES = (".vortex", ".vtx")
_OPEN_TOKENS = itertools.count()


class VortexShard(FileShard):
    """One local Vortex file (needs ``zephon[vortex]``). The open file is leased from the
    process's bounded pool, so many shards never hold more descriptors than the pool's cap."""

    _TRANSIENT = ("_checked", "_pool_key")

    def _init_transient(self) -> None:
        self._checked = False
        # this copy's own pool key: copies projecting other columns never share an open file
        self._pool_key = f"vortex{next(_OPEN_TOKENS)}:{self._url}"

    def _open_file(self) -> Any:
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
        return opened

    @contextmanager
    def _leased(self) -> Iterator[Any]:
        """The open file; the pool drops it on eviction (Vortex closes it when released)."""
        with DESCRIPTORS.lease(self._pool_key, self._open_file, _release) as opened:
            if not self._checked:
                missing_columns(self._url, self._columns, opened.dtype.to_arrow_schema().names)
                self._checked = True
            yield opened

    def _count(self) -> int:
        with self._leased() as opened:
            return int(opened.footer.row_count)

    def read(self, indices: Sequence[int]) -> list[Row]:
        idx = checked_indices(indices, len(self), self._url)
        if not len(idx):
            return []
        vx = require("vortex", "Vortex shards")
        import pyarrow as pa

        wanted, where = np.unique(idx, return_inverse=True)
        try:
            with self._leased() as opened:
                indices = vx.array(pa.array(wanted, pa.uint64()))
                table = opened.to_arrow(self._columns, indices=indices).read_all()
        except RuntimeError as e:
            raise DataFormatError(
                f"{self._url}: rows cannot be read ({str(e).splitlines()[0]}); the file is "
                "damaged, re-copy or rewrite it"
            ) from None
        rows = table.to_pylist()
        return [dict(rows[i]) for i in where.tolist()]


def _release(_opened: Any) -> None:
    """Nothing to call: the file is closed once the pool lets go of its last reference."""
