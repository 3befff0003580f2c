"""What a process killed inside :func:`zephon._atomic.write_atomic` leaves: a real child
process writes ``path`` and is SIGKILLed after the temporary file is whole, before its rename."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_CHILD = """
import os, signal, sys
import zephon._atomic as atomic
atomic.os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
atomic.write_atomic(sys.argv[1], sys.argv[2])
"""


def kill_mid_write(path: Path, text: str) -> list[str]:
    """Kill a writer of ``path`` before its rename; the names it left in ``path``'s folder."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), text], capture_output=True, timeout=120
    )
    assert proc.returncode == -9, proc.stderr
    return sorted(p.name for p in path.parent.iterdir())
