"""The HTTP client to the inference server: JSON calls for capture, raw forwarding otherwise.

Transport failures are reported as :class:`InferenceUnavailable` with a kind (``timeout`` or
``connection``) because the serving path treats them differently from an HTTP answer: an answer
with a 4xx status is the engine refusing the call, no answer at all means the call's outcome is
unknown and the rollout must be masked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

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


class InferenceUnavailable(Exception):
    """No HTTP answer from the engine: it timed out (``kind="timeout"``) or the connection
    failed or was closed (``kind="connection"``)."""

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
    """A pooled async client of one engine (one per worker process)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        max_connections: int,
    ) -> None:
        self.base_url = base_url
        self._client = httpx.AsyncClient(
            base_url=base_url,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            follow_redirects=False,
        )

    @property
    def client(self) -> httpx.AsyncClient:
        return self._client

    async def post_json(
        self, path: str, payload: Any, headers: Mapping[str, bytes] | None = None
    ) -> InferenceAnswer:
        """POST ``payload`` as JSON and read the whole answer (``headers`` as sent: bytes)."""
        hdrs = {b"content-type": b"application/json", b"accept": b"application/json"}
        if headers:
            hdrs.update((k.encode("latin-1"), v) for k, v in headers.items())
        content = msgspec.json.encode(payload)
        try:
            resp = await self._client.post(path, content=content, headers=hdrs)
        except httpx.TimeoutException as exc:
            raise InferenceUnavailable("timeout", f"POST {path}: {type(exc).__name__}") from exc
        except (httpx.TransportError, OSError, AttributeError) as exc:
            # When the engine dies while a connection is being set up, the HTTP stack can also
            # fail in its own socket bookkeeping (an OSError, or an AttributeError on a socket
            # that is already gone); for the caller it is the same lost connection.
            raise InferenceUnavailable(
                "connection", f"POST {path}: {type(exc).__name__}: {exc}"
            ) from exc
        return InferenceAnswer(resp.status_code, resp.content, resp.headers.get("content-type", ""))

    async def healthy(self, timeout_s: float = 2.0) -> tuple[bool, str]:
        """Whether ``GET /health`` answers 2xx within ``timeout_s``."""
        try:
            resp = await self._client.get("/health", timeout=timeout_s)
        except httpx.HTTPError as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return resp.is_success, f"HTTP {resp.status_code}"

    async def aclose(self) -> None:
        await self._client.aclose()
