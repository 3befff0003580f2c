"""The command line's rich console: a reader that goes away is the command's broken pipe.

rich answers a broken pipe with ``SystemExit(1)``, so ``zephon checkpoint inspect | head``
exited 1 where ``zephon explain | head`` exits 141 (the status of a tool killed by SIGPIPE).
This console raises :class:`BrokenPipeError` instead, which ``zephon.cli.main`` turns into
that quiet 141 for every command alike.
"""

from __future__ import annotations

import errno

from rich.console import Console

__all__ = ["PipeConsole"]


class PipeConsole(Console):
    """A :class:`rich.console.Console` whose broken pipe reaches the command's handler."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more is written through this console
        raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")
