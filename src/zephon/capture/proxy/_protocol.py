"""uvicorn's HTTP protocol with read timeouts and a header size limit.

Why: uvicorn bounds only the idle time between two requests. A connection that never sends a
complete request (silent, or one byte a second) otherwise holds its socket and memory forever,
and a header section has no size limit. Here each request's headers must arrive within
``header_timeout_s`` of its first byte (of the connection, for the first request) and within
``max_header_bytes``; its body within ``body_timeout_s`` of the headers. A connection that
misses a deadline is answered 408 when no request is running on it, and closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from zephon.errors import ZephonError

__all__ = ["bounded_protocol"]

_408 = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
    b"connection: close\r\n\r\n"
)


class _HeadersTooLarge(ZephonError):
    pass


class _BoundedProtocol(HttpToolsProtocol):
    header_timeout_s = 10.0
    body_timeout_s = 60.0
    max_header_bytes = 65536

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._arm(self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(_408)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        # uvicorn's, but a header section over the limit is answered 431 rather than 400.
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            if self._header_bytes > self.max_header_bytes:
                self.transport.write(_431)
                self.transport.close()
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        if self._deadline is None:
            self._arm(self.header_timeout_s)

    def _count(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > self.max_header_bytes:
            raise _HeadersTooLarge  # stops the parser: data_received answers 431

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._arm(self.body_timeout_s)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()


def bounded_protocol(
    *, header_timeout_s: float, body_timeout_s: float, max_header_bytes: int
) -> type[Any]:
    """A protocol class for ``uvicorn.Config(http=...)`` with these limits."""
    return type(
        "ZephonHttpProtocol",
        (_BoundedProtocol,),
        {
            "header_timeout_s": header_timeout_s,
            "body_timeout_s": body_timeout_s,
            "max_header_bytes": max_header_bytes,
        },
    )
