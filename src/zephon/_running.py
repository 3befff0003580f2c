"""Which operator a thread is running now, read from its stack.

Named in the lines that report an operator that never returns: by the engine (a thread that
did not stop when the run closed, an engine process killed after a stop) and by the ``zephon``
command (its main thread inside an operator after a stop signal). It lives outside the engine
so that the command needs none of the engine's modules to ask.
"""

from __future__ import annotations

import sys
import threading

OPERATOR_CALL = "call_process_many"
"""The engine's function that every runner calls an operator's ``process_many`` through."""

ENGINE_MODULES = "zephon._engine."


def running_operator(thread: threading.Thread) -> str | None:
    """The operator whose ``process_many`` ``thread`` is inside now, if any (the innermost
    call of the engine's :data:`OPERATOR_CALL` on its stack)."""
    from zephon.ops import BaseOp  # here: the command imports this module before any operator

    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        code_name, module = frame.f_code.co_name, frame.f_globals.get("__name__", "")
        if code_name == OPERATOR_CALL and module.startswith(ENGINE_MODULES):
            op = frame.f_locals.get("op")
            return op.name if isinstance(op, BaseOp) else "?"
        frame = frame.f_back
    return None


def running_operators() -> dict[str, str]:
    """``thread name: operator`` for every thread of this process inside an operator now."""
    found = {t.name: running_operator(t) for t in threading.enumerate()}
    return {name: op for name, op in found.items() if op is not None}
