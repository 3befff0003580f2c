"""Signals ``zephon run`` turns into checkpoints: preemption is a normal way for a run to end.

SIGTERM (Slurm, Kubernetes) and SIGINT (Ctrl-C) ask the run to stop after the item being
delivered: the loop then writes a final checkpoint and exits 143 or 130. The handler only sets
a flag, so a signal never lands between receiving an item and recording it. A second stop
signal stops at once (KeyboardInterrupt), for a pipeline that is stuck. SIGUSR1 (Slurm's
``--signal=USR1@T``) asks for a checkpoint now and lets the run go on.

Until the first item is delivered (imports, reading the config, a restore, the first batch,
which may take many seconds) a stop signal ends the process at once with the one-line summary:
nothing was delivered since the checkpoint it started from (or since the start), so there is
nothing to save, and waiting for the first batch would outlast a supervisor's grace period.
The handlers for that phase are installed by the first statement the command runs (see
``zephon._startup``).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from zephon._startup import (
    EXIT_CODES,
    STOP_SIGNALS,
    Startup,
    install_startup_handlers,
    stop_while_starting,
)
from zephon.cli._leave import StopWatch

CHECKPOINT_SIGNAL = getattr(signal, "SIGUSR1", None)

__all__ = [
    "CHECKPOINT_SIGNAL",
    "EXIT_CODES",
    "STOP_SIGNALS",
    "RunSignals",
    "Startup",
    "install_startup_handlers",
    "stop_while_starting",
]


class RunSignals:
    """Installs the handlers for the duration of a ``with`` block (main thread only)."""

    def __init__(self) -> None:
        self.stop_signal: int | None = None
        self.checkpoint_requested = False
        # an in-process caller (tests, a script calling main) is never ended by os._exit
        self.starting = Startup.installed
        self._previous: dict[int, Any] = {}
        # the command's own process: a main thread stuck in an operator is ended after a stop
        self.watch = StopWatch() if Startup.installed else None

    @property
    def stop_requested(self) -> bool:
        return self.stop_signal is not None

    def started(self) -> None:
        """The first item has arrived: stop signals now stop after the item being delivered."""
        self.starting = False

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        if self.starting:
            stop_while_starting(signum, frame)
        if self.stop_signal is not None:
            raise KeyboardInterrupt  # the second one: do not wait for the next item
        self.stop_signal = signum

    def _on_checkpoint(self, signum: int, frame: FrameType | None) -> None:
        self.checkpoint_requested = True

    def take_checkpoint_request(self) -> bool:
        """True once per SIGUSR1 received."""
        requested, self.checkpoint_requested = self.checkpoint_requested, False
        return requested

    def __enter__(self) -> RunSignals:
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set from the main thread
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_stop)
        if CHECKPOINT_SIGNAL is not None:
            self._previous[CHECKPOINT_SIGNAL] = signal.signal(
                CHECKPOINT_SIGNAL, self._on_checkpoint
            )
        if self.watch is not None:
            self.watch.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.watch is not None and self._previous:
            self.watch.__exit__()
        for signum, handler in self._previous.items():
            if handler is stop_while_starting:
                # The ``zephon`` command has printed its summary and is exiting with the run's
                # own code: a stop signal now must neither print a "0 items" summary nor kill
                # it by the signal (exit -15) while it cleans up.
                handler = signal.SIG_IGN
            signal.signal(signum, handler)
        self._previous.clear()
