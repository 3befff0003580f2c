"""datatrove's tokenized files: ``NAME.ds`` (tokens back to back, little-endian ``uint16`` or
``uint32``), ``NAME.ds.index`` (``uint64`` end of each document, in tokens) and optionally
``NAME.ds.loss`` (one byte per token: 1 where the loss counts).

The token width is not stored; it is the ``.ds`` size divided by the last document end (2 or 4
bytes), so nothing is configured. A row is one document.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from zephon.errors import DataError, DataFormatError
from zephon.io._blob import Blob
from zephon.io._cache import CacheOptions
from zephon.io._token_files import TokenFile

DS_SUFFIX = ".ds"
INDEX_SUFFIX = ".index"
LOSS_SUFFIX = ".loss"
_WIDTHS: dict[int, np.dtype[Any]] = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


class DatatroveFile(TokenFile):
    """One ``.ds`` file with its ``.ds.index`` (and ``.ds.loss`` when present)."""

    _TRANSIENT: ClassVar[tuple[str, ...]] = ("_memmap", "_spans", "_loss_mm")

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        cache: CacheOptions | None = None,
    ) -> None:
        self._index = Blob(url + INDEX_SUFFIX, storage_options, cache)
        self._loss = Blob(url + LOSS_SUFFIX, storage_options, cache)
        super().__init__(url, storage_options, cache)
        self.has_loss = self._exists(self._loss)

    def _init_transient(self) -> None:
        super()._init_transient()
        self._loss_mm: np.ndarray | None = None

    @staticmethod
    def _exists(blob: Blob) -> bool:
        try:
            blob.size()
        except (FileNotFoundError, OSError, DataError):
            return False
        return True

    def _ends(self) -> np.ndarray:
        try:
            size = self._index.size()
        except (FileNotFoundError, OSError, DataError):
            raise DataFormatError(
                f"{self._url} has no {self._index.url}; datatrove writes the document ends "
                "there (save_index=True), copy it next to the .ds file",
                location=self._url,
            ) from None
        if size % 8:
            raise DataFormatError(
                f"{self._index.url}: {size} bytes is not a whole number of uint64 document "
                "ends; the index is damaged, copy it again",
                location=self._index.url,
            )
        return np.frombuffer(self._index.read_range(0, size), "<u8").astype(np.int64)

    def documents(self) -> int:
        """Rows: one ``uint64`` end per document in the index (its size, no read)."""
        return self._index.size() // 8

    def _layout(self) -> tuple[np.dtype[Any], int, int]:
        size = self.file_size()
        index_size = self._index.size() if self._exists(self._index) else 0
        last = (
            int(np.frombuffer(self._index.read_range(index_size - 8, index_size), "<u8")[0])
            if index_size >= 8
            else 0
        )
        if last == 0:
            self._ends()  # a missing index raises naming it
            if size:
                raise DataFormatError(
                    f"{self._url} holds {size} bytes but its index lists no document",
                    location=self._url,
                )
            return _WIDTHS[2], 0, 0
        width = size // last if size % last == 0 else 0
        if width not in _WIDTHS:
            raise DataFormatError(
                f"{self._url}: {size} bytes for {last} tokens is neither 2 nor 4 bytes a token; "
                "the .ds and its .ds.index do not belong together",
                location=self._url,
            )
        return _WIDTHS[width], 0, last

    def _load_spans(self) -> tuple[np.ndarray, np.ndarray]:
        ends = self._ends()
        starts = np.zeros(len(ends), dtype=np.int64)
        starts[1:] = ends[:-1]
        lengths = ends - starts
        if len(lengths) and lengths.min() < 0:
            raise DataFormatError(
                f"{self._index.url}: document ends decrease at document "
                f"{int(np.flatnonzero(lengths < 0)[0])}; the index is damaged",
                location=self._index.url,
            )
        self.check_spans(starts, lengths, self._index.url)
        return starts, lengths

    def loss_mask(self, start: int, stop: int) -> np.ndarray | None:
        if not self.has_loss:
            return None
        if self._loss_mm is None:
            self._loss_mm = self._loss.local(
                lambda p: (
                    np.memmap(p, np.uint8, "r", 0, (self.n_tokens,))
                    if self.n_tokens
                    else np.zeros(0, np.uint8)
                )
            )
        if self._loss_mm is not None:
            return self._loss_mm[start:stop].view(np.bool_)
        return np.frombuffer(self._loss.read_range(start, stop), np.bool_)
