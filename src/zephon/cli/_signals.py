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
The handlers for that phase are installed by ``zephon.cli.main`` before anything heavy is
imported (``install_startup_handlers``); this module imports only the standard library.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
CHECKPOINT_SIGNAL = getattr(signal, "SIGUSR1", None)
EXIT_CODES: dict[int, int] = {signal.SIGINT: 130, signal.SIGTERM: 143}  # as zephon.cli._common says


class Startup:
    """What the summary of a run stopped before its first item says (filled in as it starts)."""

    installed = False  # by install_startup_handlers: this process is the ``zephon`` command
    began = time.monotonic()
    config = ""
    json = False
    checkpoint: str | None = None  # the checkpoint being resumed: still where the run stands
    opened_io: dict[str, int] | None = None  # what opening the datasets read (row counts)


def _summary_line(signum: int) -> str:
    status = "terminated" if signum == signal.SIGTERM else "interrupted"
    elapsed = round(time.monotonic() - Startup.began, 3)
    if Startup.json:
        return json.dumps({
            "status": status, "config": Startup.config, "items": 0, "samples": 0, "tokens": 0,
            "elapsed_s": elapsed, "items_per_s": 0.0, "tokens_per_s": 0.0,
            "checkpoint": Startup.checkpoint, "resumed_from": Startup.checkpoint,
            "error": None, "stats": None,
        })  # fmt: skip
    where = f"checkpoint: {Startup.checkpoint}" if Startup.checkpoint else "no checkpoint"
    return f"{status}: 0 items while starting ({elapsed:.2f} s); {where}"


def stop_while_starting(signum: int, frame: FrameType | None = None) -> None:
    """End the process now with the summary line (``os.write``: the handler may run inside a
    ``print`` of the main thread, and the stdio buffers are not reentrant)."""
    os.write(1, (_summary_line(signum) + "\n").encode())
    os._exit(EXIT_CODES.get(signum, 1))


def install_startup_handlers() -> None:
    """Stop signals end the process with a summary from here on (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        Startup.installed = True
        for signum in STOP_SIGNALS:
            signal.signal(signum, stop_while_starting)


class RunSignals:
    """Installs the handlers for the duration of a ``with`` block (main thread only)."""

    def __init__(self) -> None:
        self.stop_signal: int | None = None
        self.checkpoint_requested = False
        # an in-process caller (tests, a script calling main) is never ended by os._exit
        self.starting = Startup.installed
        self._previous: dict[int, Any] = {}

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
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            if handler is stop_while_starting:
                # The ``zephon`` command has printed its summary and is exiting with the run's
                # own code: a stop signal now must neither print a "0 items" summary nor kill
                # it by the signal (exit -15) while it cleans up.
                handler = signal.SIG_IGN
            signal.signal(signum, handler)
        self._previous.clear()
