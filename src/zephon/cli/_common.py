"""Shared pieces of the ``zephon`` subcommands: exit codes, one-line errors, atomic JSON
files, checkpoint discovery and a tiny Prometheus endpoint."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from zephon.checkpoints import checkpoint_files, checkpoint_path

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "MetricsServer",
    "checkpoint_files",
    "checkpoint_path",
    "fail",
    "read_json",
]

#: Exit codes of every subcommand (docs/cli.md).
EXIT_OK = 0
EXIT_FAILURE = 1  # the command ran and failed (bad data, failing check, operator error)
EXIT_USAGE = 2  # the command line or the configuration is wrong
EXIT_DIFFERENT = 1  # `diff`: the two runs differ (not a failure of the command)
EXIT_INTERRUPTED = 130  # stopped with Ctrl-C (a checkpoint was written when possible)
EXIT_TERMINATED = 143  # stopped by SIGTERM, e.g. a preemption (a checkpoint was written)


def one_line(message: object) -> str:
    """The first line of ``message``, its whitespace collapsed: what an error line shows."""
    return " ".join(str(message).split("\n", 1)[0].split())


def fail(command: str, message: object, code: int = EXIT_FAILURE) -> int:
    """Print ONE line ``zephon COMMAND: error: MESSAGE`` on stderr and return ``code``."""
    print(f"zephon {command}: error: {one_line(message)}", file=sys.stderr)
    return code


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


class MetricsServer:
    """Serves ``GET /metrics`` (Prometheus text format) from a callable, in a daemon thread."""

    def __init__(self, render: Callable[[], str], host: str = "127.0.0.1", port: int = 0):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404, "only /metrics is served")
                    return
                body = render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="zephon-metrics", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host = self.host.decode() if isinstance(self.host, bytes) else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
