"""Where shards live: local paths and fsspec URLs, and the cache folder for derived files.

Derived files (offset indexes, decompressed copies) always go to the cache folder, never next to
the user's data: reading or explaining a dataset leaves its folder untouched.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from zephon._optional import require

LOCAL_PROTOCOLS = frozenset({"file", "local"})
#: fsspec backends zephon has an extra for: protocol -> the module fsspec imports.
_BACKENDS = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs",
             "abfs": "adlfs", "abfss": "adlfs"}  # fmt: skip


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

    _require_backend(protocol)
    return fsspec.filesystem(protocol, **(storage_options or {}))


def _require_backend(protocol: str) -> None:
    module = _BACKENDS.get(protocol)
    if module is not None:
        require(module, f"{protocol}:// paths")


def strip_protocol(protocol: str, path: str) -> str:
    """The filesystem-internal path of ``path`` (no protocol), without instantiating a client."""
    import fsspec

    _require_backend(protocol)
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


def derived_dir(cache_dir: str | os.PathLike[str] | None, cache: Any = None) -> str | None:
    """The folder argument for derived files: ``cache_dir``, else the node cache's folder."""
    if cache_dir is not None:
        return os.fspath(cache_dir)
    return None if cache is None else os.fspath(cache.dir)


def cache_file(key: str, suffix: str, cache_dir: str | os.PathLike[str] | None) -> Path:
    """A stable path for a file derived from ``key`` (a URL or absolute path) in the cache."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    base = os.path.basename(key.rstrip("/")) or "shard"
    return cache_root(cache_dir) / "derived" / f"{base}.{digest}{suffix}"
