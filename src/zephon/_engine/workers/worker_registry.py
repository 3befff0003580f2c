"""The worker processes an engine process holds outside a running fleet's own bookkeeping:
fleets not shut down yet (killed at interpreter exit) and idle workers kept for reuse."""

from __future__ import annotations

import contextlib
import multiprocessing.util  # noqa: F401  (registers its exit hook before ours, so ours runs first)
import os
import threading
import weakref
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from zephon._exit import at_exit

if TYPE_CHECKING:
    from zephon._engine.workers.process_pool import ProcessFleet


#: Fleets not shut down yet: killed at interpreter exit (this hook runs before
#: multiprocessing's own, registered when ``multiprocessing.util`` was imported above).
FLEETS: weakref.WeakSet[ProcessFleet] = weakref.WeakSet()


def _kill_live_fleets() -> None:
    for fleet in list(FLEETS):
        fleet.kill_all()


at_exit(_kill_live_fleets)

# Workers kept for reuse (``reuse_workers=True``): idle, operators torn down.
_IDLE: list[tuple[Any, Connection]] = []
_IDLE_LOCK = threading.Lock()
_MAX_IDLE = max(2, os.cpu_count() or 1)


def shutdown_idle_workers() -> None:
    """Stop the worker processes kept for reuse (also done at interpreter exit)."""
    with _IDLE_LOCK:
        idle = list(_IDLE)
        _IDLE.clear()
    for proc, conn in idle:
        with contextlib.suppress(OSError):
            conn.send_bytes(b"")
        conn.close()
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
        proc.close()


at_exit(shutdown_idle_workers)


def _forget_inherited_workers() -> None:
    """In a forked child: the idle workers and their pipes belong to the parent. Reusing one
    would share its pipe with the parent (and sibling forks); stopping them at exit would stop
    the parent's."""
    global _IDLE_LOCK
    _IDLE_LOCK = threading.Lock()  # another thread of the parent may have held it
    for _, conn in _IDLE:
        with contextlib.suppress(OSError):
            conn.close()  # this process's copy of the descriptor only
    _IDLE.clear()


os.register_at_fork(after_in_child=_forget_inherited_workers)


def take_idle() -> tuple[Any, Connection] | None:
    """An idle worker and its pipe (the last one kept), or None when there is none."""
    with _IDLE_LOCK:
        return _IDLE.pop() if _IDLE else None


def keep_idle(proc: Any, conn: Connection) -> bool:
    """Keep an unloaded worker for reuse; False when enough are kept already."""
    with _IDLE_LOCK:
        if len(_IDLE) >= _MAX_IDLE:
            return False
        _IDLE.append((proc, conn))
        return True
