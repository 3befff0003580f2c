"""Where a conversion writes: a local folder or an fsspec URL (``s3://bucket/corpus``).

Both keep the two promises resuming rests on: the manifest is replaced whole (never half
written), and a shard's ``.idx`` lands after its other files, so a shard whose ``.idx`` exists
is whole. A local folder gets them from temporary names, ``fsync`` and renames, and is locked
with ``flock``; an object store gets them from each object appearing whole when its upload
completes (a killed upload leaves nothing), and is locked on this machine only (a lock file
in the cache folder named by the URL: object stores have no lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from zephon._atomic import write_atomic
from zephon.errors import ConfigError
from zephon.io._converted import MANIFEST_NAME, read_manifest
from zephon.io._paths import cache_root, get_fs, split_protocol

LOCK_NAME = ".zephon-convert.lock"
TMP_MARK = ".tmp-"
ANOTHER = "another zephon convert is writing {out}; wait for it or pick another OUT"


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


@contextlib.contextmanager
def _flocked(lock: Path, out: str) -> Iterator[None]:
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(ANOTHER.format(out=out)) from None
        yield
    finally:
        os.close(fd)


class Out:
    """The output folder ``url`` (a path or an fsspec URL); picklable, for pool workers."""

    def __init__(self, url: str | os.PathLike[str], storage_options: dict[str, Any] | None):
        self.url = os.fspath(url)
        self.protocol, self.path = split_protocol(self.url)
        self.storage_options = storage_options
        self.local = self.protocol == "file"
        self._fs: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None}

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs = get_fs(self.protocol, self.storage_options)
        return self._fs

    def _at(self, name: str) -> str:
        return self.path.rstrip("/") + "/" + name

    def names(self) -> set[str]:
        """The entries of the folder now (none when it does not exist)."""
        if self.local:
            root = Path(self.path)
            return {p.name for p in root.iterdir()} if root.is_dir() else set()
        self.fs.invalidate_cache(self.path)  # pool workers wrote behind this client's back
        try:
            found = self.fs.ls(self.path, detail=False)
        except FileNotFoundError:
            return set()
        return {str(p).rstrip("/").rsplit("/", 1)[-1] for p in found}

    def is_file(self) -> bool:
        if self.local:
            return os.path.exists(self.path) and not os.path.isdir(self.path)
        return bool(self.fs.isfile(self.path))

    def manifest(self) -> Any:
        return read_manifest(self.url, self.storage_options)

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Replace the manifest whole (the bytes are the same wherever it is written)."""
        if self.local:
            write_atomic(Path(self.path) / MANIFEST_NAME, json.dumps(manifest, indent=1) + "\n")
        else:
            text = json.dumps(manifest, indent=1, sort_keys=False) + "\n"
            self.fs.pipe_file(self._at(MANIFEST_NAME), text.encode("utf-8"))

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Only one conversion writes here at a time (on this machine, for a URL)."""
        if self.local:
            Path(self.path).mkdir(parents=True, exist_ok=True)
            lock = Path(self.path) / LOCK_NAME
        else:
            digest = hashlib.sha256(self.url.rstrip("/").encode()).hexdigest()[:24]
            lock = cache_root() / "convert-locks" / f"{digest}.lock"
        with _flocked(lock, self.url):
            yield

    def clean_partials(self) -> None:
        """Temporary files of tasks killed mid-write (their shard is redone); an object
        store has none (an upload cut short leaves no object)."""
        if self.local:
            for path in Path(self.path).iterdir():
                if TMP_MARK in path.name:
                    path.unlink(missing_ok=True)

    def write_shard(self, name: str, parts: list[tuple[str, bytes]]) -> None:
        """The files ``name + suffix`` of one shard, in order (``.idx`` last: its presence
        means the shard is whole)."""
        if not self.local:
            for suffix, data in parts:
                self.fs.pipe_file(self._at(name + suffix), data)
            return
        final = Path(self.path) / name
        tmp = Path(self.path) / f"{name}{TMP_MARK}{os.getpid()}"
        for suffix, data in parts:
            _write(tmp.with_name(tmp.name + suffix), data)
        for suffix, _ in parts:
            os.replace(tmp.with_name(tmp.name + suffix), final.with_name(final.name + suffix))
