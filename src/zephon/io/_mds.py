"""Mosaic MDS shard folders (``index.json`` version 2 with ``"format": "mds"`` shards).

Read from MDS's documented layout, without ``mosaicml-streaming``: a shard file starts with
``uint32 n``, then ``n + 1`` absolute ``uint32`` sample offsets, then the samples; a sample is
the ``uint32`` sizes of its variable-size columns followed by the column bytes. The offsets make
samples addressable by byte range, so an uncompressed remote shard is read with ranged requests
exactly like JSONL. Compressed shards (``zip_data``) are fetched once, checked against the hashes
in ``index.json``, and decompressed into the cache folder.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import posixpath
import struct
import threading
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import msgspec
import numpy as np
import xxhash

from zephon._atomic import write_atomic
from zephon.errors import DataFormatError
from zephon.io._blob import Blob, OneBlob
from zephon.io._cache import CacheOptions
from zephon.io._dataset import Row, Shard, checked_indices, missing_columns
from zephon.io._file_shard import LazyShard
from zephon.io._mds_codecs import extra_decoder
from zephon.io._paths import cache_file
from zephon.io._spans import read_spans

Decoder = Callable[[bytes], Any]


def _scalar(dtype: str) -> Decoder:
    np_type = np.dtype(dtype).newbyteorder("<")
    return lambda b: np.frombuffer(b, np_type)[0].item()


DECODERS: dict[str, Decoder] = {
    "bytes": bytes,
    "str": lambda b: b.decode("utf-8"),
    "int": _scalar("int64"),
    "json": msgspec.json.decode,
    "str_int": lambda b: int(b.decode()),
    "str_float": lambda b: float(b.decode()),
    "str_decimal": lambda b: Decimal(b.decode()),
    **{
        t: _scalar(t)
        for t in ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64")
    },
    **{t: _scalar(t) for t in ("float16", "float32", "float64")},
}
SUPPORTED = ", ".join([*sorted(DECODERS), "ndarray", "jpeg", "png", "pil", "pkl"])
_DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {"gz": gzip.decompress, "bz2": bz2.decompress}


def is_mds_index(data: Any) -> bool:
    shards = data.get("shards") if isinstance(data, dict) else None
    return (
        data.get("version") == 2
        and isinstance(shards, list)
        and all(isinstance(s, dict) and s.get("format") == "mds" for s in shards)
    )


def _decompressor(name: str, location: str) -> Callable[[bytes], bytes]:
    family = name.split(":", 1)[0]
    if family == "zstd":
        import zstandard

        return lambda data: zstandard.ZstdDecompressor().decompressobj().decompress(data)
    if family in _DECOMPRESS:
        return _DECOMPRESS[family]
    raise DataFormatError(
        f"MDS shard {location} uses compression {name!r}; supported: zstd, gz, bz2. "
        "Rewrite the dataset with one of them"
    )


def check_hashes(data: bytes, expected: dict[str, str], location: str) -> None:
    """Compare ``data`` with the hashes ``index.json`` recorded (unknown algorithms skipped)."""
    for algo, want in expected.items():
        make = getattr(hashlib, algo, None) or getattr(xxhash, algo, None)
        if make is None:
            continue
        got = make(data).hexdigest()
        if got != want:
            raise DataFormatError(
                f"MDS shard {location} is damaged: its {algo} is {got}, index.json says {want}; "
                "re-copy the shard"
            )


class MdsShard(OneBlob, LazyShard):
    """One shard of an MDS folder; ``columns`` decodes just those columns."""

    _TRANSIENT = ("_lock", "_data", "_bounds")

    def __init__(
        self,
        folder: str,
        info: dict[str, Any],
        *,
        columns: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        cache: CacheOptions | None = None,
        cache_dir: str | None = None,
        decode_images: bool = False,
        allow_pickle: bool = False,
    ) -> None:
        self._folder, self._info = folder, info
        self._decode_images, self._allow_pickle = decode_images, allow_pickle
        zipped = info.get("zip_data")
        name = (zipped or info["raw_data"])["basename"]
        self._blob = Blob(_join(folder, name), storage_options, cache)
        self._columns = None if columns is None else list(columns)
        self._cache_dir = cache_dir
        names = list(info["column_names"])
        missing_columns(self.location, self._columns, names)
        self._plan = self._decode_plan(names)
        self._init_transient()

    def _init_transient(self) -> None:
        self._lock = threading.Lock()
        self._data: Blob | None = None
        self._bounds: np.ndarray | None = None

    @property
    def location(self) -> str:
        return self._blob.url

    def __len__(self) -> int:
        return int(self._info["samples"])

    def _decode_plan(self, names: list[str]) -> list[tuple[int, str, Decoder | None]]:
        """Per column: (fixed size or 0, name, decoder or None when not projected)."""
        plan = []
        wanted = set(self._columns) if self._columns is not None else None
        for name, enc, size in zip(
            names, self._info["column_encodings"], self._info["column_sizes"], strict=True
        ):
            keep = wanted is None or name in wanted
            decoder = DECODERS.get(enc)
            why = None
            if decoder is None:
                decoder, why = extra_decoder(
                    enc, decode_images=self._decode_images, allow_pickle=self._allow_pickle
                )
            if decoder is None and keep:
                raise DataFormatError(
                    f"MDS shard {self.location}: column {name!r} has encoding {enc!r}, "
                    + (why or f"which zephon does not decode (supported: {SUPPORTED})")
                    + "; or project it away with columns=[...]"
                )
            plan.append((int(size or 0), name, decoder if keep else None))
        return plan

    def _open(self) -> tuple[Blob, np.ndarray]:
        with self._lock:
            if self._data is None or self._bounds is None:
                data = self._raw_blob()
                self._bounds = self._offsets(data)
                self._data = data
            return self._data, self._bounds

    def _raw_blob(self) -> Blob:
        zipped = self._info.get("zip_data")
        if not zipped:
            return self._blob
        raw = self._info["raw_data"]
        key = f"{self._blob.url}@{zipped.get('bytes')}:{json.dumps(zipped.get('hashes') or {})}"
        target = cache_file(key, ".mds", self._cache_dir)
        if not (target.exists() and target.stat().st_size == raw["bytes"]):
            blob = self._blob.read_range(0, self._blob.size())
            check_hashes(blob, zipped.get("hashes") or {}, self.location)
            decompress = _decompressor(str(self._info.get("compression")), self.location)
            try:
                data = decompress(blob)
            except Exception as e:  # each codec has its own error type
                raise DataFormatError(
                    f"MDS shard {self.location} is damaged and cannot be decompressed ({e}); "
                    "re-copy the shard"
                ) from e
            check_hashes(data, raw.get("hashes") or {}, self.location)
            write_atomic(target, data, durable=False)
        return Blob(str(target))

    def _offsets(self, data: Blob) -> np.ndarray:
        n = len(self)
        size = int(self._info["raw_data"]["bytes"])
        head = data.read_range(0, 4 * (n + 2))
        offsets = np.frombuffer(head, dtype="<u4", offset=4) if len(head) >= 4 else None
        problem = None
        if offsets is None or len(offsets) != n + 1:
            problem = "it is shorter than its offset table"
        elif struct.unpack_from("<I", head)[0] != n:
            problem = f"its header says {struct.unpack_from('<I', head)[0]} samples, not {n}"
        elif np.any(np.diff(offsets.astype(np.int64)) < 0) or int(offsets[-1]) != size:
            problem = f"its offsets are inconsistent with its size of {size} bytes"
        elif data.size() != size:
            problem = f"it has {data.size()} bytes, index.json says {size}"
        if problem:
            raise DataFormatError(
                f"MDS shard {self.location} is damaged: {problem}; re-copy the shard"
            )
        assert offsets is not None
        starts = offsets.astype(np.int64)
        return np.stack([starts[:-1], starts[1:]], axis=1)

    def read(self, indices: Sequence[int]) -> list[Row]:
        idx = checked_indices(indices, len(self), self.location)
        data, bounds = self._open()
        plan = self._plan
        nvar = sum(1 for size, _, _ in plan if not size)
        out: list[Row] = []
        spans = read_spans(data.read_range, bounds, idx, data.max_gap)
        for i, raw in zip(idx.tolist(), spans, strict=True):
            try:
                var = iter(struct.unpack_from(f"<{nvar}I", raw))
                pos = 4 * nvar
                row: Row = {}
                for fixed, name, decoder in plan:
                    size = fixed or next(var)
                    if decoder is not None:
                        row[name] = decoder(raw[pos : pos + size])
                    pos += size
            except (struct.error, ValueError, UnicodeDecodeError, msgspec.DecodeError) as e:
                raise DataFormatError(
                    f"MDS shard {self.location}, sample {i}: cannot be decoded ({e}); "
                    "the shard is damaged, re-copy it"
                ) from None
            out.append(row)
        return out


def _join(folder: str, name: str) -> str:
    return f"{folder.rstrip('/')}/{name}" if "://" in folder else posixpath.join(folder, name)


def mds_shards(
    folder: str,
    index: dict[str, Any],
    *,
    columns: Sequence[str] | None,
    storage_options: dict[str, Any] | None,
    cache: CacheOptions | None,
    cache_dir: str | None,
    decode_images: bool = False,
    allow_pickle: bool = False,
) -> list[Shard]:
    return [
        MdsShard(
            folder,
            info,
            columns=columns,
            storage_options=storage_options,
            cache=cache,
            cache_dir=cache_dir,
            decode_images=decode_images,
            allow_pickle=allow_pickle,
        )
        for info in index["shards"]
    ]
