"""Stop signals while the ``zephon`` command starts, from zephon's first line.

``zephon run`` turns SIGINT and SIGTERM into exit 130 and 143 with a one-line summary; until
its first item is delivered there is nothing to checkpoint, so a stop ends it at once (see
``zephon.cli._signals``). The command's entry points (the ``zephon`` script and ``python -m
zephon``) import :mod:`zephon` before anything else of zephon's, and its first
statement calls :func:`install_if_command`: a signal during the imports is that exit too,
never a ``KeyboardInterrupt`` traceback or a death by the signal. Importing zephon from any
other program installs nothing.

The ``zephon`` script (``bin/zephon``, the command pip installs) starts Python with SIGINT and
SIGTERM blocked (GNU ``env --block-signal``): a stop signal during Python's own start-up
(site, .pth files) waits until :func:`install_if_command` lets it in, the handlers in place.
While sh runs, the script catches a stop signal and hands it on (:data:`PENDING_SIGNAL_ENV`),
raised again here; only one before its traps or during its ``exec`` kills the process. Where
``env`` cannot block, and under ``python -m zephon``, Python's start-up runs with Python's
handlers, where Ctrl-C is a ``KeyboardInterrupt`` traceback (docs/cli.md says how long). This
module adds as little as it can to that: no ``from __future__`` (itself an import), and the
C half of :mod:`signal` (the module builds enums, 1 to 2 ms); ``os``, ``sys``, ``time`` and
``types`` are loaded before any entry point imports zephon.
"""

import _signal  # type: ignore[import-not-found]  # typeshed has no stub for the C module
import os
import sys
import time
from types import FrameType

SIGINT: int = _signal.SIGINT
SIGTERM: int = _signal.SIGTERM
STOP_SIGNALS = (SIGINT, SIGTERM)
EXIT_CODES: dict[int, int] = {SIGINT: 130, SIGTERM: 143}
COMMANDS = frozenset({"run"})
"""The subcommands whose start a stop signal ends with a summary (the others have none)."""
ENTRY_MODULES = frozenset({"zephon.__main__", "zephon.cli.__main__"})
PENDING_SIGNAL_ENV = "ZEPHON_PENDING_SIGNAL"
"""Set by the ``zephon`` script to "INT" or "TERM" when that signal came while sh ran."""


class Startup:
    """What the summary of a run stopped before its first item says (filled in as it starts)."""

    installed = False  # by install_startup_handlers: this process is the ``zephon`` command
    began = time.monotonic()
    config = ""
    json = False
    checkpoint: str | None = None  # the checkpoint being resumed: still where the run stands
    opened_io: dict[str, int] | None = None  # what opening the datasets read (row counts)


def _summary_line(signum: int) -> str:
    status = "terminated" if signum == SIGTERM else "interrupted"
    elapsed = round(time.monotonic() - Startup.began, 3)
    if Startup.json:
        import json

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
    _remove_shared_memory()
    os._exit(EXIT_CODES.get(signum, 1))


def _remove_shared_memory() -> None:
    """Unlink the engine's files in /dev/shm (its lock file, the first micro-batches): the
    exit hooks that would are skipped by ``os._exit``, and they would stay there, in RAM,
    until another engine's sweep. Its workers end by themselves when their pipes close."""
    shm = sys.modules.get("zephon._engine.handoff.shm")
    if shm is None:
        return  # no engine yet
    import contextlib  # here: every import at the top runs before the handlers exist

    with contextlib.suppress(Exception):  # the exit and its code come first
        shm.close_all()


def install_startup_handlers() -> None:
    """Stop signals end the process with a summary from here on (main thread only: another
    thread cannot set handlers, and the command's own thread is the main one)."""
    try:
        for signum in STOP_SIGNALS:
            _signal.signal(signum, stop_while_starting)
    except ValueError:
        return
    Startup.installed = True


def is_entry_point() -> bool:
    """Whether this process is the ``zephon`` command: its main module is the ``zephon`` script
    (or pip's console script) or ``python -m zephon`` (``-m zephon.cli``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name in ENTRY_MODULES:
        return True
    if getattr(sys, "orig_argv", [])[1:3] in (["-m", "zephon"], ["-m", "zephon.cli"]):
        return True  # still locating the module: ``__main__`` is not it yet
    path = str(getattr(main, "__file__", None) or "")
    return os.path.basename(path).split(".")[0].removesuffix("-script") == "zephon"


def is_command(argv: list[str]) -> bool:
    """Whether this process is the ``zephon`` command running one of :data:`COMMANDS`."""
    return len(argv) >= 2 and argv[1] in COMMANDS and is_entry_point()


def install_if_command() -> None:
    """Install the start-up handlers when this process is the command running one of
    :data:`COMMANDS`, then let in the stop signals the ``zephon`` script blocked (any
    subcommand: one without handlers gets Python's, as it would have without the block)."""
    if Startup.installed or not is_entry_point():
        return
    if is_command(sys.argv):
        install_startup_handlers()
    _raise_pending_signal()
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, STOP_SIGNALS)


def _raise_pending_signal() -> None:
    """Raise again the stop signal the ``zephon`` script caught while sh ran (before it could
    block it): the handlers, or Python's, then see it as if it had come now."""
    name = os.environ.pop(PENDING_SIGNAL_ENV, "")
    signum = {"INT": SIGINT, "TERM": SIGTERM}.get(name)
    if signum is not None:
        _signal.raise_signal(signum)  # blocked by the script: pending until the unblock
