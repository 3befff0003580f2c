"""Signals ``zephon run`` turns into checkpoints: preemption is a normal way for a run to end.

SIGTERM (Slurm, Kubernetes) and SIGINT (Ctrl-C) ask the run to stop after the item being
delivered: the loop then writes a final checkpoint and exits 143 or 130. The handler only sets
a flag, so a signal never lands between receiving an item and recording it. A second stop
signal stops at once (KeyboardInterrupt), for a pipeline that is stuck. SIGUSR1 (Slurm's
``--signal=USR1@T``) asks for a checkpoint now and lets the run go on.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
CHECKPOINT_SIGNAL = getattr(signal, "SIGUSR1", None)


class RunSignals:
    """Installs the handlers for the duration of a ``with`` block (main thread only)."""

    def __init__(self) -> None:
        self.stop_signal: int | None = None
        self.checkpoint_requested = False
        self._previous: dict[int, Any] = {}

    @property
    def stop_requested(self) -> bool:
        return self.stop_signal is not None

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
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
            signal.signal(signum, handler)
        self._previous.clear()
