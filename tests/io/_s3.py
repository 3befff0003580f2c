"""A real S3-compatible server on loopback (moto's server mode) behind a fault-injecting proxy.

The proxy forwards every request to moto and records it; tests make it answer the next N
matching requests with an HTTP error, or flip a byte of the next matching response body, so
retries and integrity checks meet real failures on the wire.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_HOP_HEADERS = ("content-length", "transfer-encoding", "connection", "server", "date")


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int


@dataclass
class Faults:
    fail: int = 0  # answer this many matching requests with ``status``
    status: int = 503
    corrupt: int = 0  # flip one byte in this many matching response bodies
    match: Callable[[str, str], bool] = field(default=lambda method, path: True)


class Proxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.faults = Faults()
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                proxy.handle(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def reset(self, **faults: Any) -> None:
        with self.lock:
            self.faults = Faults(**faults)
            self.seen = []

    def gets(self, key_part: str = "") -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.method == "GET" and key_part in s.path]

    def _decide(self, method: str, path: str) -> tuple[int | None, bool]:
        with self.lock:
            f = self.faults
            if not f.match(method, path):
                return None, False
            if f.fail > 0:
                f.fail -= 1
                return f.status, False
            if f.corrupt > 0 and method == "GET":
                f.corrupt -= 1
                return None, True
            return None, False

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        fail, corrupt = self._decide(h.command, h.path)
        if fail is not None:
            payload = b"<Error><Code>ServiceUnavailable</Code><Message>injected</Message></Error>"
            self._record(h, fail, 0)
            h.send_response(fail)
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            h.wfile.write(payload)
            return
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        headers = dict(h.headers.items())  # the Host header stays: it is signed
        conn.request(h.command, h.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        if corrupt and data:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        self._record(h, resp.status, len(data))
        h.send_response(resp.status)
        for k, v in resp.getheaders():
            # A corrupted body travels without the store's checksum, as through a store or
            # proxy that sends none: only the reader's own check can catch it.
            checksum = k.lower().startswith("x-amz-checksum")
            if k.lower() not in _HOP_HEADERS and not (corrupt and checksum):
                h.send_header(k, v)
        # A HEAD answer has no body but announces the object's size.
        length = resp.getheader("Content-Length") if h.command == "HEAD" else None
        h.send_header("Content-Length", length or str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    def _record(self, h: BaseHTTPRequestHandler, status: int, size: int) -> None:
        with self.lock:
            self.seen.append(Seen(h.command, h.path, h.headers.get("Range"), status, size))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


BUCKET = "zephon-test"


@dataclass
class S3:
    proxy: Proxy
    client: Any

    def upload(self, folder: Path, prefix: str) -> str:
        """Every file under ``folder`` to ``s3://BUCKET/prefix/...``; returns that URL."""
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            key = f"{prefix}/{path.relative_to(folder).as_posix()}"
            self.client.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes())
        return f"s3://{BUCKET}/{prefix}"
