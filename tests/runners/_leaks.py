"""What a run may leave behind: shared-memory segments and POSIX named semaphores."""

from __future__ import annotations

import os
import select
import time
from collections.abc import Iterator
from pathlib import Path

from zephon._engine.handoff.shm import NAME_PREFIX, segment_files


def our_segments(owner_pid: int) -> list[str]:
    """Segment files in /dev/shm owned by ``owner_pid`` (the engine process)."""
    return segment_files(f"{NAME_PREFIX}{owner_pid}-")


def semaphores_mapped_by(pid: int) -> set[str]:
    """Named semaphores that process ``pid`` has open and that still exist in /dev/shm."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return set()
    found = set()
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if path.startswith("/dev/shm/sem.") and os.path.exists(path):
            found.add(path)
    return found


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie waiting for its reaper counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return "\nState:\tZ" in status


def _processes() -> Iterator[tuple[int, list[str]]]:
    """Each process's id and the fields of its ``/proc/N/stat`` after the name: state, parent,
    process group, ... (those that exit while being read are left out)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        yield int(entry.name), stat.rsplit(")", 1)[1].split()  # "pid (comm) state ppid pgrp"


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid``, from the parent named in each process's ``/proc/N/stat``.

    Not from ``/proc/pid/task/*/children``: a child started by a thread moves to another
    thread's list when its thread exits, and a read during that move misses it.
    """
    return [child for child, fields in _processes() if int(fields[1]) == pid]


def descendants_of(pid: int) -> list[int]:
    """Every process below ``pid``: its children, theirs, and so on (from /proc)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        children = children_of(todo.pop())
        found.extend(children)
        todo.extend(children)
    return found


def comm_of(pid: int) -> str:
    """The short name ``ps`` shows for ``pid`` ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def cmdline_of(pid: int) -> str:
    """The command line of ``pid``, arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def workers_of(pid: int) -> list[int]:
    """zephon's process workers below ``pid`` (forked by its forkserver, named by themselves)."""
    return [p for p in descendants_of(pid) if comm_of(p).startswith("zephon-worker")]


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait (on pidfds, no polling) until every process in ``pids`` has exited; return those
    still running after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    alive = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(fd)
        if not ready and not process_gone(pid):
            alive.append(pid)
    return alive


def group_members(pgid: int) -> list[int]:
    """Live processes (zombies aside) whose process group is ``pgid``."""
    return [pid for pid, fields in _processes() if int(fields[2]) == pgid and fields[0] != "Z"]
