"""Micro-batches of records across a process pipe as columns: one buffer per array field.

Pickled record by record, a micro-batch of tokenized documents costs the receiver a Python
call per small array (numpy rebuilds each one from its own buffer); the engine process pays
that serially for every document its workers return. :class:`ColumnarItems` pickles the same
list as its metas, plus one concatenated buffer and the end offsets for each field that is a
small 1-D array in every record, and unpickles straight back to a plain list whose arrays are
views on that buffer (disjoint, writeable, same dtype and values). Whatever does not fit (a
batch, a tombstone, payloads with other keys, a list, a large array that goes through shared
memory, a read-only array) keeps its ordinary pickle.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon.types import SampleMeta, SampleRecord, StreamItem

Column = tuple[str, Any, Any]
"""``("a", dtype, (buffer, ends))`` for a field of arrays, ``("o", values, None)`` otherwise."""


def _array_column(values: list[Any], max_bytes: int) -> tuple[Any, Any] | None:
    """``(dtype, (buffer, ends))`` of ``values`` when each is a small, writeable 1-D array of
    one native numeric dtype; else None."""
    first = values[0]
    if type(first) is not np.ndarray:
        return None
    dtype = first.dtype
    if not dtype.isnative or dtype.hasobject or dtype.fields is not None or dtype.subdtype:
        return None  # np.concatenate would change a byte order; records are not plain numbers
    ends: list[int] = []
    end = 0
    for value in values:
        if (
            type(value) is not np.ndarray
            or value.dtype != dtype
            or value.ndim != 1
            or value.nbytes >= max_bytes
            or not value.flags.writeable
        ):
            return None
        end += value.shape[0]
        ends.append(end)
    block = np.concatenate(values)
    return dtype.str, (pickle.PickleBuffer(block.data), ends)


def _columns(items: Sequence[StreamItem], max_bytes: int) -> tuple[list[str], list[Column]] | None:
    """The payload keys and one column per key, when every item is a record whose payload is a
    dict with the same keys in the same order and at least one key holds arrays; else None."""
    first = items[0]
    if type(first) is not SampleRecord or type(first.payload) is not dict:
        return None
    if not any(type(value) is np.ndarray for value in first.payload.values()):
        return None  # nothing to gain: the first record holds no array
    keys = list(first.payload)
    for item in items:
        if type(item) is not SampleRecord or type(item.payload) is not dict:
            return None
        if list(item.payload) != keys:
            return None
    columns: list[Column] = []
    for key in keys:
        values = [item.payload[key] for item in items]  # type: ignore[union-attr]
        arrays = _array_column(values, max_bytes)
        columns.append(("o", values, None) if arrays is None else ("a", *arrays))
    if all(kind == "o" for kind, _, _ in columns):
        return None
    return keys, columns


def _records(metas: list[SampleMeta], keys: list[str], columns: list[Column]) -> list[Any]:
    """Unpickle hook: the records ``ColumnarItems`` stood for."""
    fields: list[list[Any]] = []
    for kind, first, second in columns:
        if kind == "o":
            fields.append(first)
            continue
        buffer, ends = second
        block = np.frombuffer(buffer, dtype=np.dtype(first))
        starts = [0, *ends[:-1]]
        fields.append([block[start:end] for start, end in zip(starts, ends, strict=True)])
    return [
        SampleRecord(meta, dict(zip(keys, values, strict=True)))
        for meta, *values in zip(metas, *fields, strict=True)
    ]


class ColumnarItems(list):  # type: ignore[type-arg]
    """A micro-batch (a plain list) that pickles as columns where it can (see the module)."""

    def __init__(self, items: Sequence[StreamItem], max_bytes: int) -> None:
        super().__init__(items)
        self.max_bytes = max_bytes

    def __reduce__(self) -> Any:
        columns = _columns(self, self.max_bytes) if len(self) > 1 else None
        if columns is None:
            return (list, (list(self),))
        metas = [item.meta for item in self]
        return (_records, (metas, *columns))
