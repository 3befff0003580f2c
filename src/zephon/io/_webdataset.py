"""WebDataset tar shards (``.tar``): one row per sample, the sample's files as encoded bytes.

WebDataset groups consecutive tar members by key (the path up to the first dot of the file
name); a sample's fields are named by the rest (``0001.jpg`` -> key ``0001``, field ``jpg``).
Nothing is decoded here: a row is ``{"__key__": key, ext: bytes, ...}`` and decoding is an
operator's job (``decode_image``), on a worker, when the bytes are needed.

Random access comes from a byte-offset index: where each sample's first header starts, plus
where the last sample ends (the layout of Megatron-Energon's ``.tar.idx`` sidecar: little-endian
uint64 offsets). A sidecar next to the shard is used when present; otherwise the index is built
by one pass over the headers on the first read and kept in the cache folder, reused while the
shard's size and modification time match. A read fetches each sample's byte span (nearby spans
coalesced, ranged requests for remote shards) and splits it into files in memory.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import struct
import tarfile
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from zephon._atomic import write_atomic
from zephon.errors import DataError, DataFormatError
from zephon.io._blob import Blob, OneBlob
from zephon.io._cache import CacheOptions
from zephon.io._dataset import Row, checked_indices
from zephon.io._file_shard import LazyShard
from zephon.io._identity import stale_count_error
from zephon.io._paths import cache_file, derived_dir
from zephon.io._spans import read_spans

__all__ = ["SIDECAR_SUFFIX", "TAR_SUFFIXES", "TarShard", "sample_key"]

TAR_SUFFIXES = (".tar",)
SIDECAR_SUFFIX = ".idx"  # shard.tar -> shard.tar.idx, as Megatron-Energon writes it
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")
_MAGIC = b"ZWDS\x00\x01\x00\x00"
_HEADER = struct.Struct("<8sqqq")  # magic, source size, source mtime_ns, samples
_BLOCK = 512
_DAMAGED_HINT = "the shard is truncated or damaged; re-copy or re-write it"


def sample_key(name: str) -> tuple[str, str] | None:
    """``(key, field)`` of a member name as WebDataset splits it; None for names it skips
    (no dot in the file name, or ``__meta__`` files)."""
    if _META.match(name):
        return None
    found = _KEY.match(name)
    if found is None:
        return None
    return found.group(1), found.group(2).lower()


class TarShard(OneBlob, LazyShard):
    """One WebDataset tar shard (local or fsspec remote); rows are its samples."""

    _TRANSIENT = ("_url", "_lock", "_bounds", "_sidecar_used")

    def __init__(
        self,
        url: str,
        rows: int | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache: CacheOptions | None = None,
        columns: Sequence[str] | None = None,
    ) -> None:
        self._blob = Blob(url, storage_options, cache)
        self._columns = None if columns is None else list(columns)
        self._cache_dir = derived_dir(cache_dir, cache)
        self._indexed = rows is not None  # the count came from index.json
        self._init_transient()
        self._rows = rows if rows is not None else len(self._spans())

    def _init_transient(self) -> None:
        self._url = self._blob.url
        self._lock = threading.Lock()
        self._bounds: np.ndarray | None = None  # (n, 2) int64 [start, end) of every sample
        self._sidecar_used = False

    @property
    def location(self) -> str:
        return self._url

    def __len__(self) -> int:
        return self._rows

    # -- index --------------------------------------------------------------------------------

    def _spans(self) -> np.ndarray:
        bounds = self._bounds
        if bounds is not None:
            return bounds
        with self._lock:
            if self._bounds is None:
                offsets = self._load_or_build()
                bounds = np.stack([offsets[:-1], offsets[1:]], axis=1)
                expected = getattr(self, "_rows", None)
                if expected is not None and expected != len(bounds):
                    self._blob.check_unchanged()
                    raise stale_count_error(self._url, len(bounds), expected, indexed=self._indexed)
                self._bounds = bounds
            return self._bounds

    def _load_or_build(self) -> np.ndarray:
        """Sample start offsets plus the end of the last sample (n + 1 int64)."""
        try:
            stamp = self._blob.stamp()
        except FileNotFoundError as e:
            raise DataFormatError(f"shard {self._url} does not exist (was it moved?)") from e
        sidecar = self._sidecar(stamp[0])
        if sidecar is not None:
            self._sidecar_used = True
            return sidecar
        index_path = cache_file(self._url, ".wdsidx", self._cache_dir)
        loaded = _load_offsets(index_path, stamp)
        if loaded is not None:
            return loaded
        with self._blob.stream() as f:
            offsets = scan_samples(f, stamp[0], self._url)
        payload = _HEADER.pack(_MAGIC, stamp[0], stamp[1], len(offsets)) + offsets.tobytes()
        with contextlib.suppress(OSError):  # an unwritable cache only costs a rescan next time
            write_atomic(index_path, payload, durable=False)
        return offsets

    def _sidecar(self, size: int) -> np.ndarray | None:
        """The offsets of a ``.tar.idx`` next to the shard, or None when there is none. An end
        offset is added when the sidecar lists sample starts only."""
        side = Blob(self._url + SIDECAR_SUFFIX, self._blob.storage_options)
        try:
            raw = side.read_range(0, side.size())
        except FileNotFoundError:
            return None
        except DataError as e:  # a remote store says "does not exist" this way
            if isinstance(e.__cause__, FileNotFoundError):
                return None
            raise
        if len(raw) % 8:
            raise DataFormatError(
                f"index {side.url} has {len(raw)} bytes, not a whole number of uint64 offsets; "
                "delete it (zephon then indexes the shard itself)"
            )
        offsets = np.frombuffer(raw, dtype="<u8").astype(np.int64)
        if len(offsets) and (np.any(np.diff(offsets) <= 0) or offsets[-1] > size):
            raise DataFormatError(
                f"index {side.url} does not match {self._url} (offsets not increasing or past "
                f"its {size} bytes); delete the index (zephon then indexes the shard itself)"
            )
        last = int(offsets[-1]) if len(offsets) else 0
        if not len(offsets) or any(self._blob.read_range(last, last + _BLOCK)):
            # the last entry starts a sample: it ends where the archive's end marker begins
            offsets = np.append(offsets, self._archive_end(last))
        return offsets

    def _archive_end(self, last_start: int) -> int:
        """Where the members after ``last_start`` end (the end-of-archive marker)."""
        with self._blob.stream() as f:
            f.seek(last_start)
            ends = scan_samples(f, self._blob.size(), self._url, base=last_start)
        return int(ends[-1])

    # -- reads --------------------------------------------------------------------------------

    def read(self, indices: Sequence[int]) -> list[Row]:
        idx = checked_indices(indices, len(self), self._url)
        bounds = self._spans()
        raws = read_spans(self._blob.read_range, bounds, idx, self._blob.max_gap)
        out: list[Row] = []
        for i, raw in zip(idx.tolist(), raws, strict=True):
            row = self._sample(i, int(bounds[i][0]), raw)
            if self._columns is not None:
                row = self._project(i, row)
            out.append(row)
        return out

    def _sample(self, i: int, start: int, raw: bytes) -> Row:
        """The fields of sample ``i`` from its bytes (which begin at byte ``start``)."""
        row: Row = {}
        try:
            members = _members(raw)
            for name, data in members:
                found = sample_key(name)
                if found is None:
                    continue
                key, field = found
                if row.setdefault("__key__", key) != key:
                    raise ValueError(
                        f"member {name!r} belongs to another sample than {row['__key__']!r}"
                    )
                if field in row:
                    raise ValueError(f"member {name!r} repeats field {field!r}")
                row[field] = data
        except (tarfile.TarError, ValueError) as e:
            hint = _DAMAGED_HINT
            if self._sidecar_used:
                hint += f", or delete {self._url}{SIDECAR_SUFFIX} if it is older than the shard"
            raise DataFormatError(
                f"{self._url}, sample {i} (byte {start}): cannot be read ({e})",
                location=self._url,
                hint=hint,
            ) from None
        return row

    def _project(self, i: int, row: Row) -> Row:
        cols = self._columns
        assert cols is not None
        missing = [c for c in cols if c not in row]
        if missing:
            raise DataFormatError(
                f"{self._url}, sample {i} (key {row.get('__key__')!r}) has no field(s) "
                f"{missing}; fields: {sorted(row)}. Fix `columns=` or the data",
                location=self._url,
            )
        return {c: row[c] for c in cols}


def _members(raw: bytes) -> Iterator[tuple[str, bytes]]:
    """``(name, data)`` of every regular file in a run of whole tar members."""
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        for info in tar:
            if not info.isreg():
                continue
            end = info.offset_data + info.size
            if end > len(raw):
                raise ValueError(f"member {info.name!r} is cut short")
            yield info.name, raw[info.offset_data : end]


def scan_samples(f: Any, size: int, url: str, *, base: int = 0) -> np.ndarray:
    """Start offsets of the samples of the tar stream ``f`` (positioned at ``base``) plus the
    end of the last one: one pass over the headers, file data skipped."""
    starts: list[int] = []
    key: str | None = None
    end = base
    try:
        with tarfile.open(fileobj=_Offset(f, base), mode="r:") as tar:
            for info in tar:
                found = sample_key(info.name) if info.isreg() else None
                if found is None:
                    continue
                if found[0] != key:
                    starts.append(base + info.offset)
                    key = found[0]
                end = base + info.offset_data + -(-info.size // _BLOCK) * _BLOCK
                if base + info.offset_data + info.size > size:
                    raise tarfile.ReadError(f"member {info.name!r} is cut short")
            marker = base + tar.offset
    except tarfile.TarError as e:
        raise DataFormatError(
            f"{url}: not a readable tar shard ({e})", location=url, hint=_DAMAGED_HINT
        ) from None
    f.seek(marker)
    if size - marker < _BLOCK or any(f.read(_BLOCK)):
        raise DataFormatError(
            f"{url}: the tar shard ends at byte {size} without its end-of-archive marker",
            location=url,
            hint=_DAMAGED_HINT,
        )
    return np.array([*starts, end], dtype=np.int64)


class _Offset(io.RawIOBase):
    """``f`` seen from byte ``base`` on (tar offsets then start at 0)."""

    def __init__(self, f: Any, base: int) -> None:
        self._f, self._base = f, base

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        return bytes(self._f.read(n))

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence == 0:
            return int(self._f.seek(pos + self._base)) - self._base
        return int(self._f.seek(pos, whence)) - self._base

    def tell(self) -> int:
        return int(self._f.tell()) - self._base


def _load_offsets(path: Any, stamp: tuple[int, int]) -> np.ndarray | None:
    try:
        with open(path, "rb") as f:
            header = f.read(_HEADER.size)
            body = f.read()
    except OSError:
        return None
    if len(header) < _HEADER.size:
        return None
    magic, size, mtime, count = _HEADER.unpack(header)
    if magic != _MAGIC or (size, mtime) != stamp or len(body) != count * 8:
        return None
    return np.frombuffer(body, dtype=np.int64)
