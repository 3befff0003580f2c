"""Replace a file whole: a reader, or a crash, sees the old file or the complete new one.

Checkpoints, manifests, shard indexes and rank hand-offs are all written this way: to a
temporary name beside ``path``, then renamed over it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, durable: bool = True) -> None:
    """Write ``data`` (a ``str`` as UTF-8) to ``path`` through a temporary file and a rename,
    creating the folder. ``durable`` also syncs the file and its folder to disk, so a power
    loss right after keeps it (a cache file, cheap to rebuild, can skip that cost).

    The file gets the usual permissions (``0666`` less the umask), not ``mkstemp``'s ``0600``;
    on failure the temporary file is removed and the error raised.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
