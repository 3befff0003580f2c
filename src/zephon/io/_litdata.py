"""LitData folders (``index.json`` with ``chunks`` and ``config``; ``.bin`` chunks, plain or
zstd-compressed), read with ``litdata``: one shard per chunk, items by global index.

The folder's index gives each chunk's item count, so shards know their rows without opening a
chunk; items are decoded by litdata's own loader. Items that are not dicts become ``{"item": x}``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from zephon._optional import require
from zephon.errors import DataFormatError
from zephon.io._dataset import Row, Shard, checked_indices, missing_columns
from zephon.io._file_shard import LazyShard

_OPEN: dict[str, tuple[threading.Lock, Any]] = {}
_OPEN_LOCK = threading.Lock()


def is_litdata_index(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("chunks"), list) and "config" in data


def _item_keys(config: dict[str, Any]) -> list[str] | None:
    """The keys of a dict item from litdata's tree spec, or None for other items."""
    try:
        spec = json.loads(config["data_spec"])
        node = spec[1]
        if node.get("type") == "builtins.dict":
            return [str(k) for k in json.loads(node["context"])]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        pass
    return None


def _streaming(folder: str) -> tuple[threading.Lock, Any]:
    """This process's litdata reader of ``folder`` (one per folder, reads serialized)."""
    with _OPEN_LOCK:
        found = _OPEN.get(folder)
        if found is None:
            litdata = require("litdata", "LitData folders")
            found = _OPEN[folder] = (threading.Lock(), litdata.StreamingDataset(folder))
        return found


class LitDataShard(LazyShard):
    """One chunk of a LitData folder (needs ``zephon[litdata]``)."""

    def __init__(
        self,
        folder: str,
        chunk: dict[str, Any],
        offset: int,
        keys: list[str] | None,
        columns: Sequence[str] | None,
    ) -> None:
        self._folder, self._offset, self._keys = folder, offset, keys
        self._file = os.path.join(folder, str(chunk["filename"]))
        self._rows = int(chunk["chunk_size"])
        self._columns = None if columns is None else list(columns)
        missing_columns(self._file, self._columns, keys or ["item"])

    @property
    def location(self) -> str:
        return self._file

    def __len__(self) -> int:
        return self._rows

    def _check_file(self) -> None:
        if not os.path.isfile(self._file):
            raise DataFormatError(f"LitData chunk {self._file} is missing; re-copy the folder")

    def read(self, indices: Sequence[int]) -> list[Row]:
        idx = checked_indices(indices, len(self), self._file)
        self._check_file()
        lock, stream = _streaming(self._folder)
        out: list[Row] = []
        for i in idx.tolist():
            try:
                with lock:
                    item = stream[self._offset + i]
            except Exception as e:  # litdata raises its own and struct/decoder errors
                first = (str(e).splitlines() or [""])[0][:160]
                raise DataFormatError(
                    f"LitData chunk {self._file}, item {i}: cannot be read "
                    f"({type(e).__name__}: {first}); the chunk is damaged, re-copy it"
                ) from None
            row = dict(item) if isinstance(item, dict) else {"item": item}
            if self._columns is not None:
                row = {c: row[c] for c in self._columns}
            out.append(row)
        return out


def litdata_shards(
    folder: str, index: dict[str, Any], columns: Sequence[str] | None
) -> list[Shard]:
    keys = _item_keys(index.get("config") or {})
    shards: list[Shard] = []
    offset = 0
    for chunk in index["chunks"]:
        shards.append(LitDataShard(folder, chunk, offset, keys, columns))
        offset += int(chunk["chunk_size"])
    return shards
