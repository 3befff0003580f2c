"""One ``zephon run`` per checkpoint directory.

Two runs resuming the same directory (a supervisor restarting a job whose old instance is still
alive) would both restore the same checkpoint and both append to the same record: every item
after it twice. The lock is an ``flock`` on ``DIR/run.lock``, so the kernel drops it when the
holder dies, SIGKILL included; the file names the holder (pid, host, start time) for the message
of the run that is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path

LOCK_NAME = "run.lock"


class RunLockedError(Exception):
    """Another live process holds the checkpoint directory, or its lock file cannot be used."""


class RunLock:
    """Holds ``DIR/run.lock`` from :meth:`acquire` until :meth:`release` or process exit."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise RunLockedError(f"cannot open the lock file {self.path}: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunLockedError(
                f"{self.path.parent} is in use by another zephon run ({holder}); two runs on "
                "one checkpoint directory would deliver the same items twice: stop that run or "
                "wait for it to end, then resume"
            ) from None
        os.ftruncate(fd, 0)
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        holder = f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n"
        os.pwrite(fd, holder.encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    text = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
    return text or "holder unknown: it has just started"
