"""Starts one forkserver worker whose target sends SIGINT to this process while it is being
pickled: after the fork, before the worker has its set-up. Another thread sends it, as the
tokenizers' pool would take a Ctrl-C sent to the process group; SIGINT is blocked in the
starting thread only. Prints whether the signal interrupted this process and how the
worker ended."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from zephon._engine.workers.worker_start import start_deaf_to_ctrl_c, worker_context


class InterruptWhilePickled:
    """A worker target that turns into ``int`` on the way, sending SIGINT as it goes."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        sender = threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT))
        sender.start()
        sender.join()
        sum(range(100_000))  # bytecode, where Python runs a pending signal handler
        return (int, ())

    def __call__(self) -> None:
        """The worker calls the ``int`` this became instead."""


def main() -> None:
    proc = worker_context().Process(target=InterruptWhilePickled())
    try:
        start_deaf_to_ctrl_c(proc)
        sum(range(100_000))
        print("not interrupted", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    proc.join()
    print(f"worker exit {proc.exitcode}", flush=True)


if __name__ == "__main__":
    main()
