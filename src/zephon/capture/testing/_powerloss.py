"""A power-loss model of a directory, driven by the file store's file-system seam.

:class:`RecordingFileSystem` performs every operation for real and appends it to ``ops``;
the caller interleaves :meth:`RecordingFileSystem.mark` entries (say, "put c3 returned"). Then
:func:`power_loss_images` replays the recorded operations into a model of a disk and, at every
cut point, yields what a power loss at that moment could have left: file contents as of their
last ``fdatasync`` plus some of the writes since (none, all, or a seeded random subset, the last
one kept torn at a random length), and names as of the last directory sync or as they were.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from zephon.capture.stores import FileSystem

__all__ = ["Image", "Op", "Policy", "RecordingFileSystem", "marks_before", "power_loss_images"]

Policy = Literal["synced", "flushed", "random"]
POLICIES: tuple[Policy, ...] = ("synced", "flushed", "random")


@dataclass(frozen=True, slots=True)
class Op:
    """One recorded operation: ``kind`` and its arguments (paths are absolute)."""

    kind: str
    fd: int = -1
    path: str = ""
    dst: str = ""
    offset: int = 0
    data: bytes = b""
    flags: int = 0


class RecordingFileSystem(FileSystem):
    """The real file system, with every state-changing operation recorded in ``ops``."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def mark(self, label: str) -> None:
        """Record that the caller observed something (an acknowledgement) at this point."""
        self.ops.append(Op("mark", path=label))

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        fd = super().open(path, flags, mode)
        self.ops.append(Op("open", fd=fd, path=path, flags=flags))
        return fd

    def close(self, fd: int) -> None:
        super().close(fd)
        self.ops.append(Op("close", fd=fd))

    def pwritev(self, fd: int, parts: list[bytes], offset: int) -> None:
        super().pwritev(fd, parts, offset)
        self.ops.append(Op("write", fd=fd, offset=offset, data=b"".join(parts)))

    def truncate(self, fd: int, size: int) -> None:
        super().truncate(fd, size)
        self.ops.append(Op("truncate", fd=fd, offset=size))

    def datasync(self, fd: int) -> None:
        super().datasync(fd)
        self.ops.append(Op("sync", fd=fd))

    def sync_dir(self, path: str) -> None:
        super().sync_dir(path)
        self.ops.append(Op("sync_dir", path=path))

    def link(self, src: str, dst: str) -> bool:
        done = super().link(src, dst)
        if done:
            self.ops.append(Op("link", path=src, dst=dst))
        return done

    def replace(self, src: str, dst: str) -> None:
        super().replace(src, dst)
        self.ops.append(Op("replace", path=src, dst=dst))

    def unlink(self, path: str) -> bool:
        done = super().unlink(path)
        if done:
            self.ops.append(Op("unlink", path=path))
        return done


@dataclass(eq=False)
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    synced: bytes = b""
    pending: list[Op] = field(default_factory=list)


def _apply_data(buf: bytearray, op: Op, keep: int | None = None) -> None:
    if op.kind == "truncate":
        del buf[op.offset :]
        return
    data = op.data if keep is None else op.data[:keep]
    if len(buf) < op.offset:
        buf.extend(b"\0" * (op.offset - len(buf)))
    buf[op.offset : op.offset + len(data)] = data


class _Disk:
    """Volatile and durable views of files and names, advanced one operation at a time."""

    def __init__(self) -> None:
        self.names: dict[str, _Inode] = {}
        self.durable_names: dict[str, _Inode] = {}
        self.fds: dict[int, _Inode] = {}

    def apply(self, op: Op) -> None:
        if op.kind == "open":
            ino = self.names.get(op.path)
            if ino is None:
                ino = self.names[op.path] = _Inode()
            self.fds[op.fd] = ino
            if op.flags & os.O_TRUNC:
                self._change(ino, Op("truncate", offset=0))
        elif op.kind in ("write", "truncate"):
            self._change(self.fds[op.fd], op)
        elif op.kind == "sync":
            ino = self.fds[op.fd]
            ino.synced, ino.pending = bytes(ino.data), []
        elif op.kind == "sync_dir":
            self.durable_names = dict(self.names)
        elif op.kind == "link":
            self.names[op.dst] = self.names[op.path]
        elif op.kind == "replace":
            self.names[op.dst] = self.names.pop(op.path)
        elif op.kind == "unlink":
            del self.names[op.path]
        elif op.kind == "close":
            del self.fds[op.fd]

    @staticmethod
    def _change(ino: _Inode, op: Op) -> None:
        _apply_data(ino.data, op)
        ino.pending.append(op)

    def image(self, policy: Policy, rng: random.Random) -> dict[str, bytes]:
        """What survives a power loss now, under ``policy``."""
        out: dict[str, bytes] = {}
        for path in sorted(set(self.names) | set(self.durable_names)):
            choices = [self.durable_names.get(path)]
            if policy == "flushed" or (policy == "random" and rng.random() < 0.5):
                choices = [self.names.get(path)]
            ino = choices[0]
            if ino is not None:
                out[path] = self._content(ino, policy, rng)
        return out

    @staticmethod
    def _content(ino: _Inode, policy: Policy, rng: random.Random) -> bytes:
        buf = bytearray(ino.synced)
        if policy == "synced" or not ino.pending:
            return bytes(buf)
        kept = (
            ino.pending if policy == "flushed" else [o for o in ino.pending if rng.random() < 0.5]
        )
        for i, op in enumerate(kept):
            last = i == len(kept) - 1
            torn = rng.randrange(len(op.data) + 1) if last and op.kind == "write" else None
            _apply_data(buf, op, torn)
        return bytes(buf)


@dataclass(frozen=True, slots=True)
class Image:
    """The directory a power loss before ``ops[cut]`` could leave, under ``policy``."""

    cut: int
    policy: Policy
    files: dict[str, bytes]

    def materialize(self, source_dir: str, target_dir: str) -> None:
        """Write the files that lived in ``source_dir`` into the (empty) ``target_dir``."""
        for path, data in self.files.items():
            if os.path.dirname(path) == source_dir:
                with open(os.path.join(target_dir, os.path.basename(path)), "wb") as f:
                    f.write(data)


def power_loss_images(ops: list[Op], *, seed: int = 0) -> Iterator[Image]:
    """One image per policy before every state-changing operation, and one after the last."""
    rng = random.Random(seed)
    disk = _Disk()
    for cut, op in enumerate([*ops, Op("end")]):
        if op.kind not in ("mark", "open", "close"):
            for policy in POLICIES:
                yield Image(cut, policy, disk.image(policy, rng))
        if op.kind != "end":
            disk.apply(op)


def marks_before(ops: list[Op], cut: int) -> list[str]:
    """The labels marked before ``ops[cut]`` (what the caller had observed by then)."""
    return [op.path for op in ops[:cut] if op.kind == "mark"]
