"""Exit-time cleanup that a Ctrl-C cannot cut short.

At interpreter exit zephon removes what its runs leave behind: shared-memory files, worker
processes, engines still open. A Ctrl-C landing while that runs would raise
``KeyboardInterrupt`` inside the hook: Python prints "Exception ignored in atexit callback"
with a traceback, and the rest of the cleanup is skipped (files stay in /dev/shm until another
engine sweeps them). Hooks registered here run with SIGINT held instead: a Ctrl-C meanwhile is
dropped (the exit it asks for is under way), and the handler before is put back after.
"""

from __future__ import annotations

import atexit
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TypeVar

Hook = TypeVar("Hook", bound=Callable[[], object])


def at_exit(hook: Hook) -> Hook:
    """Run ``hook`` at interpreter exit with SIGINT held (usable as a decorator)."""
    atexit.register(run_held, hook)
    return hook


def run_held(hook: Callable[[], object]) -> None:
    """``hook()`` with SIGINT held (see the module)."""
    with sigint_held():
        hook()


def _drop(signum: int, frame: FrameType | None) -> None:
    """A Ctrl-C during exit-time cleanup: the process is leaving already."""


@contextmanager
def sigint_held() -> Iterator[None]:
    """SIGINT does nothing inside (on the main thread; elsewhere signals are not ours)."""
    try:
        previous = signal.signal(signal.SIGINT, _drop)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
