"""Exit with a process-runner pipeline left open whose shared-memory session holds COUNT more
files, so that removing them at exit takes a while: ``python -m tests.engine._ctrl_c_at_exit
COUNT``. Prints the session's file prefix, then exits (the files are empty: no memory)."""

from __future__ import annotations

import sys

from tests.engine import _open_at_exit
from zephon._engine.handoff import shm


def main(count: int) -> None:
    _open_at_exit.main("process")
    (session,) = shm._SESSIONS  # the open engine's
    folder = shm.shm_dir()
    for i in range(count):
        (folder / f"{session.prefix}filler{i}").touch()
    print(session.prefix, flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
