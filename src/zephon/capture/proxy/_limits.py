"""What one client may cost a proxy worker: body size, buffered bytes, JSON depth, concurrency.

Why: without limits one client sending a 100 MB body (or many) grows the worker's memory
without bound and stalls everyone else. Every refusal here is a 4xx or a 503 with
``Retry-After`` before the body is buffered: a request body is read incrementally, up to
``max_body_bytes`` (413 beyond; at once when ``Content-Length`` says so), and the bodies of
all requests in flight in one worker together hold at most ``max_buffered_bytes`` (503
beyond). Header and body read timeouts live in the HTTP protocol (:mod:`._protocol`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from zephon.errors import ZephonError

__all__ = [
    "Admission",
    "BodyBudget",
    "ClientRefused",
    "decode_json",
    "read_body",
    "too_deep",
]


@dataclass
class ClientRefused(ZephonError):
    """A request refused for what the client sent (or, 503, for what the worker can take)."""

    status: int
    code: str
    message: str
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.message


SMALL_BODY_BYTES = 2**20
"""A body up to this size is an ordinary call; larger ones share what the reserve leaves."""

RESERVE_FRACTION = 8
"""One eighth of the budget is kept for small bodies (up to what the largest body leaves)."""


class BodyBudget:
    """Bytes of request bodies one worker holds at once (one event loop: no lock needed).

    A request's bytes stay counted until its response is done (the decoded body and the
    engine request built from it live that long), so the budget bounds the worker's memory.
    Bodies over :data:`SMALL_BODY_BYTES` together hold at most ``large_limit``: a few
    clients streaming maximum-size bodies cannot fill the budget and turn every ordinary
    call away with 503s.
    """

    def __init__(self, limit: int, max_body: int | None = None) -> None:
        self.limit = limit
        reserve = limit // RESERVE_FRACTION
        self.large_limit = max(limit - reserve, min(limit, max_body or 0))
        self.held = 0
        self.large_held = 0

    def take(self, n: int, large: int = 0) -> bool:
        """Take ``n`` more bytes, ``large`` of them newly counted as a large body's."""
        if self.held + n > self.limit or self.large_held + large > self.large_limit:
            return False
        self.held += n
        self.large_held += large
        return True

    def give(self, n: int, large: int = 0) -> None:
        self.held -= n
        self.large_held -= large


class _Hold:
    """What one request took from the budget (given back by :class:`Admission`)."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.bytes = 0
        self.large = False

    def grow_to(self, n: int) -> None:
        if n <= self.bytes:
            return
        large = n > SMALL_BODY_BYTES
        newly_large = (n if not self.large else n - self.bytes) if large else 0
        if not self.budget.take(n - self.bytes, newly_large):
            raise _busy("request bodies")
        self.bytes = n
        self.large = large

    def release(self) -> None:
        self.budget.give(self.bytes, self.bytes if self.large else 0)
        self.bytes = 0
        self.large = False


_HOLD = "zephon.body_hold"


def _too_large(limit: int) -> ClientRefused:
    return ClientRefused(
        413,
        "request_too_large",
        f"the request body is larger than {limit} bytes (the proxy's --max-body-bytes)",
        {"connection": "close"},
    )


def _declared_length(request: Request, limit: int) -> int:
    raw = request.headers.get("content-length")
    if raw is None:
        return 0
    try:
        declared = int(raw)
    except ValueError:
        raise ClientRefused(400, "invalid_request", "Content-Length is not a number") from None
    if declared > limit:
        raise _too_large(limit)
    return max(declared, 0)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, read chunk by chunk within ``limit`` bytes and the worker's budget
    (the request's hold, set by :class:`Admission`)."""
    hold: _Hold = request.scope[_HOLD]
    hold.grow_to(_declared_length(request, limit))
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            hold.grow_to(size)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientRefused(400, "client_disconnected", "the client went away") from None
    return b"".join(chunks)


def _busy(what: str) -> ClientRefused:
    return ClientRefused(
        503,
        "proxy_busy",
        f"this proxy worker holds as many {what} as it may; retry shortly",
        {"retry-after": "1", "connection": "close", "x-should-retry": "true"},
    )


def too_deep(value: Any, limit: int) -> bool:
    """Whether decoded JSON nests deeper than ``limit`` containers (iterative: no recursion)."""
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def decode_json(raw: bytes, max_depth: int) -> Any:
    """Decode a request body, refusing invalid or too deeply nested JSON with a 400."""
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise ClientRefused(
            400, "invalid_json", f"the request body is not valid JSON: {exc}"
        ) from None
    except RecursionError:
        value = None
        deep = True
    else:
        deep = too_deep(value, max_depth)
    if deep:
        raise ClientRefused(
            400,
            "json_too_deep",
            f"the request body nests JSON deeper than {max_depth} levels (--max-json-depth)",
        )
    return value


class Admission:
    """ASGI middleware: at most ``cap`` requests in flight in this worker (else 503 with
    ``Retry-After``), and each request's body bytes counted against ``budget`` until it is
    answered. Paths under ``exempt`` (the control routes: trainer and probes, behind their
    token) are not counted against the cap, so a flood cannot lock the operator out."""

    def __init__(
        self, app: ASGIApp, cap: int, budget: int, exempt: str, max_body: int | None = None
    ) -> None:
        self.app = app
        self.cap = cap
        self.budget = BodyBudget(budget, max_body)
        self.exempt = exempt
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        counted = not scope["path"].startswith(self.exempt)
        if counted and self.in_flight >= self.cap:
            await _send_busy(send, self.cap)
            return
        hold = scope[_HOLD] = _Hold(self.budget)
        self.in_flight += counted
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= counted
            hold.release()


async def _send_busy(send: Send, cap: int) -> None:
    body = (
        b'{"error":{"message":"this proxy worker has '
        + str(cap).encode()
        + b' requests in flight (--max-concurrent-requests); retry shortly",'
        b'"type":"server_error","code":"proxy_busy"}}'
    )
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
                (b"x-should-retry", b"true"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
