"""A consumer of a payload-heavy process-runner pipeline that stops mid-run, holding records
whose arrays live in ``/dev/shm``, until a line arrives on its stdin (shm tests start it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def dead_pid() -> int:
    """A process id that was just used and is free now."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


CHILD = textwrap.dedent(
    """
    import sys
    from tests.runners._pipes import heavy

    if __name__ == "__main__":
        pipe = heavy("process", rows=120, queue_size=2)
        it = iter(pipe)
        held = [next(it)]
        engine = pipe._engine
        pids = [p for pool in engine.resources.pools for p in pool.fleet.pids()]
        print("READY", *sorted(set(pids)), flush=True)
        sys.stdin.readline()  # wait, mid-run, for the signal
        held.extend(it)
    """
)
