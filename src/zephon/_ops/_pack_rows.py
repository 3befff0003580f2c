"""pack_flat's rows of a whole micro-batch at once: a few numpy calls per micro-batch.

Assembling bin by bin costs about ten numpy calls per row (slices, padding, concatenation,
positions, document ids) on the engine's serial path. Here the bins of one micro-batch are
laid out back to back: one concatenation per field, and for positions and document ids a
``repeat`` over the runs of the whole micro-batch, cut into rows (views on one block per
field, disjoint). The bytes and dtypes are those of ``PackFlatOp.assemble`` bin by bin;
micro-batches it cannot promise that for (fields that are lists or not 1-D, dtypes that
differ between segments or are not in the machine's byte order, bins disagreeing on their
fields) are left to it (``None``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class RowLayout:
    """What every row of a pack_flat operator shares: its length, padding and fields."""

    __slots__ = ("_fills", "document_ids", "max_length", "pad_token_id", "positions")

    def __init__(
        self, max_length: int, pad_token_id: int, *, positions: bool, document_ids: bool
    ) -> None:
        self.max_length = max_length
        self.pad_token_id = pad_token_id
        self.positions = positions
        self.document_ids = document_ids
        self._fills: dict[tuple[np.dtype[Any], int], np.ndarray] = {}

    def fill(self, dtype: np.dtype[Any], value: int) -> np.ndarray:
        """``max_length`` times ``value`` in ``dtype`` (read-only): a row's padding is a prefix,
        made as ``np.full`` makes it (so a value the dtype cannot hold fails the same way)."""
        key = (dtype, value)
        fill = self._fills.get(key)
        if fill is None:
            fill = self._fills[key] = np.full(self.max_length, value, dtype=dtype)
            fill.flags.writeable = False
        return fill


Segments = Sequence[tuple[Any, int, int, int]]
"""A bin's ``(fields, start, stop, full_length)`` segments (``DeferredBin.segments``)."""


def _field_dtypes(bins: Sequence[Segments]) -> dict[str, np.dtype[Any]] | None:
    """Each field's dtype when every bin has the same fields, each a 1-D array of that dtype
    in every segment; else None."""
    first = bins[0][0][0]
    if type(first) is not dict:
        return None
    names = list(first)
    dtypes: dict[str, np.dtype[Any]] = {}
    for name in names:
        value = first[name]
        if type(value) is not np.ndarray or value.ndim != 1 or not value.dtype.isnative:
            return None  # (concatenating changes a byte order, one piece alone keeps it)
        dtypes[name] = value.dtype
    for segments in bins:
        for fields, _, _, _ in segments:
            if type(fields) is not dict or list(fields) != names:
                return None
            for name, dtype in dtypes.items():
                value = fields[name]
                if type(value) is not np.ndarray or value.ndim != 1 or value.dtype != dtype:
                    return None
    return dtypes


def assemble_rows(layout: RowLayout, bins: Sequence[Segments]) -> list[dict[str, Any]] | None:
    """The payload of each bin in ``bins``, as ``PackFlatOp.assemble`` gives it; None when the
    bins are not all 1-D arrays of one dtype per field (assemble them one by one then)."""
    dtypes = _field_dtypes(bins) if bins else None
    if dtypes is None:
        return None
    max_length = layout.max_length
    runs: list[int] = []  # every bin's segment lengths, then its padding (a run of its own)
    ids: list[int] = []  # the document id of each run
    for segments in bins:
        pad = max_length
        for index, (_, start, stop, _) in enumerate(segments):
            runs.append(stop - start)
            ids.append(index)
            pad -= stop - start
        if pad:
            runs.append(pad)
            ids.append(-1)
    tokens_name = next(iter(dtypes))
    shape = (len(bins), max_length)
    blocks: dict[str, np.ndarray] = {}
    for name, dtype in dtypes.items():
        value = layout.pad_token_id if name == tokens_name else 0
        pieces: list[np.ndarray] = []
        for segments in bins:
            used = 0
            for fields, start, stop, _ in segments:
                pieces.append(fields[name][start:stop])
                used += stop - start
            if used < max_length:
                pieces.append(layout.fill(dtype, value)[: max_length - used])
        blocks[name] = np.concatenate(pieces).reshape(shape)
    lengths = np.array(runs, dtype=np.intp)
    if layout.positions:  # a run's positions count from 0: its offset in the block, less its start
        starts = (np.cumsum(lengths) - lengths).astype(np.int32)
        flat = np.arange(shape[0] * max_length, dtype=np.int32) - np.repeat(starts, lengths)
        blocks["positions"] = flat.reshape(shape)
    if layout.document_ids:
        blocks["document_ids"] = np.repeat(np.array(ids, dtype=np.int32), lengths).reshape(shape)
    return [{name: block[i] for name, block in blocks.items()} for i in range(len(bins))]
