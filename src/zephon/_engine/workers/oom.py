"""Whether the kernel's OOM killer ran: a process killed by SIGKILL most often ran out of memory.

The kernel counts its OOM kills: per cgroup (v2 ``memory.events``, v1 ``memory.oom_control``,
both ``oom_kill``) and for the whole machine (``/proc/vmstat``). A run takes a baseline when it
starts its workers; a worker found killed by SIGKILL is then reported as out of memory when a
count rose, and as possibly out of memory otherwise (the OOM killer of a container runtime may
count nowhere this process can read).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

_CGROUP_ROOT = Path("/sys/fs/cgroup")

_baseline: tuple[int, ...] | None = None


def _field(path: Path, name: str) -> int | None:
    """The integer after ``name`` in a ``key value`` file, or None when unreadable."""
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    return None


def _counter_files() -> list[tuple[Path, str]]:
    """The files that count this process's OOM kills: its cgroup's, then the machine's."""
    files: list[tuple[Path, str]] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            where = path.lstrip("/")
            if controllers == "":
                files.append((_CGROUP_ROOT / where / "memory.events", "oom_kill"))
            elif "memory" in controllers.split(","):
                files.append((_CGROUP_ROOT / "memory" / where / "memory.oom_control", "oom_kill"))
    files.append((Path("/proc/vmstat"), "oom_kill"))
    return files


def kill_counts() -> tuple[int, ...]:
    """Every readable OOM-kill counter (-1 for one that cannot be read)."""
    counts = (_field(path, name) for path, name in _counter_files())
    return tuple(-1 if count is None else count for count in counts)


def watch() -> None:
    """Take the baseline (once per process: the first run that starts workers)."""
    global _baseline
    if _baseline is None:
        _baseline = kill_counts()


def sigkill_hint() -> str:
    """What to say after "was killed by SIGKILL": whether memory ran out."""
    before = _baseline
    now = kill_counts()
    if before is not None and len(before) == len(now):
        rose = [n - b for b, n in zip(before, now, strict=True) if b >= 0 and n > b]
        if rose:
            return (
                f" (out of memory: the kernel's OOM killer killed {max(rose)} process(es) "
                "since the run started)"
            )
    return " (it may have run out of memory: the kernel's OOM killer sends SIGKILL)"


__all__ = ["kill_counts", "sigkill_hint", "watch"]
