"""One captured model call, from the client's request to the durable entry and the answer.

Order (each step only after the previous one): validate the request; mint a fresh model call
id; resolve the parent once; record the ``begin_call`` intent (a failure here fails the call
before any compute); call the engine for exact token data; build, stamp and ``put`` the
``TokenEntry``; only then answer the client (JSON, or an event stream synthesised from the
captured answer). The capture part runs shielded from client disconnects, so a client that goes
away cannot leave a generated call without its entry or its incomplete mark.

Outcomes that are not a committed entry:

* the engine answers 4xx: a refusal before generation; recorded with ``record_engine_refusal``
  (resolving the intent) and the engine's error is passed on;
* the engine answers 5xx, times out or drops the connection: whether it generated is unknown,
  so the rollout is marked incomplete; the client gets the engine's 5xx, 504 or 502;
* the answer lacks exact token data or ``put`` fails: the rollout is marked incomplete and the
  client still gets its answer (a capture failure never fails the model call);
* ``put`` raises the frozen or retired error: the late record is dropped and nothing is marked
  (the freeze already judged the rollout from its intents).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec

from zephon.capture.lineage import conversation_digest, stamp_continuation
from zephon.capture.protocols import (
    CaptureAdmissionRefused,
    CaptureHistoryUnrepresentable,
    LineageResolution,
    SupportsBeginCall,
    SupportsEngineRefusal,
    SupportsFailCall,
    TokenCaptureFrozenError,
)
from zephon.capture.proxy._inference import InferenceAnswer, InferenceClient, InferenceUnavailable
from zephon.capture.proxy._limits import ClientRefused, decode_json
from zephon.capture.proxy._metrics import Metrics
from zephon.capture.proxy._pool import StoreClients
from zephon.capture.proxy._requests import (
    CHAIN_HEADER,
    VERSION_HEADER,
    BadRequest,
    Dialect,
    PreparedCall,
    prepare_call,
    weight_version_of,
)
from zephon.capture.proxy._responses import (
    CallTokens,
    output_items_of,
    served_answer,
    served_id,
    token_item_index,
)
from zephon.capture.proxy._spill import SpilledMark, SpillJournal
from zephon.capture.proxy._tokens import TokenDataError, extract_generation, prompt_ids_of
from zephon.capture.records import (
    GROUP_FIELD,
    ParentResolutionStatus,
    SampleGroup,
    TokenEntry,
    compute_digest,
)

__all__ = ["CallResult", "CaptureService", "refusal_code"]

log = logging.getLogger("zephon.capture.proxy")

_CONTEXT_MARKERS = ("maximum context length", "context length", "context_length", "too long")


@dataclass
class CallResult:
    """What the HTTP layer sends: a status, a JSON body (or raw bytes) and headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None
    content_type: str = "application/json"
    call: PreparedCall | None = None

    @property
    def stream(self) -> bool:
        return self.call is not None and self.call.stream and self.status == 200


def error_body(message: str, code: str, status: int) -> dict[str, Any]:
    """An OpenAI-style error object."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "code": code}}


def refusal_code(answer: InferenceAnswer) -> str:
    """A stable code for an engine's 4xx: ``context_length_exceeded`` or ``http_<status>``."""
    text = answer.body[:4096].decode("utf-8", "replace").lower()
    if answer.status in (400, 413, 422) and any(m in text for m in _CONTEXT_MARKERS):
        return "context_length_exceeded"
    return f"http_{answer.status}"


class CaptureService:
    """The serving path of one worker: a store client, an inference client and metrics."""

    def __init__(
        self,
        stores: StoreClients,
        inference: InferenceClient,
        metrics: Metrics,
        *,
        delta_prompts: bool = False,
        weight_version: int | None = None,
        spill: SpillJournal | None = None,
        max_json_depth: int = 128,
    ) -> None:
        self.max_json_depth = max_json_depth
        self.stores = stores
        self.inference = inference
        self.metrics = metrics
        self.delta_prompts = delta_prompts
        self.weight_version = weight_version
        self.spill = spill

    # -- entry point ---------------------------------------------------------------------------

    async def handle(
        self, rollout_id: str, dialect: Dialect, raw: bytes, headers: dict[str, str]
    ) -> CallResult:
        try:
            body = decode_json(raw, self.max_json_depth) if raw else None
        except ClientRefused as exc:
            return self._bad(BadRequest(exc.message, code=exc.code))
        try:
            call = prepare_call(dialect, body, headers.get(CHAIN_HEADER))
            weight_version_of(headers.get(VERSION_HEADER), None)  # refused before the engine
            conversation_digest(call.request_items)  # refuse unhashable history up front
        except BadRequest as exc:
            return self._bad(exc)
        except CaptureHistoryUnrepresentable as exc:
            message = f"request history cannot be captured: {exc}"
            return self._bad(BadRequest(message, code="history_unrepresentable"))
        except ValueError as exc:
            return self._bad(BadRequest(f"the request cannot be captured: {exc}"))
        call_id = uuid.uuid4().hex
        # Shield: a client disconnect must not cancel a call between intent and entry.
        task = asyncio.ensure_future(self._capture(rollout_id, call, call_id, headers))
        return await asyncio.shield(task)

    def _bad(self, exc: BadRequest) -> CallResult:
        return CallResult(exc.status, error_body(exc.message, exc.code, exc.status))

    # -- the call ------------------------------------------------------------------------------

    async def _resolve(self, rollout_id: str, call: PreparedCall) -> LineageResolution:
        try:
            store = self.stores.of(rollout_id)
            res: LineageResolution = await store.resolve(rollout_id, call.resolve_items)
        except Exception as exc:  # a lookup failure is a safe UNRESOLVED, never a guess
            log.warning("lineage lookup failed for rollout %s: %r", rollout_id, exc)
            res = LineageResolution(ParentResolutionStatus.UNRESOLVED, reason="lookup_error")
        self.metrics.inc("zephon_proxy_parent_resolution_total", status=res.status.value)
        return res

    async def _begin(self, rollout_id: str, call_id: str) -> tuple[int, str, str] | None:
        """Record the pre-dispatch intent; (status, code, message) when the call must fail."""
        store = self.stores.of(rollout_id)
        if not isinstance(store, SupportsBeginCall):
            return None
        try:
            await store.begin_call(rollout_id, call_id)
        except (TokenCaptureFrozenError, CaptureAdmissionRefused) as exc:
            kind = type(exc).__name__
            msg = f"rollout {rollout_id!r} admits no new model calls ({kind}: {exc})"
            return 409, "capture_refused", msg
        except Exception as exc:
            log.error("begin_call failed for %s/%s: %r", rollout_id, call_id, exc)
            msg = f"capture store unavailable, model call not dispatched: {exc}"
            return 503, "capture_store_unavailable", msg
        return None

    async def _capture(
        self, rollout_id: str, call: PreparedCall, call_id: str, headers: dict[str, str]
    ) -> CallResult:
        started = time.perf_counter()
        ids = member_ids(call_id, call.n)
        # Resolution reads committed entries, the intents are separate records: neither waits
        # for the other, and both complete before the engine is called.
        resolving = asyncio.ensure_future(self._resolve(rollout_id, call))
        admitted = await self._begin_all(rollout_id, ids)
        res = await resolving
        hdrs = _call_headers(call_id, ids, res)
        if admitted is not None:  # nothing was dispatched
            status, code, msg = admitted
            hdrs["x-zephon-capture"] = "not_sent"
            if status == 503:
                hdrs["retry-after"] = "1"
            return CallResult(status, error_body(msg, code, status), hdrs)
        engine_started = time.perf_counter()
        try:
            answer = await self.inference.post_json(
                call.engine_path, call.engine_body, _auth(headers)
            )
        except InferenceUnavailable as exc:
            return await self._unavailable(rollout_id, ids, res, exc, hdrs)
        finally:
            self.metrics.observe(
                "zephon_proxy_engine_seconds", time.perf_counter() - engine_started
            )
        hdrs["x-should-retry"] = "false"  # the engine answered: a replay would generate again
        if 400 <= answer.status < 500:
            for cid in ids:
                await self._refusal(rollout_id, cid, res, answer)
            hdrs["x-zephon-capture"] = "refused"
            return CallResult(answer.status, None, hdrs, answer.body, answer.content_type)
        if answer.status != 200:
            hdrs["x-zephon-capture"] = await self._fail_all(
                rollout_id, ids, f"engine_http_{answer.status}"
            )
            return CallResult(answer.status, None, hdrs, answer.body, answer.content_type)
        try:
            data = answer.json()
            if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
                raise TokenDataError("engine answer is not a completion object")
            items = [output_items_of(data, call, cid, i) for i, cid in enumerate(ids)]
        except _BAD_ANSWER as exc:
            hdrs["x-zephon-capture"] = await self._fail_all(rollout_id, ids, "engine_bad_answer")
            msg = f"engine returned an unusable answer: {exc}"
            return CallResult(502, error_body(msg, "engine_bad_answer", 502), hdrs)
        del hdrs["x-should-retry"]
        tokens: list[CallTokens | None] = []
        outcomes: list[str] = []
        for i, cid in enumerate(ids):
            got, outcome = await self._commit(
                rollout_id, call, cid, res, data, items[i], headers, _member(call_id, i, call.n)
            )
            tokens.append(got)
            outcomes.append(outcome)
        hdrs["x-zephon-capture"] = ",".join(dict.fromkeys(outcomes))
        served = served_answer(data, call, call_id, items[0], tokens)
        self.metrics.observe("zephon_proxy_capture_seconds", time.perf_counter() - started)
        return CallResult(200, served, hdrs, call=call)

    async def _begin_all(self, rollout_id: str, ids: list[str]) -> tuple[int, str, str] | None:
        """Every sample's intent, or the error to answer (settling the intents already taken:
        nothing was dispatched)."""
        for k, cid in enumerate(ids):
            failed = await self._begin(rollout_id, cid)
            if failed is not None:
                for earlier in ids[:k]:
                    await self._settle_unsent(rollout_id, earlier, None, "not_dispatched")
                return failed
        return None

    async def _unavailable(
        self,
        rollout_id: str,
        ids: list[str],
        res: LineageResolution,
        exc: InferenceUnavailable,
        hdrs: dict[str, str],
    ) -> CallResult:
        """No answer from the engine. Refused at connect: nothing was sent, so the intents are
        settled as engine refusals (nothing is masked) and the client may simply retry.
        Otherwise the engine may have generated: the rollout is marked incomplete."""
        if exc.kind == "refused":
            for cid in ids:
                await self._settle_unsent(rollout_id, cid, res, "engine_unreachable")
            hdrs.update({"x-zephon-capture": "not_sent", "retry-after": "1"})
            hdrs["x-should-retry"] = "true"
            return CallResult(503, error_body(str(exc), "engine_unavailable", 503), hdrs)
        hdrs["x-zephon-capture"] = await self._fail_all(rollout_id, ids, f"engine_{exc.kind}")
        hdrs["x-should-retry"] = "false"
        status = 504 if exc.kind == "timeout" else 502
        return CallResult(status, error_body(str(exc), f"engine_{exc.kind}", status), hdrs)

    async def _fail_all(self, rollout_id: str, ids: list[str], reason: str) -> str:
        outcomes = [await self._fail(rollout_id, cid, reason) for cid in ids]
        return ",".join(dict.fromkeys(outcomes))

    async def _commit(
        self,
        rollout_id: str,
        call: PreparedCall,
        call_id: str,
        res: LineageResolution,
        data: dict[str, Any],
        items: list[dict[str, Any]],
        headers: dict[str, str],
        group: SampleGroup | None = None,
    ) -> tuple[CallTokens | None, str]:
        """Build and put the entry; returns (tokens or None, capture outcome header)."""
        chat = call.engine_dialect == "chat"
        index = group.index if group is not None else 0
        try:
            gen = extract_generation(data, chat=chat, index=index, n=call.n)
            prompt = prompt_ids_of(data, chat=chat, index=index, n=call.n)
            if prompt is None:
                prompt = await self._tokenize(call, headers)
            full = [*prompt, *gen.token_ids]
            stored, delta = self._stored_prompt(prompt, res)
            entry = TokenEntry(
                rollout_id=rollout_id,
                model_call_id=call_id,
                model=str(data.get("model") or call.body.get("model") or ""),
                prompt_token_ids=stored,
                prompt_is_delta=delta,
                generation_token_ids=gen.token_ids,
                generation_log_probs=gen.log_probs,
                output_items=items,
                token_item_index=token_item_index(items),
                response_id=served_id(data, call, call_id),
                created_at=time.time(),
                parent_call_id=res.match.model_call_id if res.match is not None else None,
                cum_len=len(full),
                digest=compute_digest(full),
                parent_resolution=res.status,
                parent_resolution_reason=res.reason,
                weight_version=weight_version_of(headers.get(VERSION_HEADER), self.weight_version),
            )
            if group is not None:
                entry = entry.with_extra_fields(**{GROUP_FIELD: group.to_wire()})
            entry = stamp_continuation(entry, call.request_items)
        except Exception as exc:
            log.warning("capture of %s/%s failed: %r", rollout_id, call_id, exc)
            return None, await self._fail(rollout_id, call_id, "token_data")
        return (prompt, gen.token_ids, gen.log_probs), await self._put(entry)

    async def _put(self, entry: TokenEntry) -> str:
        """``put`` the entry: the capture outcome (``committed``, ``late`` or ``incomplete``)."""
        rollout_id, call_id = entry.rollout_id, entry.model_call_id
        put_started = time.perf_counter()
        try:
            await self.stores.of(rollout_id).put(entry)
        except TokenCaptureFrozenError:
            # Late write after freeze/retire: drop it, do not mark (the freeze already judged).
            self.metrics.inc("zephon_proxy_capture_failures_total", reason="late_after_freeze")
            return "late"
        except Exception as exc:
            log.error("put of %s/%s failed: %r", rollout_id, call_id, exc)
            return await self._fail(rollout_id, call_id, "put_error")
        finally:
            self.metrics.observe("zephon_proxy_put_seconds", time.perf_counter() - put_started)
        return "committed"

    def _stored_prompt(self, prompt: list[int], res: LineageResolution) -> tuple[list[int], bool]:
        """The prompt to store: only the suffix after the parent's tokens when delta prompts
        are on and the prompt really extends them (else the full prompt, a safe anchor)."""
        if not self.delta_prompts or res.match is None:
            return prompt, False
        parent = res.match.cumulative_token_ids
        n = len(parent)
        if 0 < n <= len(prompt) and tuple(prompt[:n]) == parent:
            return prompt[n:], True
        return prompt, False

    async def _tokenize(self, call: PreparedCall, headers: dict[str, str]) -> list[int]:
        """The prompt ids from the engine's ``/tokenize`` (engines without prompt ids)."""
        body = call.engine_body
        payload: dict[str, Any] = {"model": body.get("model")}
        if call.engine_dialect == "chat":
            payload["messages"] = body["messages"]
            payload["add_generation_prompt"] = True
            for key in ("tools", "chat_template", "chat_template_kwargs"):
                if body.get(key) is not None:
                    payload[key] = body[key]
        else:
            payload["prompt"] = body["prompt"]
        answer = await self.inference.post_json("/tokenize", payload, _auth(headers))
        if answer.status != 200:
            raise TokenDataError(
                f"engine gave no prompt ids and /tokenize answered HTTP {answer.status}"
            )
        tokens = answer.json().get("tokens")
        if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
            raise TokenDataError("/tokenize answer has no list of token ids under 'tokens'")
        return tokens

    # -- failure paths -------------------------------------------------------------------------

    async def _mark(self, rollout_id: str, call_id: str) -> None:
        """The durable loss signal: ``fail_call`` where supported (refused once frozen)."""
        store = self.stores.of(rollout_id)
        if isinstance(store, SupportsFailCall):
            await store.fail_call(rollout_id, call_id)
        else:
            await store.mark_incomplete(rollout_id, call_id)

    async def _fail(self, rollout_id: str, call_id: str, reason: str) -> str:
        """Mark the rollout incomplete unless it is frozen; the capture outcome header value.

        When the store cannot take the mark, it goes to the local spill journal (replayed
        later); only if that fails too is the loss merely logged (the silent-loss case).
        """
        self.metrics.inc("zephon_proxy_capture_failures_total", reason=reason)
        try:
            await self._mark(rollout_id, call_id)
        except TokenCaptureFrozenError:
            # Frozen or retired: the freeze already judged this call from its intent; a mark
            # now would change the consumed snapshot and break its retirement.
            self.metrics.inc("zephon_proxy_capture_failures_total", reason="late_after_freeze")
            return "late"
        except Exception as exc:
            self._spill(rollout_id, call_id, reason, exc)
        return "incomplete"

    def _spill(self, rollout_id: str, call_id: str, reason: str, exc: Exception) -> None:
        try:
            if self.spill is None:
                raise RuntimeError("no spill journal configured")
            self.spill.append(SpilledMark(rollout_id, call_id, reason))
        except Exception as spill_exc:
            self.metrics.inc("zephon_proxy_capture_failures_total", reason="mark_failed")
            log.critical(
                "capture of %s/%s failed (%s) AND mark_incomplete failed: %r, and the spill "
                "journal failed: %r; the rollout's dangling intent still masks it at freeze",
                rollout_id,
                call_id,
                reason,
                exc,
                spill_exc,
            )
            return
        self.metrics.inc("zephon_proxy_capture_failures_total", reason="mark_spilled")
        log.error(
            "mark_incomplete of %s/%s failed (%r); spilled to %s for replay",
            rollout_id,
            call_id,
            exc,
            self.spill.path,
        )

    async def replay_spill(self) -> int:
        """Send the spilled marks to the store; returns how many are still waiting."""
        if self.spill is None:
            return 0

        async def send(mark: SpilledMark) -> bool:
            try:
                await self._mark(mark.rollout_id, mark.call_id)
            except TokenCaptureFrozenError:
                return True  # judged by its freeze already
            except Exception as exc:
                log.warning("spilled mark of %s still waits: %r", mark.rollout_id, exc)
                return False
            return True

        return await self.spill.replay(send)

    async def _refusal(
        self, rollout_id: str, call_id: str, res: LineageResolution, answer: InferenceAnswer
    ) -> None:
        await self._settle_unsent(rollout_id, call_id, res, refusal_code(answer))

    async def _settle_unsent(
        self, rollout_id: str, call_id: str, res: LineageResolution | None, code: str
    ) -> None:
        """Record that the call generated nothing (the engine refused it, or it was never
        sent), which resolves its intent; the rollout is marked only if that record fails."""
        if res is None:
            res = LineageResolution(ParentResolutionStatus.ROOT)
        self.metrics.inc("zephon_proxy_engine_refusals_total", code=code)
        store = self.stores.of(rollout_id)
        if not isinstance(store, SupportsEngineRefusal):
            await self._fail(rollout_id, call_id, "engine_refusal_unrecorded")
            return
        try:
            await store.record_engine_refusal(
                rollout_id,
                model_call_id=call_id,
                code=code,
                parent_call_id=res.match.model_call_id if res.match is not None else None,
                parent_resolution=res.status,
            )
        except TokenCaptureFrozenError:
            return
        except Exception as exc:
            log.error("record_engine_refusal %s/%s failed: %r", rollout_id, call_id, exc)
            await self._fail(rollout_id, call_id, "refusal_unrecorded")


_BAD_ANSWER = (
    msgspec.DecodeError,
    RecursionError,
    TokenDataError,
    AttributeError,
    KeyError,
    TypeError,
)
_RETRYABLE = frozenset({"engine_unavailable", "capture_store_unavailable", "proxy_busy"})


def should_retry(body: Any, status: int) -> dict[str, str]:
    """The ``x-should-retry`` header of a proxy error: ``true`` only where nothing was
    generated and a replay is safe (engine unreachable, store unavailable before dispatch,
    worker busy); ``false`` otherwise, so clients that retry 409 and 5xx by default (the
    ``openai`` client does) do not replay an answer the proxy gave on purpose."""
    code = body.get("error", {}).get("code") if isinstance(body, dict) else None
    return {"x-should-retry": "true" if status >= 500 and code in _RETRYABLE else "false"}


def member_ids(call_id: str, n: int) -> list[str]:
    """The model call ids of a request's samples: the call id itself, or ``<id>-<k>``."""
    return [call_id] if n == 1 else [f"{call_id}-{k}" for k in range(n)]


def _member(call_id: str, index: int, n: int) -> SampleGroup | None:
    return SampleGroup(call_id, index, n) if n > 1 else None


def _call_headers(call_id: str, ids: list[str], res: LineageResolution) -> dict[str, str]:
    hdrs = {
        "x-zephon-model-call-id": call_id,
        "x-zephon-parent-resolution": res.status.value,
        "x-zephon-worker": str(os.getpid()),
    }
    if len(ids) > 1:
        hdrs["x-zephon-group-id"] = call_id
        hdrs["x-zephon-model-call-ids"] = ",".join(ids)
    if res.match is not None:
        hdrs["x-zephon-parent-call-id"] = res.match.model_call_id
    if res.reason:
        hdrs["x-zephon-parent-resolution-reason"] = res.reason
    return hdrs


def _auth(headers: dict[str, str]) -> dict[str, bytes]:
    """The client's credentials for the engine (an engine may require an API key), as the
    bytes the client sent (a header value need not be ASCII)."""
    value = headers.get("authorization")
    return {"authorization": value.encode("latin-1")} if value else {}
