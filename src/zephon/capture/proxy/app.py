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
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from zephon.capture.protocols import RolloutRetiredError
from zephon.capture.proxy._capture import CallResult, CaptureService, error_body, should_retry
from zephon.capture.proxy._config import ProxyConfig
from zephon.capture.proxy._inference import (
    InferenceClient,
    forward_headers,
    forward_raw_headers,
)
from zephon.capture.proxy._limits import (
    Admission,
    ClientRefused,
    decode_json,
    read_body,
)
from zephon.capture.proxy._metrics import Metrics
from zephon.capture.proxy._pool import StoreClients
from zephon.capture.proxy._requests import CAPTURE_ROUTES
from zephon.capture.proxy._spill import SpillJournal
from zephon.capture.proxy._sse import sse_events
from zephon.capture.records import TokenCaptureSnapshot, validate_rollout_id
from zephon.errors import ZephonError

__all__ = ["CAPTURE_SEGMENT", "CAPTURE_TOKEN_HEADER", "CONTROL_PREFIX", "create_app_from_env"]

CAPTURE_SEGMENT = "training-token-capture"
CONTROL_PREFIX = "/training-token-capture/control"
CAPTURE_TOKEN_HEADER = "x-zephon-capture-token"
MAX_BATCH = 1024
_NOT_FORWARDED = frozenset({CAPTURE_TOKEN_HEADER})  # the proxy's secret, not the engine's
_READ_ONLY = frozenset({"v1/models", "tokenize", "detokenize", "health", "version"})


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    if status >= 400:
        headers = {**should_retry(body, status), **(headers or {})}
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
        self.inference = InferenceClient(
            config.engine_urls,
            timeout_s=config.engine_timeout_s,
            connect_timeout_s=config.connect_timeout_s,
            max_connections=config.max_engine_connections,
            connect_retry_s=config.connect_retry_s,
        )
        self.metrics = Metrics(config.metrics_dir)
        self.spill = SpillJournal(config.spill_path)
        self.service = CaptureService(
            self.stores,
            self.inference,
            self.metrics,
            delta_prompts=config.delta_prompts,
            weight_version=config.weight_version,
            spill=self.spill,
            max_json_depth=config.max_json_depth,
        )

    async def replay_forever(self) -> None:
        """Replay spilled marks at start and then every ``spill_replay_s`` seconds."""
        while True:
            await self.service.replay_spill()
            await asyncio.sleep(self.config.spill_replay_s)

    async def aclose(self) -> None:
        await self.inference.aclose()
        await self.stores.close()
        self.spill.close()


def _state(request: Request) -> _State:
    state: _State = request.app.state.proxy
    return state


def _config(request: Request) -> ProxyConfig:
    config: ProxyConfig = request.app.state.config
    return config


async def _read(request: Request) -> bytes:
    """The request body within the worker's limits (:class:`ClientRefused` beyond them)."""
    return await read_body(request, _config(request).max_body_bytes)


def _refusal(exc: ClientRefused) -> Response:
    return _json(error_body(exc.message, exc.code, exc.status), exc.status, exc.headers)


def _worker_authorised(request: Request) -> bool:
    """The capture token (when set) on a capture or pass-through route."""
    return token_matches(request.headers.get(CAPTURE_TOKEN_HEADER), _config(request).capture_token)


def _worker_unauthorised() -> Response:
    message = f"this route needs the '{CAPTURE_TOKEN_HEADER}' header (the capture token)"
    return _error(message, "unauthorized", 401)


async def _flush_forever(metrics: Metrics) -> None:
    while True:
        await asyncio.sleep(1.0)
        metrics.flush()


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    """Open the worker's resources (after the worker process started) and close them."""
    config: ProxyConfig = app.state.config
    app.state.proxy = s = _State(config)
    await s.stores.check()  # fail at startup, not on the first model call
    replayer = asyncio.create_task(s.replay_forever())
    flusher = asyncio.create_task(_flush_forever(s.metrics)) if config.metrics_dir else None
    try:
        yield
    finally:
        replayer.cancel()
        if flusher is not None:
            flusher.cancel()
            s.metrics.flush()
        await s.aclose()


Handler = Callable[[Request], Awaitable[Response]]


def _counted(route: str, fn: Handler) -> Handler:
    """Count each response of ``fn`` in ``zephon_proxy_requests_total`` under ``route``."""

    async def wrapped(request: Request) -> Response:
        resp = await fn(request)
        _state(request).metrics.inc(
            "zephon_proxy_requests_total", route=route, code=str(resp.status_code)
        )
        return resp

    return wrapped


# -- pass-through ----------------------------------------------------------------------------


def _engine_url(path: str, query: bytes) -> httpx.URL:
    try:
        return httpx.URL(path=path, query=query)
    except (httpx.InvalidURL, ValueError) as exc:
        raise ClientRefused(400, "invalid_path", f"path {path[:200]!r} is invalid: {exc}") from None


async def _forward(request: Request, path: str) -> Response:
    """Send the request to the engine at ``path`` and stream its answer back untouched."""
    inference = _state(request).inference
    client = inference.client
    url = _engine_url(path, request.scope.get("query_string", b""))
    req = client.build_request(
        request.method,
        inference.url(url.raw_path.decode("ascii")),
        headers=forward_raw_headers(request.headers.raw, _NOT_FORWARDED),
        content=await _read(request),
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


async def _passthrough(request: Request) -> Response:
    if not _worker_authorised(request):
        return _worker_unauthorised()
    try:
        return await _forward(request, request.url.path)
    except ClientRefused as exc:
        return _refusal(exc)


async def _correlated(request: Request) -> Response:
    rest = request.path_params["rest"]
    capture = rest.startswith(CAPTURE_SEGMENT + "/") or rest == CAPTURE_SEGMENT
    try:
        if not _worker_authorised(request):
            route = "capture_unauthorized" if capture else "rollout_passthrough"
            resp = _worker_unauthorised()
        elif capture:
            route, resp = await _capture(request)
        else:
            route, resp = "rollout_passthrough", await _forward(request, "/" + rest)
    except ClientRefused as exc:
        route, resp = ("capture_invalid" if capture else "rollout_passthrough"), _refusal(exc)
    _state(request).metrics.inc(
        "zephon_proxy_requests_total", route=route, code=str(resp.status_code)
    )
    return resp


# -- capture ---------------------------------------------------------------------------------


async def _capture(request: Request) -> tuple[str, Response]:
    """A call under the capture segment (its token checked): ``(route label, response)``."""
    rid = request.path_params["rollout_id"]
    rest = request.path_params["rest"][len(CAPTURE_SEGMENT) :].strip("/")
    try:
        validate_rollout_id(rid)
    except ValueError as exc:
        return "capture_invalid", _error(str(exc), "invalid_rollout_id", 400)
    dialect = CAPTURE_ROUTES.get(rest)
    if dialect is None:
        if rest in _READ_ONLY or rest.startswith("v1/models/"):
            return "capture_read_only", await _forward(request, "/" + rest)
        known = ", ".join("/" + r for r in CAPTURE_ROUTES)
        return "capture_unknown", _error(
            f"/{rest} is not a capture route (capture routes: {known}); the request was "
            "not sent to the engine",
            "unknown_capture_route",
            404,
        )
    if request.method != "POST":
        return dialect, _error(f"/{rest} accepts POST only", "method_not_allowed", 405)
    raw = await _read(request)
    result = await _state(request).service.handle(rid, dialect, raw, dict(request.headers))
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


# -- control ---------------------------------------------------------------------------------


def _authorised(request: Request) -> bool:
    token = _config(request).control_token
    given = request.headers.get("authorization")
    return token_matches(given, f"Bearer {token}" if token else None)


def _control(fn: Handler) -> Handler:
    """A control route: bearer token, a valid rollout id, store errors as HTTP errors."""

    async def wrapped(request: Request) -> Response:
        if not _authorised(request):
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
        except ClientRefused as exc:
            return _refusal(exc)

    return wrapped


async def _health(request: Request) -> Response:
    s = _state(request)
    ok, detail = await s.inference.healthy()
    body = {
        "status": "ok" if ok else "engine_unavailable",
        "engine": {"url": s.config.engine_url, "ok": ok, "detail": detail},
        "engines": list(s.config.engine_urls),
        "store": s.stores.describe(),
        "pid": os.getpid(),
    }
    return _json(body, 200 if ok else 503)


async def _metrics(request: Request) -> Response:
    text = await asyncio.to_thread(_state(request).metrics.render)
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def _freeze(request: Request) -> Response:
    rid = request.path_params["rollout_id"]
    snap = await _state(request).stores.of(rid).freeze(rid)
    return _json(snapshot_summary(snap))


async def _manifest(request: Request) -> Response:
    rid = request.path_params["rollout_id"]
    return _json(await _state(request).stores.of(rid).manifest(rid))


async def _drop(request: Request) -> Response:
    body = await _body(request, ("snapshot_id", "version"))
    if not isinstance(body["snapshot_id"], str) or type(body["version"]) is not int:
        raise _BodyError("'snapshot_id' must be a string and 'version' an integer")
    rid = request.path_params["rollout_id"]
    store = _state(request).stores.of(rid)
    dropped = await store.drop(rid, snapshot_id=body["snapshot_id"], version=body["version"])
    return _json({"dropped": bool(dropped)})


def _removal(action: str) -> Handler:
    """The ``retire`` or ``delete`` route: a batch of capture keys, answered by the store."""

    async def run(request: Request) -> Response:
        body = await _body(request, ("capture_keys",))
        keys = body["capture_keys"]
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise _BodyError("'capture_keys' must be a list of rollout ids")
        if len(keys) > MAX_BATCH:
            raise _BodyError(f"at most {MAX_BATCH} capture_keys per request")
        try:
            result = await getattr(_state(request).stores.first, action)(keys)
        except ValueError as exc:
            raise _BodyError(str(exc)) from None
        return _json(result.to_wire())

    return run


def _routes() -> list[Route]:
    c = CONTROL_PREFIX

    def control(path: str, fn: Handler, method: str) -> Route:
        return Route(f"{c}/{path}", _counted("control", _control(fn)), methods=[method])

    return [
        control("health", _health, "GET"),
        Route(f"{c}/metrics", _control(_metrics), methods=["GET"]),
        control("rollouts/{rollout_id}/freeze", _freeze, "POST"),
        control("rollouts/{rollout_id}/manifest", _manifest, "GET"),
        control("rollouts/{rollout_id}/drop", _drop, "POST"),
        control("retire", _removal("retire"), "POST"),
        control("delete", _removal("delete"), "POST"),
        Route("/ng-rollout/{rollout_id}/{rest:path}", _correlated, methods=_ALL),
        Route("/{path:path}", _counted("passthrough", _passthrough), methods=_ALL),
    ]


def create_app(config: ProxyConfig) -> Starlette:
    """The proxy application for one worker process: module-level handlers over one
    ``_State`` (opened in the lifespan, kept in ``app.state.proxy``)."""
    admission = Middleware(
        Admission,
        cap=config.max_concurrent_requests,
        budget=config.max_buffered_bytes,
        max_body=config.max_body_bytes,
        exempt=CONTROL_PREFIX + "/",
    )
    app = Starlette(routes=_routes(), lifespan=_lifespan, middleware=[admission])
    app.state.config = config
    return app


_ALL = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


class _BodyError(ZephonError, ValueError):
    pass


async def _body(request: Request, required: tuple[str, ...]) -> dict[str, Any]:
    body = decode_json(await _read(request), _config(request).max_json_depth)
    if not isinstance(body, dict):
        raise _BodyError("the request body must be a JSON object")
    missing = [k for k in required if k not in body]
    if missing:
        raise _BodyError(f"the request body lacks {', '.join(map(repr, missing))}")
    return body


def create_app_from_env() -> Starlette:
    """App factory for worker processes (configuration from ``ZEPHON_CAPTURE_PROXY_CONFIG``)."""
    return create_app(ProxyConfig.from_env())
