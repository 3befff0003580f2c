"""The node-local shard cache: each remote shard is downloaded once per node and read locally.

Layout of ``CacheOptions.dir``::

    objects/<key>-<name>        a whole shard, as downloaded
    objects/<key>-<name>.meta   JSON: url, size, xxh3-64 hash, ETag; its mtime is the last use
    objects/<key>-<name>.lock   flock'ed while the shard is downloaded or opened
    derived/                    offset indexes and decompressed copies (outside the LRU)

The key hashes the URL with the object's size and ETag/mtime, so a rewritten object is fetched
again. Several processes (ranks) asking for one shard at once serialise on its lock file: the
first downloads, the others find the finished copy. Eviction is least-recently-used under
``max_bytes``; it never removes an entry another process holds locked, and a reader that
already opened a file keeps reading it after eviction (POSIX unlink semantics).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from zephon.errors import CacheThrashingWarning, ConfigError, DataError
from zephon.io._remote import fetch_range, request, with_retries
from zephon.io._stats import count

_PIECE = 8 << 20
_SEEN: set[Path] = set()  # entries this process has used: a miss on one of them is a refetch
_SEEN_LOCK = threading.Lock()


@dataclass(frozen=True)
class CacheOptions:
    """Where the node cache lives and how large it may grow (``None``: no limit)."""

    dir: str | os.PathLike[str]
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_bytes is not None and self.max_bytes < 1:
            raise ConfigError(f"CacheOptions.max_bytes must be >= 1 or None, got {self.max_bytes}")

    def to_dict(self) -> dict[str, Any]:
        return {"dir": os.fspath(self.dir), "max_bytes": self.max_bytes}


@dataclass(frozen=True)
class CacheEntry:
    """One cached shard, as ``zephon cache ls`` shows it."""

    url: str
    path: Path
    size: int
    last_used: float


def entry_name(url: str, stamp: str) -> str:
    """``<key>-<file name>``: the original suffix stays last, for people and tools."""
    digest = hashlib.sha256(f"{url}\n{stamp}".encode()).hexdigest()[:20]
    return f"{digest}-{os.path.basename(url.rstrip('/')) or 'shard'}"


@contextlib.contextmanager
def _flock(path: Path, flags: int = fcntl.LOCK_EX) -> Iterator[bool]:
    """Hold ``flock(flags)`` on ``path``; yields False when a non-blocking lock is busy."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o666)
    try:
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases the lock


class NodeCache:
    """Operations on one cache folder (stateless apart from the folder: safe to pickle)."""

    def __init__(self, options: CacheOptions) -> None:
        self.options = options
        self.root = Path(options.dir)
        self.objects = self.root / "objects"

    @contextlib.contextmanager
    def pinned(self, fs: Any, path: str, url: str) -> Iterator[str]:
        """The local copy of ``url``, downloaded if missing; open it inside the ``with``."""
        info = with_retries(url, "stat", lambda: request(fs, "info", url, "stat", path))
        size = int(info.get("size") or 0)
        etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
        stamp = f"{size}:{etag or info.get('mtime') or info.get('LastModified') or ''}"
        name = entry_name(url, stamp)
        self.objects.mkdir(parents=True, exist_ok=True)
        data = self.objects / name
        with _flock(self.objects / f"{name}.lock"):
            if data.exists() and data.stat().st_size == size and _meta(data) is not None:
                count(url, cache_hits=1)
                _touch(data)
            else:
                self._note_miss(data, url)
                self._download(fs, path, url, size, etag, data)
                self._evict(keep=name)
            with _SEEN_LOCK:
                _SEEN.add(data)
            yield str(data)

    def _note_miss(self, data: Path, url: str) -> None:
        with _SEEN_LOCK:
            refetch = data in _SEEN
        if refetch:
            count(url, cache_refetches=1)
            warnings.warn(
                f"node cache {self.root}: shard {url} was evicted and is fetched again in the "
                f"same run; max_bytes={self.options.max_bytes} is below the working set, "
                "raise it or read fewer shards at once",
                CacheThrashingWarning,
                stacklevel=4,
            )

    def _download(self, fs: Any, path: str, url: str, size: int, etag: str, target: Path) -> None:
        """Fetch the whole object in ranged pieces, check size and hash, then publish it."""
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        md5, xxh = hashlib.md5(usedforsecurity=False), xxhash.xxh3_64()
        try:
            with open(tmp, "wb") as out:
                for start in range(0, size, _PIECE):
                    piece = fetch_range(fs, path, url, start, min(size, start + _PIECE))
                    md5.update(piece)
                    xxh.update(piece)
                    out.write(piece)
            got = tmp.stat().st_size
            if got != size or (_is_md5(etag) and md5.hexdigest() != etag):
                raise DataError(
                    f"node cache: the download of {url} is corrupt ({got} bytes, md5 "
                    f"{md5.hexdigest()}; the store says {size} bytes, ETag {etag or '-'}); "
                    "it was discarded, retry or check the store"
                )
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        meta = {"url": url, "size": size, "xxh3_64": xxh.hexdigest(), "etag": etag}
        _meta_path(target).write_text(json.dumps(meta))
        count(url, cache_downloads=1)

    def _evict(self, keep: str) -> None:
        """Remove least-recently-used entries until the folder fits ``max_bytes``."""
        limit = self.options.max_bytes
        if limit is None:
            return
        with _flock(self.root / ".lru.lock"):
            entries = sorted(self.entries(), key=lambda e: e.last_used)
            used = sum(e.size for e in entries)
            for entry in entries:
                if used <= limit:
                    break
                if entry.path.name == keep:
                    continue
                if self.remove(entry, wait=False):
                    count(entry.url, cache_evictions=1)
                    used -= entry.size

    def entries(self) -> list[CacheEntry]:
        """Every complete entry, in no particular order."""
        out = []
        for meta_path in self.objects.glob("*.meta"):
            data = meta_path.with_suffix("")
            meta = _meta(data)
            if meta is None or not data.exists():
                continue
            out.append(
                CacheEntry(str(meta["url"]), data, int(meta["size"]), meta_path.stat().st_mtime)
            )
        return out

    def remove(self, entry: CacheEntry, *, wait: bool = True) -> bool:
        """Delete one entry; with ``wait=False`` skip it (False) when another process holds it."""
        flags = fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB
        with _flock(entry.path.with_name(entry.path.name + ".lock"), flags) as held:
            if not held:
                return False
            _meta_path(entry.path).unlink(missing_ok=True)
            entry.path.unlink(missing_ok=True)
            return True

    def verify(self, entry: CacheEntry) -> bool:
        """Whether the entry's bytes still match the size and hash recorded at download."""
        meta = _meta(entry.path)
        if meta is None or entry.path.stat().st_size != int(meta["size"]):
            return False
        xxh = xxhash.xxh3_64()
        with open(entry.path, "rb") as f:
            while piece := f.read(_PIECE):
                xxh.update(piece)
        return bool(xxh.hexdigest() == meta["xxh3_64"])


def _meta_path(data: Path) -> Path:
    return data.with_name(data.name + ".meta")


def _meta(data: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads(_meta_path(data).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and "url" in meta and "size" in meta else None


def _touch(data: Path) -> None:
    now = time.time()
    with contextlib.suppress(OSError):
        os.utime(_meta_path(data), (now, now))


def _is_md5(etag: str) -> bool:
    return len(etag) == 32 and all(c in "0123456789abcdef" for c in etag.lower())
