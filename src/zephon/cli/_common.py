"""Shared pieces of the ``zephon`` subcommands: exit codes, one-line errors, atomic JSON
files, checkpoint discovery and a tiny Prometheus endpoint."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

#: Exit codes of every subcommand (docs/cli.md).
EXIT_OK = 0
EXIT_FAILURE = 1  # the command ran and failed (bad data, failing check, operator error)
EXIT_USAGE = 2  # the command line or the configuration is wrong
EXIT_INTERRUPTED = 130  # stopped with Ctrl-C (a checkpoint was written when possible)

CHECKPOINT_RE = re.compile(r"^ckpt-(\d+)\.json$")


def fail(command: str, message: object, code: int = EXIT_FAILURE) -> int:
    """Print ONE line ``zephon COMMAND: error: MESSAGE`` on stderr and return ``code``."""
    text = " ".join(str(message).split("\n", 1)[0].split())
    print(f"zephon {command}: error: {text}", file=sys.stderr)
    return code


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write JSON so that a crash leaves either the old file or the complete new one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def checkpoint_files(directory: str | os.PathLike[str]) -> list[Path]:
    """``ckpt-<items>.json`` files of a checkpoint directory, oldest first."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = CHECKPOINT_RE.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def checkpoint_path(directory: str | os.PathLike[str], items: int) -> Path:
    return Path(directory) / f"ckpt-{items:010d}.json"


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
