"""Pre-tokenized files: one flat token array plus document spans, read by memmap or by range.

Every pre-tokenized format (Megatron ``.bin/.idx``, datatrove ``.ds``, OLMo ``.npy``) is a
:class:`TokenFile`: its token count and dtype are known from a header or the file size (O(1)),
its document spans (token offsets and lengths, int64 arrays) are loaded lazily, and tokens are
sliced from a memmap (local or node-cached) or fetched by byte range (remote). No Python object
exists per token or per document: a document is a row of two arrays.

:class:`TokenDocumentShard` shows a token file as rows, one per document
(``{"input_ids": array}``), so every operator works on it; the sample views of
:mod:`zephon.io._token_samples` read the same file without a record per document.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from zephon.errors import DataFormatError
from zephon.io._blob import Blob, OneBlob
from zephon.io._cache import CacheOptions
from zephon.io._dataset import Row, checked_indices
from zephon.io._file_shard import LazyShard

INPUT_IDS = "input_ids"
LOSS_MASK = "loss_mask"


class TokenFile(OneBlob, abc.ABC):
    """A flat array of ``n_tokens`` tokens of ``dtype`` starting at byte ``data_offset`` of
    ``url``; subclasses say where the document spans come from. Pickles without its memmap
    and loaded spans (``_TRANSIENT``), which the receiving process loads again."""

    _TRANSIENT: ClassVar[tuple[str, ...]] = ("_memmap", "_spans")

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._TRANSIENT}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_transient()

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        cache: CacheOptions | None = None,
    ) -> None:
        self._url = url
        self._blob = Blob(url, storage_options, cache)
        self._init_transient()
        self.dtype, self.data_offset, self.n_tokens = self._layout()

    def _init_transient(self) -> None:
        self._memmap: np.ndarray | None = None
        self._spans: tuple[np.ndarray, np.ndarray] | None = None

    @abc.abstractmethod
    def _layout(self) -> tuple[np.dtype[Any], int, int]:
        """``(dtype, byte offset of token 0, token count)`` from headers or sizes (cheap)."""

    @abc.abstractmethod
    def _load_spans(self) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, lengths)`` of every document in tokens, int64."""

    @property
    def location(self) -> str:
        return self._url

    def documents(self) -> int:
        """Documents in the file (formats whose header counts them override this; the
        default loads the spans)."""
        return len(self.spans()[0])

    def spans(self) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, lengths)`` of every document, in tokens (loaded once per process)."""
        if self._spans is None:
            starts, lengths = self._load_spans()
            self._spans = (
                starts.astype(np.int64, copy=False),
                lengths.astype(np.int64, copy=False),
            )
        return self._spans

    def tokens(self) -> np.ndarray | None:
        """The whole token array as a read-only memmap; None for a remote file read by range."""
        if self._memmap is None:
            self._memmap = self._blob.local(self._map)
        return self._memmap

    def _map(self, path: str) -> np.ndarray:
        if self.n_tokens == 0:
            return np.zeros(0, dtype=self.dtype)
        mm = np.memmap(path, self.dtype, "r", self.data_offset, (self.n_tokens,))
        return mm.view(np.ndarray)  # slicing a plain view costs a third of slicing a memmap

    def read_tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` (a view of the memmap, or a fresh array fetched by range)."""
        if start < 0 or stop > self.n_tokens or start > stop:
            raise IndexError(
                f"token span [{start}, {stop}) is outside {self._url} ({self.n_tokens} tokens)"
            )
        mm = self.tokens()
        if mm is not None:
            return mm[start:stop]
        size = self.dtype.itemsize
        raw = self._blob.read_range(self.data_offset + start * size, self.data_offset + stop * size)
        return np.frombuffer(raw, dtype=self.dtype)

    def read_bytes(self, start: int, stop: int) -> bytes:
        return self._blob.read_range(start, stop)

    def file_size(self) -> int:
        return self._blob.size()

    def loss_mask(self, start: int, stop: int) -> np.ndarray | None:
        """A per-token loss mask for ``[start, stop)`` when the format stores one (else None)."""
        return None

    def check_spans(self, starts: np.ndarray, lengths: np.ndarray, what: str) -> None:
        """Spans that leave the token array mean the index and the data disagree."""
        if len(starts) and (
            starts.min() < 0 or lengths.min() < 0 or int((starts + lengths).max()) > self.n_tokens
        ):
            bad = int(np.flatnonzero((starts < 0) | (starts + lengths > self.n_tokens))[0])
            raise DataFormatError(
                f"{what}: document {bad} spans tokens [{int(starts[bad])}, "
                f"{int(starts[bad] + lengths[bad])}) but {self._url} holds {self.n_tokens} "
                "tokens; the index and the data file do not belong together, write them again "
                "as a pair",
                location=self._url,
            )


class TokenFileShard(LazyShard):
    """A shard whose rows come from one token file: it is where the file is, and pins and
    checks the file itself."""

    file: TokenFile

    @property
    def location(self) -> str:
        return self.file.location

    def pin(self) -> None:
        self.file.pin()

    def check_unchanged(self) -> None:
        self.file.check_unchanged()


class TokenDocumentShard(TokenFileShard):
    """A token file as rows, one per document: ``{"input_ids": tokens}`` (plus ``loss_mask``
    where the format stores one). Token arrays are views of the memmap: read-only."""

    def __init__(self, file: TokenFile, rows: int | None = None) -> None:
        self.file = file
        self._rows = rows

    def __len__(self) -> int:
        if self._rows is None:
            self._rows = self.file.documents()
        return self._rows

    def read(self, indices: Sequence[int]) -> list[Row]:
        starts, lengths = self.file.spans()
        idx = checked_indices(indices, len(starts), self.location)
        out: list[Row] = []
        read, mask = self.file.read_tokens, self.file.loss_mask
        for s, n in zip(starts[idx].tolist(), lengths[idx].tolist(), strict=True):
            row: Row = {INPUT_IDS: read(s, s + n)}
            m = mask(s, s + n)
            if m is not None:
                row[LOSS_MASK] = m
            out.append(row)
        return out
