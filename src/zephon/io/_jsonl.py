"""JSONL shards (plain, ``.gz``, ``.zst``, ``.bz2``, ``.xz``) with a byte-offset index for O(1)
random access.

The index is an ``(n, 2)`` int64 array of ``[start, end)`` byte ranges of the non-blank lines,
built once per shard by one streaming pass and saved in the cache folder (never next to the
data). A saved index is reused only while the source's size and modification time match.
Compressed shards cannot be read at random offsets, so they are decompressed once into the
cache folder and indexed there.

Reads sort the requested rows by offset, coalesce nearby rows into one ``pread`` (local or
cached) or one ranged request (remote), and decode each line with ``msgspec.json``.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from zephon._atomic import write_atomic
from zephon.errors import DataFormatError
from zephon.io._blob import Blob, OneBlob
from zephon.io._cache import CacheOptions
from zephon.io._dataset import Row, Shard
from zephon.io._identity import stale_count_error
from zephon.io._paths import cache_file, derived_dir
from zephon.io._spans import read_spans

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}

_MAGIC = b"ZIDX\x00\x01\x00\x00"
_HEADER = struct.Struct("<8sqqqq")  # magic, src_size, src_mtime_ns, rows, data_size
_HEADER_BYTES = 64
_BLOCK = 16 << 20
_WS = np.zeros(256, dtype=bool)
_WS[[9, 13, 32]] = True  # tab, CR, space (LF splits lines)


def jsonl_compression(path: str) -> str | None:
    """``"gzip"``/``"zstd"``/``"bz2"``/``"xz"`` for compressed JSONL names, else ``None``."""
    for suffix, kind in COMPRESSIONS.items():
        if path.endswith(suffix):
            return kind
    return None


def is_jsonl(path: str) -> bool:
    base = path
    for suffix in COMPRESSIONS:
        if base.endswith(suffix):
            base = base[: -len(suffix)]
            break
    return base.endswith(JSONL_SUFFIXES)


def scan_lines(blocks: Iterator[bytes]) -> tuple[np.ndarray, list[int]]:
    """Byte ranges of all lines in a stream of blocks, plus the rows that start with whitespace.

    Returns ``(bounds, suspects)``: ``bounds`` is ``(n, 2)`` int64 ``[start, end)`` without the
    newline (empty lines already removed); ``suspects`` are row numbers whose first byte is
    whitespace, which may be blank and need a content check by the caller.
    """
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    firsts: list[np.ndarray] = []
    base = 0
    line_start = 0
    pending_first = -1  # first byte of the line that started in an earlier block, if known
    for block in blocks:
        if not block:
            continue
        arr = np.frombuffer(block, dtype=np.uint8)
        nl = np.flatnonzero(arr == 10)
        if pending_first < 0 and line_start < base + len(arr):
            pending_first = int(arr[line_start - base])
        if len(nl):
            nl_abs = nl.astype(np.int64) + base
            s = np.empty(len(nl), dtype=np.int64)
            s[0] = line_start
            s[1:] = nl_abs[:-1] + 1
            f = np.empty(len(nl), dtype=np.int64)
            f[0] = pending_first
            # First byte of every later line; a line that starts at the next block's first byte
            # is never here (it starts after the last newline).
            f[1:] = arr[nl[:-1] + 1]
            starts.append(s)
            ends.append(nl_abs)
            firsts.append(f)
            line_start = int(nl_abs[-1]) + 1
            pending_first = int(arr[nl[-1] + 1]) if nl[-1] + 1 < len(arr) else -1
        base += len(arr)
    if line_start < base:  # last line without a trailing newline
        starts.append(np.array([line_start], dtype=np.int64))
        ends.append(np.array([base], dtype=np.int64))
        firsts.append(np.array([pending_first], dtype=np.int64))
    if not starts:
        return np.zeros((0, 2), dtype=np.int64), []
    s_all = np.concatenate(starts)
    e_all = np.concatenate(ends)
    f_all = np.concatenate(firsts)
    keep = e_all > s_all
    s_all, e_all, f_all = s_all[keep], e_all[keep], f_all[keep]
    suspects = np.flatnonzero(_WS[np.clip(f_all, 0, 255)] & (f_all >= 0)).tolist()
    return np.stack([s_all, e_all], axis=1), suspects


class JsonlShard(OneBlob, Shard):
    """One JSONL file; rows are the non-blank lines, each a JSON object.

    ``rows`` may be given (from ``index.json``) so construction does not touch the file; the
    offset index is then built or loaded on the first read.
    """

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
        self._rows = rows if rows is not None else len(self._bounds_array())

    def _init_transient(self) -> None:
        self._url = self._blob.url
        self._compression = jsonl_compression(self._url)
        self._lock = threading.RLock()
        self._bounds: np.ndarray | None = None
        self._raw: Blob | None = None  # the decompressed copy, for compressed shards
        self._decoder = msgspec.json.Decoder()
        self._lines: np.ndarray | None = None  # 1-based line of every row, built on demand

    def __getstate__(self) -> dict[str, Any]:
        return {
            "blob": self._blob,
            "rows": self._rows,
            "cache_dir": self._cache_dir,
            "columns": self._columns,
            "indexed": self._indexed,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._blob = state["blob"]
        self._columns = state["columns"]
        self._cache_dir = state["cache_dir"]
        self._indexed = state.get("indexed", True)
        self._init_transient()
        self._rows = state["rows"]

    @property
    def location(self) -> str:
        return self._url

    def __len__(self) -> int:
        return self._rows

    # -- index --------------------------------------------------------------------------------

    def _bounds_array(self) -> np.ndarray:
        bounds = self._bounds
        if bounds is not None:
            return bounds
        with self._lock:
            if self._bounds is None:
                bounds = self._load_or_build()
                expected = getattr(self, "_rows", None)
                if expected is not None and expected != len(bounds):
                    self._blob.check_unchanged()
                    raise stale_count_error(self._url, len(bounds), expected, indexed=self._indexed)
                self._bounds = bounds
            return self._bounds

    def _load_or_build(self) -> np.ndarray:
        try:
            stamp = self._blob.stamp()
        except FileNotFoundError as e:
            raise DataFormatError(f"shard {self._url} does not exist (was it moved?)") from e
        index_path = cache_file(self._url, ".zidx", self._cache_dir)
        raw_path = Path(str(index_path)[:-5] + ".raw")
        loaded = _load_index(index_path, stamp)
        if loaded is not None:
            bounds, data_size = loaded
            if self._compression is None:
                return bounds
            if raw_path.exists() and raw_path.stat().st_size == data_size:
                self._raw = Blob(str(raw_path))
                return bounds
        if self._compression is not None:
            data_size = self._decompress_to(raw_path)
            self._raw = Blob(str(raw_path))
        else:
            data_size = stamp[0]
        with (self._raw or self._blob).stream() as f:
            bounds, suspects = scan_lines(_blocks(f))
        if suspects:
            bounds = self._drop_blank(bounds, suspects)
        header = _HEADER.pack(_MAGIC, stamp[0], stamp[1], len(bounds), data_size)
        payload = header.ljust(_HEADER_BYTES, b"\0") + np.ascontiguousarray(bounds).tobytes()
        with contextlib.suppress(OSError):  # an unwritable cache only costs a rescan next time
            write_atomic(index_path, payload, durable=False)
        return bounds

    def _drop_blank(self, bounds: np.ndarray, suspects: list[int]) -> np.ndarray:
        rows = self._read_raw(bounds, suspects)
        blank = [r for r, raw in zip(suspects, rows, strict=True) if not raw.strip()]
        return np.delete(bounds, blank, axis=0) if blank else bounds

    def _decompress_to(self, target: Path) -> int:
        """Decompress the shard into the cache folder; a corrupt stream names the shard."""
        import lzma

        import zstandard

        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + f".{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with self._blob.stream() as raw, open(tmp, "wb") as out:
                if self._compression == "zstd":
                    size = _unzstd(raw, out)
                else:
                    size = _unstream(self._compression or "gzip", raw, out)
            os.replace(tmp, target)
        except (OSError, EOFError, zstandard.ZstdError, lzma.LZMAError) as e:
            tmp.unlink(missing_ok=True)
            if isinstance(e, FileNotFoundError):
                raise DataFormatError(f"shard {self._url} does not exist") from e
            raise DataFormatError(
                f"compressed shard {self._url} is corrupt or truncated ({self._compression}: {e}); "
                "re-create or re-download it"
            ) from e
        return size

    # -- reads --------------------------------------------------------------------------------

    def _read_range(self, start: int, end: int) -> bytes:
        return (self._raw or self._blob).read_range(start, end)

    def _read_raw(self, bounds: np.ndarray, indices: Sequence[int]) -> list[bytes]:
        """Raw line bytes for ``indices`` (in the order asked), with coalesced reads."""
        blob = self._raw or self._blob
        return read_spans(blob.read_range, bounds, indices, blob.max_gap)

    def read(self, indices: Sequence[int]) -> list[Row]:
        bounds = self._bounds_array()
        n = len(bounds)
        for i in indices:
            if not 0 <= i < n:
                raise IndexError(f"row {i} out of range for shard {self._url} with {n} rows")
        decode = self._decoder.decode
        out: list[Row] = []
        for idx, raw in zip(indices, self._read_raw(bounds, indices), strict=True):
            try:
                row = decode(raw)
            except msgspec.DecodeError as e:
                line = self._line_number(int(bounds[idx][0]))
                why = sniff_not_jsonl(self._read_range(0, min(_SNIFF, int(bounds[-1][1]))), raw)
                raise DataFormatError(
                    f"{self._url}, line {line}: " + (why or _bad_line(raw, e)),
                    location=self._url,
                    line=line,
                    hint=None if why else _SKIP_HINT,
                ) from None
            if not isinstance(row, dict):
                line = self._line_number(int(bounds[idx][0]))
                raise DataFormatError(
                    f"{self._url}, line {line}: expected a JSON object per line, got "
                    f"{type(row).__name__}{_ARRAY_HINT if isinstance(row, list) else ''}",
                    location=self._url,
                    line=line,
                )
            out.append(row)
        return out if self._columns is None else self._project(out, indices, bounds)

    def _project(self, rows: list[Row], indices: Sequence[int], bounds: np.ndarray) -> list[Row]:
        cols = self._columns
        assert cols is not None
        try:
            return [{c: row[c] for c in cols} for row in rows]
        except KeyError:
            pos = next(i for i, row in enumerate(rows) if any(c not in row for c in cols))
            missing = [c for c in cols if c not in rows[pos]]
            line = self._line_number(int(bounds[indices[pos]][0]))
            raise DataFormatError(
                f"{self._url}, line {line}: no column(s) {missing}; available: "
                f"{sorted(rows[pos])}. Fix `columns=` or the data"
            ) from None

    def line_of(self, row: int) -> int:
        """1-based line number of row ``row`` (blank lines are not rows)."""
        return int(self.lines()[row])

    def lines(self) -> np.ndarray:
        """The 1-based line of every row, built once from the offset index: a row's line is
        its row number plus the blank lines before it, and only the bytes between rows that
        are not adjacent (blank lines) are read to count those."""
        lines = self._lines
        if lines is not None:
            return lines
        bounds = self._bounds_array()
        starts = bounds[:, 0]
        expected = np.empty(len(bounds), dtype=np.int64)
        expected[:1] = 0
        expected[1:] = bounds[:-1, 1] + 1  # the byte after the previous row's newline
        dropped = np.zeros(len(bounds), dtype=np.int64)
        for i in np.flatnonzero(starts > expected).tolist():
            dropped[i] = self._read_range(int(expected[i]), int(starts[i])).count(b"\n")
        lines = np.arange(1, len(bounds) + 1, dtype=np.int64) + np.cumsum(dropped)
        self._lines = lines
        return lines

    def _line_number(self, offset: int) -> int:
        """1-based line number of the line starting at ``offset`` (error path only)."""
        count = 0
        pos = 0
        while pos < offset:
            end = min(offset, pos + _BLOCK)
            count += self._read_range(pos, end).count(b"\n")
            pos = end
        return count + 1


_SNIFF = 4096
# What works after a bad line: deleting it changes the shard's row count, which a resume refuses.
_SKIP_HINT = (
    "to go on, set `fetch: {on_error: skip}` (the record is logged and quarantined) and resume; "
    "or overwrite the line in place. Do not delete the line: the row count would change and "
    "the checkpoint would be refused"
)
_ARRAY_HINT = "; for a file holding one JSON array: jq -c '.[]' FILE > FILE.jsonl"
_BOM = b"\xef\xbb\xbf"


def sniff_not_jsonl(head: bytes, line: bytes) -> str | None:
    """Why a file whose ``line`` failed to decode is not JSON Lines, when its first bytes
    (``head``) show it: a byte order mark, binary data, a JSON array or pretty-printed JSON."""
    if line.startswith(_BOM):
        return (
            "the file starts with a UTF-8 byte order mark (BOM), which JSON Lines does not "
            "allow; save it as UTF-8 without BOM"
        )
    if (b"\0" in head or _not_utf8(head)) and not _holds_json_lines(head, line):
        return (
            "the file is binary, not JSON Lines text; give the dataset's real format "
            "(format: parquet | arrow | vortex | hf | lance | mds | litdata) or a file with one "
            "JSON object per line"
        )
    first = head.lstrip()[:1]
    if first == b"[":
        return (
            "the file is one JSON array, not JSON Lines (one object per line); convert it, "
            "e.g. jq -c '.[]' FILE > FILE.jsonl"
        )
    if first == b"{" and (line.strip() in (b"{", b"}") or line.lstrip()[:1] == b'"'):
        return (
            "the file looks like pretty-printed JSON spread over several lines; JSON Lines "
            "needs each object on one line (jq -c . FILE > FILE.jsonl)"
        )
    return None


def _holds_json_lines(head: bytes, line: bytes) -> bool:
    """Whether a line of ``head`` other than the bad ``line`` is a JSON object: then the file
    is JSON Lines with a bad line in it, not a binary file given the wrong format."""
    bad = line.strip()
    for piece in head.split(b"\n"):
        piece = piece.strip()
        if piece[:1] != b"{" or piece == bad:
            continue
        try:
            if isinstance(msgspec.json.decode(piece), dict):
                return True
        except msgspec.DecodeError:
            continue
    return False


def _bad_line(raw: bytes, error: Exception) -> str:
    """What is wrong with one line of an otherwise good JSON Lines file."""
    if b"\0" in raw or _not_utf8(raw + b"    "):  # the padding: a cut at the end counts too
        return f"binary data, not a JSON object ({error})"
    return f"malformed JSON ({error})"


def _not_utf8(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start < len(head) - 3  # a multi-byte character cut at the end is fine
    return False


def _load_index(path: Path, stamp: tuple[int, int]) -> tuple[np.ndarray, int] | None:
    try:
        with open(path, "rb") as f:
            header = f.read(_HEADER_BYTES)
            if len(header) < _HEADER_BYTES:
                return None
            magic, size, mtime, rows, data_size = _HEADER.unpack_from(header)
            if magic != _MAGIC or (size, mtime) != stamp:
                return None
            body = f.read()
    except OSError:
        return None
    if len(body) != rows * 16:
        return None
    return np.frombuffer(body, dtype=np.int64).reshape(rows, 2), data_size


def _blocks(f: Any) -> Iterator[bytes]:
    while True:
        buf = f.read(_BLOCK)
        if not buf:
            return
        yield buf


def _unstream(kind: str, raw: Any, out: Any) -> int:
    """Decompress a gzip, bz2 or xz stream (each truncated stream raises ``EOFError``)."""
    import bz2
    import gzip
    import lzma

    opener: Any = {"bz2": bz2.BZ2File, "xz": lzma.LZMAFile}.get(kind)
    size = 0
    with opener(raw) if opener is not None else gzip.GzipFile(fileobj=raw) as stream:
        while buf := stream.read(_BLOCK):
            out.write(buf)
            size += len(buf)
    return size


def _unzstd(raw: Any, out: Any) -> int:
    """Decompress every frame; a stream that ends inside a frame is an error (not silent)."""
    import zstandard

    dctx = zstandard.ZstdDecompressor()
    dobj = dctx.decompressobj()
    fed = False
    size = 0
    while buf := raw.read(_BLOCK):
        while buf:
            data = dobj.decompress(buf)
            fed = True
            out.write(data)
            size += len(data)
            if dobj.eof:
                buf = dobj.unused_data
                dobj = dctx.decompressobj()
                fed = False
            else:
                buf = b""
    if fed and not dobj.eof:
        raise EOFError("the zstd stream ends inside a frame")
    return size
