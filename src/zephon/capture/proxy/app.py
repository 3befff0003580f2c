"""The proxy's ASGI application (Starlette): capture routes, control routes, pass-through.

Routes:

* ``POST /ng-rollout/<rollout_id>/training-token-capture/v1/{chat/completions,completions,
  responses}`` - captured model calls (see :mod:`._capture`);
* other paths under that prefix: the engine's read-only routes (``v1/models``, ``tokenize``,
  ``detokenize``, ``health``, ``version``) are forwarded; anything else is 404 without reaching
  the engine, so no generation can slip past capture;
* ``/ng-rollout/<rollout_id>/<rest>`` (no capture segment): the prefix is stripped and the call
  forwarded untouched;
* ``/training-token-capture/control/...``: health, metrics, freeze, manifest, drop, retire,
  delete;
* everything else is forwarded to the engine untouched (streams included).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import msgspec
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from zephon.capture.protocols import RolloutRetiredError
from zephon.capture.proxy._capture import CallResult, CaptureService, error_body
from zephon.capture.proxy._config import ProxyConfig
from zephon.capture.proxy._engine import EngineClient, forward_headers
from zephon.capture.proxy._metrics import Metrics
from zephon.capture.proxy._pool import StoreClients
from zephon.capture.proxy._requests import CAPTURE_ROUTES
from zephon.capture.proxy._spill import SpillJournal
from zephon.capture.proxy._sse import sse_events
from zephon.capture.records import TokenCaptureSnapshot, validate_rollout_id

__all__ = [
    "CAPTURE_SEGMENT",
    "CAPTURE_TOKEN_HEADER",
    "CONTROL_PREFIX",
    "create_app",
    "create_app_from_env",
]

CAPTURE_SEGMENT = "training-token-capture"
CONTROL_PREFIX = "/training-token-capture/control"
CAPTURE_TOKEN_HEADER = "x-zephon-capture-token"
MAX_BATCH = 1024
_READ_ONLY = frozenset({"v1/models", "tokenize", "detokenize", "health", "version"})


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        msgspec.json.encode(body), status, headers=headers, media_type="application/json"
    )


def _error(message: str, code: str, status: int) -> Response:
    return _json(error_body(message, code, status), status)


def token_matches(given: str | None, token: str | None) -> bool:
    """True without a token; otherwise a constant-time comparison (no timing oracle)."""
    if not token:
        return True
    return hmac.compare_digest((given or "").encode(), token.encode())


def snapshot_summary(snap: TokenCaptureSnapshot) -> dict[str, Any]:
    """A token-free description of a frozen rollout (what the freeze route returns)."""
    calls = sorted(snap.entries, key=lambda e: (e.created_at, e.model_call_id))
    return {
        "rollout_id": snap.rollout_id,
        "snapshot_id": snap.snapshot_id,
        "version": snap.version,
        "incomplete": snap.incomplete,
        "entries": len(snap.entries),
        "generated_tokens": sum(len(e.generation_token_ids) for e in snap.entries),
        "calls": [
            {
                "model_call_id": e.model_call_id,
                "parent_call_id": e.parent_call_id,
                "parent_resolution": e.parent_resolution.value if e.parent_resolution else None,
                "parent_resolution_reason": e.parent_resolution_reason,
                "prompt_tokens": len(e.prompt_token_ids),
                "generated_tokens": len(e.generation_token_ids),
                "cum_len": e.cum_len,
                "digest": e.digest,
                "response_id": e.response_id,
                "created_at": e.created_at,
            }
            for e in calls
        ],
        "engine_refusals": [msgspec.to_builtins(r) for r in snap.engine_refusals],
    }


class _State:
    """Per-worker resources, created in the lifespan (after the worker process started)."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.stores = StoreClients(config.store_url, config.store_clients)
        self.engine = EngineClient(
            config.engine_url,
            timeout_s=config.engine_timeout_s,
            connect_timeout_s=config.connect_timeout_s,
            max_connections=config.max_engine_connections,
        )
        self.metrics = Metrics(config.metrics_dir)
        self.spill = SpillJournal(config.spill_path)
        self.service = CaptureService(
            self.stores,
            self.engine,
            self.metrics,
            delta_prompts=config.delta_prompts,
            spill=self.spill,
        )

    async def replay_forever(self) -> None:
        """Replay spilled marks at start and then every ``spill_replay_s`` seconds."""
        while True:
            await self.service.replay_spill()
            await asyncio.sleep(self.config.spill_replay_s)

    async def aclose(self) -> None:
        await self.engine.aclose()
        await self.stores.close()
        self.spill.close()


def create_app(config: ProxyConfig) -> Starlette:
    """The proxy application for one worker process."""
    state: dict[str, _State] = {}

    def st() -> _State:
        return state["s"]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        state["s"] = s = _State(config)
        await s.stores.check()  # fail at startup, not on the first model call
        replayer = asyncio.create_task(s.replay_forever())
        flusher = None
        if config.metrics_dir:

            async def flush_forever() -> None:
                while True:
                    await asyncio.sleep(1.0)
                    s.metrics.flush()

            flusher = asyncio.create_task(flush_forever())
        try:
            yield
        finally:
            replayer.cancel()
            if flusher is not None:
                flusher.cancel()
                s.metrics.flush()
            await s.aclose()

    def counted(route: str, fn: Callable[[Request], Awaitable[Response]]) -> Any:
        async def wrapped(request: Request) -> Response:
            resp = await fn(request)
            st().metrics.inc("zephon_proxy_requests_total", route=route, code=str(resp.status_code))
            return resp

        return wrapped

    # -- pass-through ------------------------------------------------------------------------

    async def forward(request: Request, path: str) -> Response:
        client = st().engine.client
        url = httpx.URL(path=path, query=request.url.query.encode("ascii"))
        req = client.build_request(
            request.method,
            url,
            headers=forward_headers(request.headers),
            content=await request.body(),
        )
        try:
            upstream = await client.send(req, stream=True)
        except httpx.TimeoutException as exc:
            return _error(f"engine timeout: {type(exc).__name__}", "engine_timeout", 504)
        except httpx.TransportError as exc:
            return _error(f"engine connection: {exc!r}", "engine_connection", 502)
        return StreamingResponse(
            upstream.aiter_raw(),
            status_code=upstream.status_code,
            headers=forward_headers(upstream.headers),
            background=BackgroundTask(upstream.aclose),
        )

    async def passthrough(request: Request) -> Response:
        return await forward(request, request.url.path)

    async def correlated(request: Request) -> Response:
        rest = request.path_params["rest"]
        if rest.startswith(CAPTURE_SEGMENT + "/") or rest == CAPTURE_SEGMENT:
            route, resp = await capture(request)
        else:
            route, resp = "rollout_passthrough", await forward(request, "/" + rest)
        st().metrics.inc("zephon_proxy_requests_total", route=route, code=str(resp.status_code))
        return resp

    # -- capture -----------------------------------------------------------------------------

    async def capture(request: Request) -> tuple[str, Response]:
        if not token_matches(request.headers.get(CAPTURE_TOKEN_HEADER), config.capture_token):
            message = f"capture routes need the '{CAPTURE_TOKEN_HEADER}' header"
            return "capture_unauthorized", _error(message, "unauthorized", 401)
        rid = request.path_params["rollout_id"]
        rest = request.path_params["rest"][len(CAPTURE_SEGMENT) :].strip("/")
        try:
            validate_rollout_id(rid)
        except ValueError as exc:
            return "capture_invalid", _error(str(exc), "invalid_rollout_id", 400)
        dialect = CAPTURE_ROUTES.get(rest)
        if dialect is None:
            if rest in _READ_ONLY or rest.startswith("v1/models/"):
                return "capture_read_only", await forward(request, "/" + rest)
            known = ", ".join("/" + r for r in CAPTURE_ROUTES)
            return "capture_unknown", _error(
                f"/{rest} is not a capture route (capture routes: {known}); the request was "
                "not sent to the engine",
                "unknown_capture_route",
                404,
            )
        if request.method != "POST":
            return dialect, _error(f"/{rest} accepts POST only", "method_not_allowed", 405)
        raw = await request.body()
        result = await st().service.handle(rid, dialect, raw, dict(request.headers))
        return dialect, _result(result)

    def _result(result: CallResult) -> Response:
        if result.raw is not None:
            return Response(
                result.raw, result.status, headers=result.headers, media_type=result.content_type
            )
        if result.stream and result.call is not None:
            events = sse_events(result.body, result.call)
            return StreamingResponse(
                iter(events), 200, headers=result.headers, media_type="text/event-stream"
            )
        return _json(result.body, result.status, result.headers)

    # -- control -----------------------------------------------------------------------------

    def authorised(request: Request) -> bool:
        token = config.control_token
        given = request.headers.get("authorization")
        return token_matches(given, f"Bearer {token}" if token else None)

    def control(fn: Callable[[Request], Awaitable[Response]]) -> Any:
        async def wrapped(request: Request) -> Response:
            if not authorised(request):
                return _error(
                    "control routes need 'Authorization: Bearer <token>'", "unauthorized", 401
                )
            rid = request.path_params.get("rollout_id")
            if rid is not None:
                try:
                    validate_rollout_id(rid)
                except ValueError as exc:
                    return _error(str(exc), "invalid_rollout_id", 400)
            try:
                return await fn(request)
            except RolloutRetiredError as exc:
                return _error(str(exc), "rollout_retired", 410)
            except _BodyError as exc:
                return _error(str(exc), "invalid_request", 400)

        return wrapped

    async def health(_request: Request) -> Response:
        s = st()
        ok, detail = await s.engine.healthy()
        body = {
            "status": "ok" if ok else "engine_unavailable",
            "engine": {"url": s.config.engine_url, "ok": ok, "detail": detail},
            "store": s.stores.describe(),
            "pid": os.getpid(),
        }
        return _json(body, 200 if ok else 503)

    async def metrics(_request: Request) -> Response:
        text = await asyncio.to_thread(st().metrics.render)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def freeze(request: Request) -> Response:
        rid = request.path_params["rollout_id"]
        snap = await st().stores.of(rid).freeze(rid)
        return _json(snapshot_summary(snap))

    async def manifest(request: Request) -> Response:
        rid = request.path_params["rollout_id"]
        return _json(await st().stores.of(rid).manifest(rid))

    async def drop(request: Request) -> Response:
        body = await _body(request, ("snapshot_id", "version"))
        if not isinstance(body["snapshot_id"], str) or type(body["version"]) is not int:
            raise _BodyError("'snapshot_id' must be a string and 'version' an integer")
        rid = request.path_params["rollout_id"]
        dropped = (
            await st()
            .stores.of(rid)
            .drop(
                rid,
                snapshot_id=body["snapshot_id"],
                version=body["version"],
            )
        )
        return _json({"dropped": bool(dropped)})

    def removal(action: str) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            body = await _body(request, ("capture_keys",))
            keys = body["capture_keys"]
            if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
                raise _BodyError("'capture_keys' must be a list of rollout ids")
            if len(keys) > MAX_BATCH:
                raise _BodyError(f"at most {MAX_BATCH} capture_keys per request")
            try:
                result = await getattr(st().stores.first, action)(keys)
            except ValueError as exc:
                raise _BodyError(str(exc)) from None
            return _json(result.to_wire())

        return run

    c = CONTROL_PREFIX
    routes = [
        Route(f"{c}/health", counted("control", control(health)), methods=["GET"]),
        Route(f"{c}/metrics", control(metrics), methods=["GET"]),
        Route(
            f"{c}/rollouts/{{rollout_id}}/freeze",
            counted("control", control(freeze)),
            methods=["POST"],
        ),
        Route(
            f"{c}/rollouts/{{rollout_id}}/manifest",
            counted("control", control(manifest)),
            methods=["GET"],
        ),
        Route(
            f"{c}/rollouts/{{rollout_id}}/drop", counted("control", control(drop)), methods=["POST"]
        ),
        Route(f"{c}/retire", counted("control", control(removal("retire"))), methods=["POST"]),
        Route(f"{c}/delete", counted("control", control(removal("delete"))), methods=["POST"]),
        Route("/ng-rollout/{rollout_id}/{rest:path}", correlated, methods=_ALL),
        Route("/{path:path}", counted("passthrough", passthrough), methods=_ALL),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


_ALL = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


class _BodyError(ValueError):
    pass


async def _body(request: Request, required: tuple[str, ...]) -> dict[str, Any]:
    try:
        body = msgspec.json.decode(await request.body())
    except msgspec.DecodeError as exc:
        raise _BodyError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _BodyError("the request body must be a JSON object")
    missing = [k for k in required if k not in body]
    if missing:
        raise _BodyError(f"the request body lacks {', '.join(map(repr, missing))}")
    return body


def create_app_from_env() -> Starlette:
    """App factory for worker processes (configuration from ``ZEPHON_CAPTURE_PROXY_CONFIG``)."""
    return create_app(ProxyConfig.from_env())
