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
    import signal
    import sys
    from tests.runners._pipes import heavy

    if __name__ == "__main__":
        # SIGINT raises KeyboardInterrupt here even when the pytest process that started this
        # one had it ignored (a child keeps an ignored signal, and Python then installs no
        # handler for it): this script then ran to its end and exited 0. What the tests check
        # is the segments' removal; the conftest fails the test that left SIGINT ignored.
        signal.signal(signal.SIGINT, signal.default_int_handler)
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
