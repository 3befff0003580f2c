"""Megatron ``.bin/.idx`` pairs (megatron-core's ``IndexedDataset``, written by
``preprocess_data.py`` and datatrove's ``MegatronDocumentTokenizer``).

The ``.idx`` file is, little-endian: the magic ``MMIDIDX\\x00\\x00``, version ``<Q`` (1), the
dtype code ``<B``, the sequence count ``<Q``, the document count ``<Q``, then the sequence
lengths (int32), the sequence pointers (int64, byte offsets into ``.bin``) and the document
indices (int64, sequence numbers where documents start, ``0`` first). The ``.bin`` file is the
tokens of every sequence back to back. A row is one sequence (for ``preprocess_data.py`` without
sentence splitting: one document).

The ``.idx`` is read whole once per process (it is small next to ``.bin``; a remote one is
fetched with one ranged request); the header alone gives the token count.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

from zephon.errors import DataFormatError
from zephon.io._blob import Blob
from zephon.io._cache import CacheOptions
from zephon.io._token_files import TokenFile

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, documents
#: Every dtype code of the format (megatron-core's ``DType``).
DTYPE_CODES: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
IDX_SUFFIX = ".idx"
BIN_SUFFIX = ".bin"


def dtype_code(dtype: Any) -> int:
    """The format's code of ``dtype`` (for writers)."""
    wanted = np.dtype(dtype)
    for code, dt in DTYPE_CODES.items():
        if dt == wanted:
            return code
    raise DataFormatError(
        f"dtype {wanted} has no Megatron code; use one of "
        f"{', '.join(str(d) for d in DTYPE_CODES.values())}"
    )


def index_bytes(
    lengths: np.ndarray, dtype: Any, document_indices: np.ndarray | None = None
) -> bytes:
    """The ``.idx`` content for sequences of ``lengths`` tokens of ``dtype`` stored back to back
    (``document_indices`` default: one document per sequence)."""
    lengths = np.asarray(lengths, dtype=np.int32)
    size = np.dtype(dtype).itemsize
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * size, out=pointers[1:])
    docs = (
        np.arange(len(lengths) + 1, dtype=np.int64)
        if document_indices is None
        else np.asarray(document_indices, dtype=np.int64)
    )
    head = HEADER.pack(MAGIC, VERSION, dtype_code(dtype), len(lengths), len(docs))
    return head + lengths.tobytes() + pointers.tobytes() + docs.tobytes()


class MegatronFile(TokenFile):
    """One ``PREFIX.bin`` + ``PREFIX.idx`` pair, addressed by its ``.idx`` URL."""

    def __init__(
        self,
        idx_url: str,
        storage_options: dict[str, Any] | None = None,
        cache: CacheOptions | None = None,
    ) -> None:
        if not idx_url.endswith(IDX_SUFFIX):
            raise DataFormatError(f"{idx_url}: a Megatron index file ends with {IDX_SUFFIX}")
        self._idx = Blob(idx_url, storage_options, cache)
        self.idx_url = idx_url
        super().__init__(idx_url[: -len(IDX_SUFFIX)] + BIN_SUFFIX, storage_options, cache)

    def _head(self) -> tuple[int, bytes]:
        """The ``.idx`` size and first bytes: a local file with one open (a corpus of many
        files opens each once, past the descriptor pool), a remote one through its blob."""
        if self._idx.remote:
            size = self._idx.size()
            return size, self._idx.read_range(0, min(HEADER.size, size))
        fd = os.open(self._idx.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.fstat(fd).st_size, os.pread(fd, HEADER.size, 0)
        finally:
            os.close(fd)

    def _header(self) -> tuple[int, int, int]:
        """``(dtype code, sequences, documents)``, checked."""
        size, raw = self._head()
        if len(raw) < HEADER.size or raw[:9] != MAGIC:
            raise DataFormatError(
                f"{self.idx_url} is not a Megatron index (no MMIDIDX header); pass the .idx "
                "written next to the .bin by preprocess_data.py",
                location=self.idx_url,
            )
        _, version, code, seqs, docs = HEADER.unpack(raw)
        if version != VERSION:
            raise DataFormatError(
                f"{self.idx_url}: Megatron index version {version} (only {VERSION} is defined)",
                location=self.idx_url,
            )
        if code not in DTYPE_CODES:
            raise DataFormatError(
                f"{self.idx_url}: unknown dtype code {code}; the format defines "
                f"{sorted(DTYPE_CODES)}",
                location=self.idx_url,
            )
        expected = HEADER.size + seqs * 12 + docs * 8
        if size < expected:
            raise DataFormatError(
                f"{self.idx_url} is truncated: {size} bytes, the header announces {expected} "
                f"({seqs} sequences, {docs} documents); copy it again",
                location=self.idx_url,
            )
        return code, seqs, docs

    def documents(self) -> int:
        """Rows: the header's sequence count (no array is read)."""
        return self._counts[0]

    def _layout(self) -> tuple[np.dtype[Any], int, int]:
        code, seqs, docs = self._header()
        self._counts = (seqs, docs)
        dtype = DTYPE_CODES[code]
        size = self.file_size()
        if size % dtype.itemsize:
            raise DataFormatError(
                f"{self._url}: {size} bytes is not a whole number of {dtype} tokens; the .bin "
                "is damaged or belongs to another index",
                location=self._url,
            )
        return dtype, 0, size // dtype.itemsize

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sequence lengths, pointers and document indices from the whole ``.idx``."""
        seqs, docs = self._counts
        raw = self._idx.read_range(HEADER.size, HEADER.size + seqs * 12 + docs * 8)
        lengths = np.frombuffer(raw, np.int32, seqs, 0)
        pointers = np.frombuffer(raw, np.int64, seqs, seqs * 4)
        doc_index = np.frombuffer(raw, np.int64, docs, seqs * 12)
        return lengths, pointers, doc_index

    def _load_spans(self) -> tuple[np.ndarray, np.ndarray]:
        lengths, pointers, _docs = self._arrays()
        if (pointers % self.dtype.itemsize).any():
            raise DataFormatError(
                f"{self.idx_url}: a sequence pointer is not aligned to {self.dtype} tokens",
                location=self.idx_url,
            )
        starts = pointers // self.dtype.itemsize
        lengths64 = lengths.astype(np.int64)
        self.check_spans(starts, lengths64, self.idx_url)
        return starts, lengths64

    def document_indices(self) -> np.ndarray:
        """Where documents start, in sequence numbers (the ``.idx``'s last array)."""
        return self._arrays()[2].copy()
