"""The HTTP client to the inference server: JSON calls for capture, raw forwarding otherwise.

Transport failures are reported as :class:`InferenceUnavailable` with a kind (``timeout`` or
``connection``) because the serving path treats them differently from an HTTP answer: an answer
with a 4xx status is the engine refusing the call, no answer at all means the call's outcome is
unknown and the rollout must be masked, unless the connection was refused (``refused``): then
nothing was sent, and the call is retried and at worst reported as retryable, masking nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from zephon.errors import ZephonError

__all__ = [
    "InferenceAnswer",
    "InferenceClient",
    "InferenceUnavailable",
    "forward_headers",
    "forward_raw_headers",
]

# Hop-by-hop headers (RFC 9110 7.6.1) plus those httpx/uvicorn recompute.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def forward_headers(headers: Any) -> dict[str, str]:
    """Request or response headers minus hop-by-hop ones (``headers`` is any header mapping)."""
    return {k: v for k, v in headers.items() if k.lower() not in _HOP}


def forward_raw_headers(
    raw: Iterable[tuple[bytes, bytes]], drop: frozenset[str] = frozenset()
) -> list[tuple[bytes, bytes]]:
    """A client's headers as sent (bytes: a value need not be ASCII, a name may repeat), minus
    hop-by-hop ones and the names in ``drop``."""
    return [
        (k, v)
        for k, v in raw
        if (name := k.decode("latin-1").lower()) not in _HOP and name not in drop
    ]


class InferenceUnavailable(ZephonError):
    """No HTTP answer from the engine: every engine refused the connection within the retry
    budget (``kind="refused"``: nothing was sent, nothing generated), it timed out
    (``"timeout"``) or the connection failed or was closed after the request may have been
    sent (``"connection"``)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"engine {kind}: {detail}")
        self.kind = kind
        self.detail = detail


@dataclass(frozen=True, slots=True)
class InferenceAnswer:
    """One complete HTTP answer of the engine."""

    status: int
    body: bytes
    content_type: str

    def json(self) -> Any:
        return msgspec.json.decode(self.body)


class InferenceClient:
    """A pooled async client of one engine or a fleet of them (one client per worker).

    Each call goes to the next engine, round robin, that has not refused a connection in the
    last ``down_s`` seconds. A refused connection (or a connect timeout) means the request was
    never sent, so it is sent again, to the next engine, until ``connect_retry_s`` has passed:
    an engine that restarts or a fleet that rolls over costs waiting time, never a sample.
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        *,
        timeout_s: float,
        connect_timeout_s: float,
        max_connections: int,
        connect_retry_s: float = 10.0,
        down_s: float = 1.0,
    ) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("at least one inference server URL is needed")
        self.base_urls = [u.rstrip("/") for u in urls]
        self.base_url = self.base_urls[0]
        self.connect_retry_s = connect_retry_s
        self.down_s = down_s
        self._down_until = [0.0] * len(urls)
        self._next = 0
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            follow_redirects=False,
        )

    @property
    def client(self) -> httpx.AsyncClient:
        return self._client

    def pick(self) -> int:
        """The next engine that is not marked down (the soonest back when all are)."""
        now = time.monotonic()
        n = len(self.base_urls)
        for k in range(n):
            i = (self._next + k) % n
            if self._down_until[i] <= now:
                self._next = i + 1
                return i
        return min(range(n), key=lambda i: self._down_until[i])

    def url(self, path: str, engine: int | None = None) -> str:
        """The absolute URL of ``path`` (with its query) on ``engine`` (default: the next)."""
        return self.base_urls[self.pick() if engine is None else engine] + path

    def mark_down(self, engine: int) -> None:
        self._down_until[engine] = time.monotonic() + self.down_s

    async def post_json(
        self, path: str, payload: Any, headers: Mapping[str, bytes] | None = None
    ) -> InferenceAnswer:
        """POST ``payload`` as JSON and read the whole answer (``headers`` as sent: bytes)."""
        hdrs = {b"content-type": b"application/json", b"accept": b"application/json"}
        if headers:
            hdrs.update((k.encode("latin-1"), v) for k, v in headers.items())
        content = msgspec.json.encode(payload)
        deadline = time.monotonic() + self.connect_retry_s
        backoff = 0.05
        while True:
            engine = self.pick()
            try:
                resp = await self._client.post(
                    self.url(path, engine), content=content, headers=hdrs
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                self.mark_down(engine)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise InferenceUnavailable(
                        "refused",
                        f"POST {path}: no inference server accepted a connection within "
                        f"{self.connect_retry_s:g} s (last: {type(exc).__name__}: {exc})",
                    ) from exc
                if all(d > time.monotonic() for d in self._down_until):
                    await asyncio.sleep(min(backoff, left))  # the whole fleet is down: back off
                    backoff = min(backoff * 2, 1.0)
                continue
            except httpx.TimeoutException as exc:
                raise InferenceUnavailable("timeout", f"POST {path}: {type(exc).__name__}") from exc
            except (httpx.TransportError, OSError, AttributeError) as exc:
                # When the engine dies while a connection is being set up, the HTTP stack can
                # also fail in its own socket bookkeeping (an OSError, or an AttributeError on a
                # socket that is already gone); for the caller it is the same lost connection.
                raise InferenceUnavailable(
                    "connection", f"POST {path}: {type(exc).__name__}: {exc}"
                ) from exc
            return InferenceAnswer(
                resp.status_code, resp.content, resp.headers.get("content-type", "")
            )

    async def healthy(self, timeout_s: float = 2.0) -> tuple[bool, str]:
        """Whether any engine's ``GET /health`` answers 2xx within ``timeout_s``; the detail
        names each engine's answer."""
        details = []
        ok = False
        for base in self.base_urls:
            try:
                resp = await self._client.get(base + "/health", timeout=timeout_s)
            except httpx.HTTPError as exc:
                details.append(f"{base}: {type(exc).__name__}: {exc}")
                continue
            ok = ok or resp.is_success
            details.append(f"{base}: HTTP {resp.status_code}")
        detail = details[0].split(": ", 1)[1] if len(details) == 1 else "; ".join(details)
        return ok, detail

    async def aclose(self) -> None:
        await self._client.aclose()
