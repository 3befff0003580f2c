"""A local, fsynced journal of incomplete marks the store could not take.

Why: when a call's capture fails, ``mark_incomplete`` is the only durable trace of the loss. If
the store is unreachable at that moment, ``put`` and the mark fail together, which is the
silent-loss case. So the mark goes to a local journal first (one JSON line, fsynced, before the
client is answered) and is replayed into the store when the worker starts and periodically
after. Each worker appends to its own file under an exclusive ``flock``; a replay also adopts
the files of workers that died (their lock is free). Replaying a mark twice is harmless: the
rollout is already incomplete, and after a freeze the store refuses the late mark.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

__all__ = ["SpillJournal", "SpilledMark"]


@dataclass(frozen=True, slots=True)
class SpilledMark:
    """One incomplete mark waiting for the store."""

    rollout_id: str
    call_id: str
    reason: str


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _parse(data: bytes) -> list[SpilledMark]:
    """The complete lines of a journal (a torn last line, never acknowledged, is skipped)."""
    marks = []
    for line in data.split(b"\n")[:-1]:
        try:
            marks.append(SpilledMark(**json.loads(line)))
        except (ValueError, TypeError):
            continue
    return marks


class SpillJournal:
    """This worker's journal file in ``directory`` (created on first use)."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.path = os.path.join(directory, f"spill-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl")
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        _sync_dir(directory)
        self._mutex = threading.Lock()

    def append(self, mark: SpilledMark) -> None:
        """Durably record ``mark`` (returns after ``fsync``)."""
        line = json.dumps(asdict(mark), sort_keys=True).encode() + b"\n"
        with self._mutex:
            os.write(self._fd, line)
            os.fsync(self._fd)

    def _adopt_orphans(self) -> None:
        """Move the marks of dead workers' journals into this one, then remove those files."""
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if path == self.path or not name.endswith(".jsonl"):
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a live worker's journal
                os.close(fd)
                continue
            try:
                for mark in _parse(os.pread(fd, os.fstat(fd).st_size, 0)):
                    self.append(mark)
                os.unlink(path)
                _sync_dir(self.directory)
            finally:
                os.close(fd)

    def pending(self) -> tuple[list[SpilledMark], int]:
        """The marks waiting (orphans adopted) and the journal size they were read at."""
        self._adopt_orphans()
        with self._mutex:
            size = os.fstat(self._fd).st_size
            return _parse(os.pread(self._fd, size, 0)), size

    async def replay(self, send: Callable[[SpilledMark], Awaitable[bool]]) -> int:
        """Send every pending mark; clear the journal once all were taken. Returns how many
        are still pending."""
        marks, size = self.pending()
        left = [m for m in marks if not await send(m)]
        if marks and not left:
            with self._mutex:
                if os.fstat(self._fd).st_size == size:  # nothing was appended meanwhile
                    os.ftruncate(self._fd, 0)
                    os.fsync(self._fd)
        return len(left)

    def close(self) -> None:
        """Release the journal; an empty one is removed."""
        with self._mutex:
            empty = os.fstat(self._fd).st_size == 0
            os.close(self._fd)
        if empty:
            os.unlink(self.path)
