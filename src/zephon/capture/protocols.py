"""Token capture interfaces: sink, source, lineage resolver, ledger and their errors.

The serving path awaits :meth:`TokenSink.put` before it answers the model request; consumers read
through :meth:`TokenSource.freeze` and retire exactly the snapshot they consumed. This module
imports nothing heavy (no FastAPI, Ray, torch or aiohttp) so any transport can implement it.

Optional extensions are separate protocols (``SupportsBeginCall`` ...) because a transport may
lack them; check with ``isinstance(obj, SupportsBeginCall)`` (they are runtime-checkable).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from zephon.capture.ledger import MemberRef, PromptMember, PromptRow, PromptState, StreamLedger
from zephon.capture.records import (
    CaptureLedgerCommit,
    ParentResolutionStatus,
    RolloutRemoval,
    TokenCaptureSnapshot,
    TokenEntry,
)
from zephon.capture.scores import RolloutScore
from zephon.errors import ZephonError

__all__ = [
    "CaptureAdmissionRefused",
    "CaptureConflictError",
    "CaptureHistoryUnrepresentable",
    "CaptureLedger",
    "CaptureOrderError",
    "CaptureStore",
    "LineageMatch",
    "LineageResolution",
    "LineageResolver",
    "PromptLedger",
    "RolloutRetiredError",
    "SupportsBeginCall",
    "SupportsCloseAdmissions",
    "SupportsEngineRefusal",
    "SupportsFailCall",
    "SupportsPeek",
    "SupportsRefuseCall",
    "SupportsScores",
    "TokenCaptureFrozenError",
    "TokenCaptureRequestRefused",
    "TokenCaptureRetiredError",
    "TokenSink",
    "TokenSource",
]


# --------------------------------------------------------------------------- errors


class CaptureAdmissionRefused(ZephonError, ValueError):
    """The rollout's capture state cannot safely admit generation for this request.

    Raised before any compute is spent, e.g. admissions were closed for the rollout. Refuse the
    model request (a 4xx); retrying under the same rollout id will be refused again.
    """


TokenCaptureRequestRefused = CaptureAdmissionRefused
"""Alias under the name the reference records for this error."""


class CaptureConflictError(ZephonError, ValueError):
    """A call id (or a verifier's score) was written again with different data.

    The first write stands and the store records the conflict durably (the rollout is now
    incomplete, or its ledger has a failure row) before raising. A retry must resend the
    identical record, timestamps included.
    """


class CaptureOrderError(ZephonError, ValueError):
    """A write came before the one it follows (a call refused before its intent was begun, a
    score before any entry was put); nothing was changed. Make the earlier write first."""


class CaptureHistoryUnrepresentable(ZephonError, ValueError):
    """The request's history is something capture cannot record (e.g. rewritten model turns)."""


class TokenCaptureFrozenError(ZephonError, RuntimeError):
    """A write arrived after its rollout's capture was frozen.

    The caller drops the late record and must NOT mark the rollout incomplete: completeness was
    judged at freeze time from the durable intents, and a later mark would change a snapshot that
    was already handed out, so its conditional retirement would fail.
    """


class TokenCaptureRetiredError(TokenCaptureFrozenError):
    """A write arrived after its rollout was retired; handle exactly like the frozen error.

    A retired rollout stays fenced until ``delete``. Typical writers are an abandoned attempt that
    keeps running and a duplicate execution of a finished rollout.
    """


class RolloutRetiredError(ZephonError, LookupError):
    """A read of a retired rollout (its records are gone; an empty answer would be a lie).

    ``delete`` removes the fence, after which the id reads as unused again.
    """


# --------------------------------------------------------------------------- lineage values


@dataclass(frozen=True, slots=True)
class LineageMatch:
    """A uniquely verified parent: its call id, exact cumulative tokens and their digest."""

    model_call_id: str
    cumulative_token_ids: tuple[int, ...]
    digest: str
    staging_chain: tuple[str, ...] = ()
    prev_len: int = 0
    chain_hash: str = ""


@dataclass(frozen=True, slots=True)
class LineageResolution:
    """One immutable request-time parent decision; RESOLVED if and only if ``match`` is set."""

    status: ParentResolutionStatus
    match: LineageMatch | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if (self.status is ParentResolutionStatus.RESOLVED) != (self.match is not None):
            raise ValueError(
                f"LineageResolution.match must be set exactly when status is RESOLVED "
                f"(status={self.status.value}, match={'set' if self.match else 'None'})"
            )


# --------------------------------------------------------------------------- protocols


@runtime_checkable
class TokenSink(Protocol):
    """Receives captured entries. ``put`` returns only once the entry is durable and visible.

    Identical bytes for a known call id are a no-op; different bytes fail (and poison the
    rollout). Any write after freeze raises :class:`TokenCaptureFrozenError`, after retire
    :class:`TokenCaptureRetiredError`. ``mark_incomplete`` must work after freeze and move the
    version; it is the durable signal that a call was lost.
    """

    async def put(self, entry: TokenEntry) -> None: ...

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class SupportsBeginCall(Protocol):
    """Durable pre-dispatch intent; an intent with no entry at freeze masks the rollout."""

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None: ...


@runtime_checkable
class SupportsFailCall(Protocol):
    """Mark the rollout incomplete for an admitted call that failed, unless it is frozen.

    The serving path's variant of ``mark_incomplete``: after a freeze it raises
    :class:`TokenCaptureFrozenError` and changes nothing, because the freeze already judged the
    call from its durable intent and a late mark would stale the consumed snapshot.
    """

    async def fail_call(self, rollout_id: str, model_call_id: str) -> None: ...


@runtime_checkable
class SupportsEngineRefusal(Protocol):
    """Records that the engine refused a call before generating; resolves its intent."""

    async def record_engine_refusal(
        self,
        rollout_id: str,
        *,
        model_call_id: str,
        code: str,
        parent_call_id: str | None = None,
        parent_resolution: ParentResolutionStatus | str | None = None,
    ) -> None: ...


@runtime_checkable
class TokenSource(Protocol):
    """Where a trajectory builder freezes, reads and retires a rollout's records."""

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot: ...

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool: ...

    async def retire(self, rollout_ids: str | Sequence[str]) -> RolloutRemoval: ...

    async def delete(self, rollout_ids: str | Sequence[str]) -> RolloutRemoval: ...

    async def close(self) -> None: ...


@runtime_checkable
class LineageResolver(Protocol):
    """Read-only request-time parent resolution over committed entries; never guesses."""

    async def resolve(
        self, rollout_id: str, request_items: list[dict[str, Any]]
    ) -> LineageResolution: ...

    def is_process_shared(self) -> bool: ...

    async def close(self) -> None: ...


@runtime_checkable
class CaptureLedger(LineageResolver, Protocol):
    """Token-free per-rollout metadata for calls whose token data is staged elsewhere.

    After ``retire``, ``record``/``record_failure`` are discarded and ``manifest``/``has_rows``
    raise :class:`RolloutRetiredError`; ``delete`` removes rows and fence.
    """

    async def record(self, commit: CaptureLedgerCommit) -> None: ...

    async def record_failure(self, rollout_id: str, model_call_id: str, reason: str) -> None: ...

    async def manifest(self, rollout_id: str) -> dict[str, Any]: ...

    async def has_rows(self, rollout_id: str) -> bool: ...

    async def retire(self, rollout_ids: str | Sequence[str]) -> RolloutRemoval: ...

    async def delete(self, rollout_ids: str | Sequence[str]) -> RolloutRemoval: ...


@runtime_checkable
class SupportsCloseAdmissions(Protocol):
    """Ledger admission cut: returns the manifest; later ``begin_call`` is refused."""

    async def close_admissions(self, rollout_id: str) -> dict[str, Any]: ...


@runtime_checkable
class SupportsRefuseCall(Protocol):
    """Settles an intent after the worker acknowledged refusing the call before generating."""

    async def refuse_call(self, rollout_id: str, model_call_id: str) -> None: ...


@runtime_checkable
class SupportsPeek(Protocol):
    """A read-only view: the snapshot a freeze would show, without freezing or fencing."""

    async def peek(self, rollout_id: str) -> TokenCaptureSnapshot: ...


@runtime_checkable
class SupportsScores(Protocol):
    """Rewards attached to a captured rollout: validated, durable, read back by verifier.

    One score per (rollout, verifier): identical re-put no-op, different ``ValueError``; a
    rollout without entries is refused (``ValueError``), a retired one raises the retired
    errors (:class:`TokenCaptureRetiredError` on put, :class:`RolloutRetiredError` on read).
    """

    async def put_score(self, score: RolloutScore) -> None: ...

    async def scores(self, rollout_id: str) -> list[RolloutScore]: ...


@runtime_checkable
class PromptLedger(Protocol):
    """The in-flight ledger of RL streams (see :mod:`zephon.capture.ledger` for the rules).

    Every call is one atomic, durable transaction on the stream; a move that already happened
    is a no-op (False), a contradicting one raises
    :class:`~zephon.capture.ledger.LedgerTransitionError` and changes nothing.
    """

    async def issue_prompt(
        self,
        stream: str,
        position: int,
        *,
        prompt_key: str,
        payload: Any,
        n: int = 1,
        cursor: Any = None,
        weight_version: int = -1,
        started_at: float = 0.0,
    ) -> PromptRow: ...

    async def advance(
        self,
        stream: str,
        refs: Sequence[MemberRef],
        to: PromptState | str,
        *,
        step: int = -1,
        reason: str = "",
    ) -> bool: ...

    async def reissue(
        self, stream: str, ref: MemberRef, attempt: int, *, started_at: float = 0.0
    ) -> PromptMember: ...

    async def stream_ledger(self, stream: str) -> StreamLedger: ...


@runtime_checkable
class CaptureStore(
    TokenSink,
    TokenSource,
    CaptureLedger,
    SupportsBeginCall,
    SupportsEngineRefusal,
    SupportsFailCall,
    SupportsCloseAdmissions,
    SupportsRefuseCall,
    SupportsPeek,
    SupportsScores,
    PromptLedger,
    Protocol,
):
    """Everything a zephon store implements over one backend (what ``open_store`` returns)."""

    def describe(self) -> str: ...


T = TypeVar("T")


async def view_stream(store: PromptLedger, stream: str, view: Callable[[StreamLedger], T]) -> T:
    """``view`` of the stream's ledger: in place where the store can (``read_stream`` of the
    zephon stores: O(new moves) to bring it up to date), else on a copy of the whole ledger."""
    read = getattr(store, "read_stream", None)
    if read is not None:
        result: T = await read(stream, view)
        return result
    return view(await store.stream_ledger(stream))
