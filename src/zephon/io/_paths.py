"""Where shards live: local paths and fsspec URLs, and the cache folder for derived files.

Local files are read with ``os.pread`` on one descriptor per process (thread-safe, no seek
races); anything else goes through fsspec byte-range reads (``cat_file``), which are stateless
and therefore thread-safe too. Nothing here holds an open handle across pickling.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

LOCAL_PROTOCOLS = frozenset({"file", "local"})


def split_protocol(url: str) -> tuple[str, str]:
    """``("file", "/abs/path")`` for local paths and ``file://`` URLs, else ``(proto, url)``."""
    if "://" not in url:
        return "file", os.path.abspath(os.path.expanduser(url))
    proto, rest = url.split("://", 1)
    if proto in LOCAL_PROTOCOLS:
        return "file", os.path.abspath(rest if rest.startswith("/") else "/" + rest)
    return proto, url


def get_fs(protocol: str, storage_options: dict[str, Any] | None = None) -> Any:
    """The fsspec filesystem for ``protocol`` (imported lazily: fsspec costs import time)."""
    import fsspec

    return fsspec.filesystem(protocol, **(storage_options or {}))


def strip_protocol(protocol: str, path: str) -> str:
    """The filesystem-internal path of ``path`` (no protocol), without instantiating a client."""
    import fsspec

    stripped: str = fsspec.get_filesystem_class(protocol)._strip_protocol(path)
    return stripped


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Folder for derived files (offset indexes, decompressed copies) of read-only data.

    Order: the ``cache_dir`` argument, ``$ZEPHON_CACHE_DIR``, ``$XDG_CACHE_HOME/zephon``,
    ``~/.cache/zephon``.
    """
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("ZEPHON_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "zephon" if xdg else Path.home() / ".cache" / "zephon"


def cache_file(key: str, suffix: str, cache_dir: str | os.PathLike[str] | None) -> Path:
    """A stable cache path for ``key`` (a URL or absolute path) inside the cache folder."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    base = os.path.basename(key.rstrip("/")) or "shard"
    return cache_root(cache_dir) / "shards" / f"{base}.{digest}{suffix}"


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename (readers never see half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def writable_dir(path: str) -> bool:
    """Whether we may create files in the local folder ``path``."""
    return os.access(path, os.W_OK | os.X_OK)
