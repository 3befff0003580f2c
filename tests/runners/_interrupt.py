"""Ctrl-C at chosen moments of a program's process-runner start-up.

Each program starts in its own process group, as a job at a terminal. Its first child process
that Python started (the resource tracker, then the forkserver and the workers) says that the
start-up of its workers has begun; the moment under test is a delay from there. SIGINT then
goes to the whole group (Ctrl-C at a terminal) or to the program alone (``kill -INT``), in
turn. What comes back is how the program ended and what it left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.cli._preempt import wait_for
from tests.runners._leaks import children_of, comm_of, group_members, our_segments

#: How long the processes of a program's group may take to exit after it did (a loaded
#: machine reaps a forkserver and its workers in well under a second).
GONE_S = 60.0


@dataclass
class Interrupted:
    delay: float
    whole_group: bool
    code: int
    out: str
    err: str
    left: list[int]  # processes of its group still running GONE_S after it exited
    segments: list[str]  # its files still in /dev/shm

    def describe(self) -> str:
        to = "group" if self.whole_group else "process"
        return (
            f"SIGINT to the {to} {self.delay:.3f} s into start-up: exit {self.code}, "
            f"left {self.left} and {self.segments}; stdout {self.out[-200:]!r}, "
            f"stderr {self.err[-600:]!r}"
        )


LAUNCHER_COMMS = frozenset({"env", "zephon", "sh", ""})
"""What the ``zephon`` script's sh forks before it execs Python (its ``env --block-signal``
probe, a copy of sh on its way to exec; "": gone already): not the start-up under test."""


def started_children(pid: int) -> list[int]:
    """The children of ``pid`` that its Python started (the resource tracker, the forkserver)."""
    return [child for child in children_of(pid) if comm_of(child) not in LAUNCHER_COMMS]


def interrupt_at(
    command: list[str], *, cwd: Path, env: dict[str, str], delay: float, whole_group: bool
) -> Interrupted:
    """Start ``command``, send SIGINT ``delay`` seconds after its first child appeared."""
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: proc.poll() is not None or bool(started_children(proc.pid)))
        time.sleep(delay)  # the moment under test, not a wait for anything
        if whole_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    deadline = time.monotonic() + GONE_S
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return Interrupted(
        delay, whole_group, proc.returncode, out, err, group_members(proc.pid),
        our_segments(proc.pid),
    )  # fmt: skip


def interrupt_each(
    runs: list[tuple[list[str], float]], *, cwd: Path, env: dict[str, str], at_once: int = 3
) -> list[Interrupted]:
    """:func:`interrupt_at` for each (command, delay), ``at_once`` programs at a time; SIGINT
    goes to the whole group of every other one."""

    def one(index: int) -> Interrupted:
        command, delay = runs[index]
        return interrupt_at(command, cwd=cwd, env=env, delay=delay, whole_group=index % 2 == 0)

    with ThreadPoolExecutor(at_once) as pool:
        return list(pool.map(one, range(len(runs))))
