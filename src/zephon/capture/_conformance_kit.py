"""Building blocks of the conformance suite: errors, report, per-check context, test records.

Split from :mod:`zephon.capture.conformance` (the public entry point) to keep modules small.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from zephon.capture.lineage import assistant_fingerprint
from zephon.capture.protocols import TokenCaptureRetiredError
from zephon.capture.records import (
    FINGERPRINT_VERSION,
    CallRecord,
    CaptureLedgerCommit,
    TokenEntry,
    canonical_json,
)
from zephon.errors import ZephonError

Factory = Callable[[], Any]


class ConformanceError(ZephonError, AssertionError):
    """A transport broke a contract clause: ``check`` names it, ``detail`` says how."""

    def __init__(self, check: str, detail: str) -> None:
        super().__init__(f"conformance check {check!r} failed: {detail}")
        self.check = check
        self.detail = detail


class ConformanceWarning(UserWarning):
    """An optional check was skipped and the missing extension matters at run time."""


@dataclass(slots=True)
class CheckResult:
    name: str
    status: Literal["passed", "failed", "warned"]
    detail: str = ""
    seconds: float = 0.0


@dataclass(slots=True)
class ConformanceReport:
    """What ran: one result per check, in order."""

    results: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> list[str]:
        return [r.name for r in self.results if r.status == "passed"]

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def warnings(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "warned"]

    @property
    def ok(self) -> bool:
        return not self.failed


class _Skip(ZephonError):
    """Raised inside a check to skip it with a ConformanceWarning."""


# --------------------------------------------------------------------------- helpers


class _Ctx:
    def __init__(self, factories: dict[str, Factory | None], prefix: str) -> None:
        self.factories = factories
        self.prefix = prefix
        self.clients: list[Any] = []
        self.check = ""

    async def _new(self, kind: str) -> Any:
        factory = self.factories[kind]
        if factory is None:
            raise _Skip(f"no {kind}_factory given")
        client = factory()
        if inspect.isawaitable(client):
            client = await client
        self.clients.append(client)
        return client

    async def sink(self) -> Any:
        return await self._new("sink")

    async def source(self) -> Any:
        return await self._new("source")

    async def lineage(self) -> Any:
        return await self._new("lineage")

    async def ledger(self) -> Any:
        return await self._new("ledger")

    def rid(self, suffix: str = "") -> str:
        return f"{self.prefix}-{self.check.replace('_', '-')}{suffix}"

    def require(self, cond: bool, detail: str) -> None:
        if not cond:
            raise ConformanceError(self.check, detail)

    async def optional(self, kind: str, method: str, consequence: str) -> Any:
        client = await self._new(kind)
        if not callable(getattr(client, method, None)):
            raise _Skip(f"{kind} has no {method}(): {consequence}")
        return client

    async def raises(
        self, awaitable: Awaitable[Any], expected: type[BaseException], what: str
    ) -> BaseException:
        try:
            await awaitable
        except expected as exc:
            return exc
        except Exception as exc:
            raise ConformanceError(
                self.check,
                f"{what} raised {type(exc).__name__}: {exc}; expected {expected.__name__}",
            ) from exc
        raise ConformanceError(self.check, f"{what} succeeded; expected {expected.__name__}")

    async def close_all(self) -> None:
        for client in self.clients:
            close = getattr(client, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    result = close()
                    if inspect.isawaitable(result):
                        await result
        self.clients.clear()


def _entry(
    rollout_id: str, call_id: str, *, gen: tuple[int, ...] = (13, 14), **kw: Any
) -> TokenEntry:
    """A ROOT entry stamped like the capture path, byte-stable across rebuilds."""
    fields: dict[str, Any] = {
        "rollout_id": rollout_id,
        "model_call_id": call_id,
        "model": "conformance-model",
        "prompt_token_ids": [11, 12],
        "generation_token_ids": list(gen),
        "generation_log_probs": [-0.1] * len(gen),
        "routed_experts": [[[1, 2]], [[3, 4]]],
        "output_items": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "ok ☃"}],
            }
        ],
        "token_item_index": 0,
        "response_id": f"resp-{call_id}",
        "created_at": 1_700_000_000.25,
        "parent_resolution": "root",
        "x_conformance_extra": {"kept": [1, 2.5e22, None]},
    }
    fields.update(kw)
    return TokenEntry.from_dict(fields)


def _wire(entry: Any) -> bytes:
    if hasattr(entry, "to_dict"):
        return canonical_json(entry.to_dict())
    return canonical_json(entry.model_dump(mode="json"))


def _by_call(snapshot: Any) -> dict[str, bytes]:
    return {e.model_call_id: _wire(e) for e in snapshot.entries}


def sample_commit(
    rollout_id: str,
    call_id: str,
    *,
    request_items: list[dict[str, Any]] | None = None,
    response_items: list[dict[str, Any]] | None = None,
    weight_version: int = 1,
    resolvable: bool = False,
) -> CaptureLedgerCommit:
    """A valid root ledger row; ``resolvable`` stamps the continuation fingerprint of its
    request and response so a continuation can resolve to it."""
    request = request_items if request_items is not None else [{"role": "user", "content": "hi"}]
    response = (
        [{"role": "assistant", "content": "ok"}] if response_items is None else response_items
    )
    record = CallRecord(
        model_call_id=call_id,
        prev_len=0,
        delta_len=4,
        cum_len=4,
        weight_version=weight_version,
        digest="1" * 64,
        extras_digest="2" * 64,
        staging_key=f"stage/{rollout_id}/{call_id}",
        mode="text",
        chain_hash="3" * 64,
        cumulative_hash="4" * 64,
        response_id=f"resp-{call_id}",
        continuation_fingerprint=(
            assistant_fingerprint([*request, *response]) if resolvable else None
        ),
        fingerprint_version=FINGERPRINT_VERSION if resolvable else 0,
    )
    return CaptureLedgerCommit(
        rollout_id=rollout_id,
        record=record,
        staging_chain=(record.staging_key,),
        request_items=request,
        response_items=response,
    )


async def _freeze(ctx: _Ctx, rid: str) -> Any:
    return await (await ctx.source()).freeze(rid)


async def _require_fenced(ctx: _Ctx, rid: str, what: str) -> None:
    """Writes to a retired rollout raise TokenCaptureRetiredError."""
    sink = await ctx.sink()
    await ctx.raises(sink.put(_entry(rid, "late")), TokenCaptureRetiredError, f"put after {what}")
    await ctx.raises(
        (await ctx.sink()).mark_incomplete(rid, "late"),
        TokenCaptureRetiredError,
        f"mark_incomplete after {what}",
    )


# --------------------------------------------------------------------------- checks

CheckFn = Callable[[_Ctx], Awaitable[None]]
CHECKS: dict[str, CheckFn] = {}


def _check(fn: CheckFn) -> CheckFn:
    CHECKS[fn.__name__.removeprefix("_check_")] = fn
    return fn
