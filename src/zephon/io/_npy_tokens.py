"""OLMo-style token arrays: ``NAME.npy``, every document's tokens back to back.

Two layouts are read: a raw memmap with no header (what ``dolma tokens`` and OLMo's
``prepare_memmap_dataset.py`` write; the dtype is given with ``format_options={"token_dtype":
"uint16"}``) and a real ``.npy`` file (``np.save`` of a 1-D array; dtype from its header).

Documents come from ``NAME.csv.gz`` next to the array when present (dolma's metadata: one line per
document, ``start,end,...`` in tokens), else from the positions of the end-of-document token
(``format_options={"eos_id": N}``; a document ends with its EOS token). Finding EOS tokens reads
the whole array once per process (a vectorised scan), so a file's document count costs a pass
over it; the sample views of :mod:`zephon.io._token_samples` need no documents at all.
"""

from __future__ import annotations

import ast
import gzip
import io
from collections.abc import Mapping
from typing import Any

import numpy as np

from zephon.errors import ConfigError, DataError, DataFormatError
from zephon.io._blob import Blob
from zephon.io._cache import CacheOptions
from zephon.io._token_files import TokenFile

NPY_MAGIC = b"\x93NUMPY"
METADATA_SUFFIX = ".csv.gz"
_SCAN = 1 << 24  # tokens per step of the EOS scan


def npy_header(head: bytes, url: str) -> tuple[np.dtype[Any], int, int] | None:
    """``(dtype, data offset, tokens)`` of an ``.npy`` header, or None for a raw array."""
    if not head.startswith(NPY_MAGIC):
        return None
    major = head[6]
    if major == 1:
        hlen, start = int.from_bytes(head[8:10], "little"), 10
    else:
        hlen, start = int.from_bytes(head[8:12], "little"), 12
    try:
        meta = ast.literal_eval(head[start : start + hlen].decode("latin1"))
        dtype, shape = np.dtype(meta["descr"]), tuple(meta["shape"])
        fortran = bool(meta["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError) as exc:
        raise DataFormatError(f"{url}: unreadable .npy header ({exc})", location=url) from None
    if len(shape) != 1 or fortran or dtype.kind not in "iu":
        raise DataFormatError(
            f"{url}: a token array is 1-D of integers, this one is {dtype} of shape {shape}; "
            "save the flat token array (np.save(path, tokens.ravel()))",
            location=url,
        )
    return dtype, start + hlen, int(shape[0])


class NpyTokenFile(TokenFile):
    """One token array, with dolma's ``.csv.gz`` metadata or an EOS id for documents."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        cache: CacheOptions | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        opts = dict(options or {})
        unknown = sorted(set(opts) - {"token_dtype", "eos_id"})
        if unknown:
            raise ConfigError(
                f"format_options {unknown} are unknown for npy token files; known: "
                "token_dtype, eos_id"
            )
        self._token_dtype = opts.get("token_dtype")
        self._eos = opts.get("eos_id")
        self._meta = Blob(url[: -len(".npy")] + METADATA_SUFFIX, storage_options, cache)
        super().__init__(url, storage_options, cache)

    def _layout(self) -> tuple[np.dtype[Any], int, int]:
        size = self.file_size()
        found = npy_header(self.read_bytes(0, min(size, 4096)), self._url)
        if found is not None:
            dtype, offset, n = found
            if offset + n * dtype.itemsize > size:
                raise DataFormatError(
                    f"{self._url} is truncated: its header announces {n} tokens", location=self._url
                )
            return dtype, offset, n
        if self._token_dtype is None:
            raise ConfigError(
                f"{self._url} is a raw token array (no .npy header); say its dtype with "
                'format_options={"token_dtype": "uint16"} (or uint32)'
            )
        dtype = np.dtype(self._token_dtype)
        if size % dtype.itemsize:
            raise DataFormatError(
                f"{self._url}: {size} bytes is not a whole number of {dtype} tokens; check "
                "token_dtype",
                location=self._url,
            )
        return dtype, 0, size // dtype.itemsize

    def _load_spans(self) -> tuple[np.ndarray, np.ndarray]:
        try:
            size = self._meta.size()
        except (FileNotFoundError, OSError, DataError):
            return self._eos_spans()
        return self._metadata_spans(self._meta.read_range(0, size))

    def _metadata_spans(self, raw: bytes) -> tuple[np.ndarray, np.ndarray]:
        text = gzip.decompress(raw).decode()
        rows = [line.split(",", 2)[:2] for line in io.StringIO(text).read().splitlines() if line]
        if rows and not rows[0][0].strip().isdigit():
            rows = rows[1:]  # a header line
        try:
            bounds = np.array(rows, dtype=np.int64).reshape(-1, 2)
        except ValueError:
            raise DataFormatError(
                f"{self._meta.url}: a line does not start with start,end token offsets",
                location=self._meta.url,
            ) from None
        starts, lengths = bounds[:, 0], bounds[:, 1] - bounds[:, 0]
        self.check_spans(starts, lengths, self._meta.url)
        return starts, lengths

    def _eos_spans(self) -> tuple[np.ndarray, np.ndarray]:
        if self._eos is None:
            raise ConfigError(
                f"{self._url} has no {self._meta.url} listing its documents; give the end-of-"
                'document token with format_options={"eos_id": N}'
            )
        ends: list[np.ndarray] = []
        for lo in range(0, self.n_tokens, _SCAN):
            part = self.read_tokens(lo, min(self.n_tokens, lo + _SCAN))
            ends.append(np.flatnonzero(part == self._eos) + (lo + 1))
        end = np.concatenate(ends) if ends else np.zeros(0, np.int64)
        if not len(end) or end[-1] != self.n_tokens:
            end = np.append(end, self.n_tokens)  # a last document without EOS
        end = end[end > 0]
        starts = np.zeros(len(end), dtype=np.int64)
        starts[1:] = end[:-1]
        return starts, end - starts
