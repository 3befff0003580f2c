"""The async store surface shared by every built-in store, and the base of a new one.

A store supplies five blocking primitives, each atomic for one rollout or stream (under a lock
or inside one transaction); the public home of this contract is
:mod:`zephon.capture.stores.base`:

* :meth:`DurableStore.transact_rollout` - load the rollout's state, let the pure state machine
  of :mod:`._state` decide, persist the decided events durably, apply them, and return
  ``then(state, transition)`` (or raise the decision's error only AFTER persisting, so a
  conflict's poisoning sticks even though the call fails);
* :meth:`DurableStore.freeze_rollout` - the same for ``freeze`` plus reading the snapshot's
  payloads;
* :meth:`DurableStore.peek_rollout` - the snapshot as it is now, without writing;
* :meth:`DurableStore.fetch_lineage` - the ``{call_id: key}`` map and selected entries, for
  the incremental parent resolver of :mod:`zephon.capture.lineage`;
* :meth:`DurableStore.transact_stream` - the same as ``transact_rollout`` for one RL
  stream's prompt ledger (:mod:`zephon.capture.ledger`): kept as one JSON value per stream
  (:func:`decide_stream`), or as a log of deltas like the file and SQL stores
  (:mod:`._streamlog`).

Everything else (argument checks, batches of capture keys, the async wrapping) lives here
once. Blocking work runs in a dedicated thread pool (``offload="thread"``, the default: the
event loop of a serving process keeps answering while a put waits for fsync) or directly on
the loop (``offload="inline"``: lowest latency for a single caller, see docs/capture-stores.md).
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

import msgspec

from zephon.capture.ledger import (
    MemberRef,
    PromptMember,
    PromptRow,
    PromptState,
    StreamLedger,
    validate_stream,
)
from zephon.capture.lineage import (
    IncrementalResolver,
    has_model_authored_item,
    resolve_from_ledger,
)
from zephon.capture.protocols import LineageResolution
from zephon.capture.records import (
    CaptureLedgerCommit,
    EngineRefusalRecord,
    ParentResolutionStatus,
    RolloutManifest,
    RolloutRemoval,
    TokenCaptureSnapshot,
    TokenEntry,
    validate_capture_keys,
    validate_rollout_id,
)
from zephon.capture.scores import RolloutScore
from zephon.capture.stores._admit import admit_entry
from zephon.capture.stores._state import RolloutState, Transition

__all__ = [
    "Decide",
    "DurableStore",
    "Offload",
    "StreamOp",
    "Then",
    "decide_stream",
    "parse_offload",
    "transition_result",
]

T = TypeVar("T")
R = TypeVar("R")
Offload = Literal["thread", "inline"]
Decide = Callable[[RolloutState], Transition[Any]]

_EXECUTOR: ThreadPoolExecutor | None = None
_EXECUTOR_PID = 0
_EXECUTOR_LOCK = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    """One pool per process for all stores (recreated after fork), separate from the default."""
    global _EXECUTOR, _EXECUTOR_PID
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None or os.getpid() != _EXECUTOR_PID:
            _EXECUTOR = ThreadPoolExecutor(
                max_workers=int(os.environ.get("ZEPHON_CAPTURE_IO_THREADS", "16")),
                thread_name_prefix="zephon-capture-io",
            )
            _EXECUTOR_PID = os.getpid()
        return _EXECUTOR


def parse_offload(value: str | None, url: str) -> Offload:
    if value in (None, "", "thread"):
        return "thread"
    if value == "inline":
        return "inline"
    raise ValueError(f"capture store URL {url!r}: offload must be 'thread' or 'inline'")


StreamOp = Callable[[StreamLedger], Any]


Then = Callable[[RolloutState, Transition[Any]], Any]


def transition_result(state: RolloutState, t: Transition[Any]) -> Any:
    """The default ``then`` of :meth:`DurableStore.transact_rollout`: the decision's result."""
    return t.result


def _member_ref(ref: Any) -> MemberRef:
    """``ref`` as a tuple of 2 or 3 ints, or a ValueError saying what a ref is."""
    if not isinstance(ref, tuple | list) or len(ref) not in (2, 3):
        raise ValueError(
            f"member ref {ref!r} is invalid: use (position, member) or (position, member, attempt)"
        )
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in ref):
        raise ValueError(f"member ref {ref!r} is invalid: its parts must be integers")
    return tuple(ref)  # type: ignore[return-value]


def decide_stream(stream: str, stored: bytes | None, op: StreamOp) -> tuple[bytes | None, Any]:
    """Run ``op`` on the stored ledger (or an empty one): ``(bytes to store or None when
    nothing changed, op's result)``. An error of ``op`` propagates before anything is stored."""
    ledger = StreamLedger.from_json(stored) if stored else StreamLedger(stream=stream)
    before = stored or b""
    result = op(ledger)
    after = ledger.to_json()
    return (None if after == before or (not stored and not ledger.prompts) else after), result


class DurableStore:
    """Sink, source, ledger and lineage view over three blocking primitives (see module doc)."""

    kind = "durable"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a subclass that defines a name private to this class (it would silently
        replace the plumbing) or a primitive under its old underscore name."""
        super().__init_subclass__(**kwargs)
        own = [n for n in vars(cls) if n in _PRIVATE]
        if own:
            raise TypeError(
                f"{cls.__qualname__} defines {own}, private to DurableStore: rename them (a "
                "store implements the public primitives transact_rollout, freeze_rollout, ...)"
            )
        old = [f"{n} (now {_RENAMED[n]})" for n in vars(cls) if n in _RENAMED]
        if old:
            raise TypeError(f"{cls.__qualname__} defines renamed primitives: {', '.join(old)}")

    def __init__(self, *, offload: Offload = "thread") -> None:
        self._offload: Offload = offload
        self._closed = False
        self._resolver: IncrementalResolver | None = None

    # -- primitives implemented by each store -----------------------------------------------

    def transact_rollout(
        self,
        rollout_id: str,
        decide: Decide,
        then: Then = transition_result,
        *,
        write: bool = True,
    ) -> Any:
        """Atomically for ``rollout_id``: load its state (:meth:`RolloutState.empty` when
        there is none), call ``decide(state)``, persist the transition's events durably and
        apply them (``state.apply_all``), then raise ``transition.error`` if any - only after
        persisting - or return ``then(state, transition)``. With ``write=False`` it is a read:
        events decided then are a bug (raise ``AssertionError``), never persisted."""
        raise self._missing("transact_rollout")

    def freeze_rollout(self, rollout_id: str, snapshot_id: str) -> TokenCaptureSnapshot:
        """:meth:`transact_rollout` of ``state.freeze(snapshot_id)`` and, in the same atomic
        step, ``state.snapshot(entries)`` of the stored payloads (in ``state.entry_keys``
        order)."""
        raise self._missing("freeze_rollout")

    def peek_rollout(self, rollout_id: str) -> TokenCaptureSnapshot | None:
        """The snapshot a freeze would show now, read without writing anything; None for a
        rollout id without any state; the retired error for a retired one."""
        raise self._missing("peek_rollout")

    def fetch_lineage(
        self, rollout_id: str, select: Callable[[Mapping[str, str]], Iterable[str]]
    ) -> tuple[Mapping[str, str], Sequence[TokenEntry]]:
        """Under the rollout's read lock: the ``{call_id: entry key}`` map and the entries of
        the call ids ``select(map)`` picks (see :data:`zephon.capture.lineage.EntryFetch`)."""
        raise self._missing("fetch_lineage")

    def transact_stream(self, stream: str, op: StreamOp, *, write: bool = True) -> Any:
        """Under the stream's lock (exclusive for writes): load its ledger bytes, run
        :func:`decide_stream`, store the new bytes durably when there are any, return the
        result (a read must not change the ledger)."""
        raise self._missing("transact_stream")

    def close_backend(self) -> None:
        """Release connections or handles (called once, by ``close``; optional)."""

    def describe(self) -> str:
        """The store in words, for error messages (``kind`` unless overridden)."""
        return self.kind

    def _missing(self, primitive: str) -> NotImplementedError:
        return NotImplementedError(
            f"{type(self).__name__} does not implement {primitive}, a primitive every "
            "zephon.capture.stores.base.DurableStore subclass defines (see docs/capture-stores.md)"
        )

    # -- plumbing ---------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., R], *args: Any) -> R:
        if self._closed:
            raise RuntimeError(f"{self.describe()} capture store client is closed")
        if self._offload == "inline":
            return fn(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_executor(), functools.partial(fn, *args))

    async def _decide(
        self,
        rollout_id: str,
        decide: Decide,
        then: Then = transition_result,
        *,
        write: bool = True,
    ) -> Any:
        validate_rollout_id(rollout_id)
        return await self._run(
            functools.partial(self.transact_rollout, rollout_id, decide, then, write=write)
        )

    # -- sink -------------------------------------------------------------------------------

    async def put(self, entry: TokenEntry) -> None:
        canonical = admit_entry(entry)
        call_id = entry.model_call_id
        await self._decide(entry.rollout_id, lambda s: s.put(call_id, canonical))

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        await self._decide(rollout_id, lambda s: s.mark_incomplete(model_call_id))

    async def fail_call(self, rollout_id: str, model_call_id: str) -> None:
        await self._decide(rollout_id, lambda s: s.fail_call(model_call_id))

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        if not model_call_id:
            raise ValueError("begin_call needs a non-empty model_call_id")
        await self._decide(rollout_id, lambda s: s.begin_call(model_call_id))

    async def record_engine_refusal(
        self,
        rollout_id: str,
        *,
        model_call_id: str,
        code: str,
        parent_call_id: str | None = None,
        parent_resolution: ParentResolutionStatus | str | None = None,
    ) -> None:
        record = EngineRefusalRecord.of(
            model_call_id=model_call_id,
            code=code,
            parent_call_id=parent_call_id,
            parent_resolution=parent_resolution,
        )
        await self._decide(rollout_id, lambda s: s.record_engine_refusal(record))

    # -- source -----------------------------------------------------------------------------

    async def freeze(self, rollout_id: str) -> TokenCaptureSnapshot:
        validate_rollout_id(rollout_id)
        return await self._run(self.freeze_rollout, rollout_id, uuid.uuid4().hex)

    async def peek(self, rollout_id: str) -> TokenCaptureSnapshot:
        """Read the rollout as a freeze would show it, without freezing or fencing it.

        Until a freeze, ``snapshot_id`` is empty and ``version`` moves with every write. A
        rollout id nobody wrote raises :class:`LookupError` (and stays unused).
        """
        validate_rollout_id(rollout_id)
        snap = await self._run(self.peek_rollout, rollout_id)
        if snap is None:
            raise LookupError(f"no rollout {rollout_id!r} in {self.describe()}")
        return snap

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        result: bool = await self._decide(rollout_id, lambda s: s.drop(snapshot_id, version))
        return result

    async def _remove(
        self, rollout_ids: str | Sequence[str], action: Literal["retire", "delete"]
    ) -> RolloutRemoval:
        keys = validate_capture_keys(rollout_ids)
        changed = []
        for key in keys:
            if await self._run(self.remove_rollout, key, action):
                changed.append(key)
        return RolloutRemoval(action=action, capture_keys=tuple(keys), changed=tuple(changed))

    def remove_rollout(self, rollout_id: str, action: Literal["retire", "delete"]) -> bool:
        """Blocking retire or delete of one rollout (optional primitive). A store that can
        detect damage overrides this so that both still work on a damaged rollout: they are
        how an operator clears it."""
        return bool(
            self.transact_rollout(
                rollout_id, lambda s: s.retire() if action == "retire" else s.delete()
            )
        )

    async def retire(self, rollout_ids: str | Sequence[str]) -> RolloutRemoval:
        return await self._remove(rollout_ids, "retire")

    async def delete(self, rollout_ids: str | Sequence[str]) -> RolloutRemoval:
        return await self._remove(rollout_ids, "delete")

    # -- ledger -----------------------------------------------------------------------------

    async def record(self, commit: CaptureLedgerCommit) -> None:
        await self._decide(commit.rollout_id, lambda s: s.ledger_record(commit))

    async def record_failure(self, rollout_id: str, model_call_id: str, reason: str) -> None:
        await self._decide(rollout_id, lambda s: s.ledger_record_failure(model_call_id, reason))

    async def manifest(self, rollout_id: str) -> dict[str, Any]:
        manifest: RolloutManifest = await self._decide(
            rollout_id, lambda s: s.read_manifest(), write=False
        )
        return manifest.to_wire()

    async def has_rows(self, rollout_id: str) -> bool:
        result: bool = await self._decide(rollout_id, lambda s: s.read_has_rows(), write=False)
        return result

    async def close_admissions(self, rollout_id: str) -> dict[str, Any]:
        wire: dict[str, Any] = await self._decide(
            rollout_id, lambda s: s.close_admissions(), lambda s, _t: s.manifest().to_wire()
        )
        return wire

    async def refuse_call(self, rollout_id: str, model_call_id: str) -> None:
        await self._decide(rollout_id, lambda s: s.refuse_call(model_call_id))

    # -- scores ---------------------------------------------------------------------------

    async def put_score(self, score: RolloutScore) -> None:
        """Attach ``score`` to its rollout, durably; identical re-put no-op, different refused."""
        if not isinstance(score, RolloutScore):
            raise TypeError(f"put_score needs a RolloutScore, got {type(score).__name__}")
        score.validate()
        canonical = score.canonical_bytes()
        await self._decide(score.rollout_id, lambda s: s.put_score(score.verifier, canonical))

    async def scores(self, rollout_id: str) -> list[RolloutScore]:
        """The rollout's scores, by verifier name (RolloutRetiredError once retired)."""
        raw: list[bytes] = await self._decide(rollout_id, lambda s: s.read_scores(), write=False)
        return [RolloutScore.from_json(b) for b in raw]

    # -- prompt ledger ----------------------------------------------------------------------

    async def _stream(self, stream: str, op: StreamOp, *, write: bool = True) -> Any:
        validate_stream(stream)
        return await self._run(functools.partial(self.transact_stream, stream, op, write=write))

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
    ) -> PromptRow:
        """Record prompt ``position`` of ``stream`` (and the pipeline cursor after it)."""

        def op(ledger: StreamLedger) -> PromptRow:
            ledger.issue(position, prompt_key, payload, n, cursor, weight_version, started_at)
            row = ledger.prompts[position]
            return msgspec.json.decode(msgspec.json.encode(row), type=PromptRow)  # not shared

        row: PromptRow = await self._stream(stream, op)
        return row

    async def advance(
        self,
        stream: str,
        refs: Sequence[MemberRef],
        to: PromptState | str,
        *,
        step: int = -1,
        reason: str = "",
    ) -> bool:
        """Move the members ``refs`` to ``to`` in one transaction; False if all were there."""
        checked = [_member_ref(ref) for ref in refs]
        changed: bool = await self._stream(
            stream, lambda led: led.advance(checked, to, step=step, reason=reason)
        )
        return changed

    async def reissue(
        self, stream: str, ref: MemberRef, attempt: int, *, started_at: float = 0.0
    ) -> PromptMember:
        """Move an issued member to ``attempt`` (a fresh rollout id); returns the member."""

        def op(ledger: StreamLedger) -> PromptMember:
            ledger.reissue(ref, attempt, started_at)
            return ledger.member(ref)

        member: PromptMember = await self._stream(stream, op)
        return member

    async def stream_ledger(self, stream: str) -> StreamLedger:
        """The stream's whole ledger (empty for a stream nobody issued to)."""
        ledger: StreamLedger = await self._stream(stream, StreamLedger.copy, write=False)
        return ledger

    async def read_stream(self, stream: str, view: Callable[[StreamLedger], T]) -> T:
        """``view(ledger)`` on the stream's current ledger, under its lock, without copying it:
        a client that keeps its ledger reads only the moves since its last look, so a view
        that reads the prompts in flight (``pending``, ``admit``) costs O(new moves + prompts
        in flight), where :meth:`stream_ledger` copies every prompt. ``view`` must not change
        the ledger (AssertionError) nor keep a reference to it."""
        result: T = await self._stream(stream, view, write=False)
        return result

    # -- lineage ----------------------------------------------------------------------------

    async def resolve(
        self, rollout_id: str, request_items: list[dict[str, Any]]
    ) -> LineageResolution:
        validate_rollout_id(rollout_id)
        if not has_model_authored_item(request_items):
            if self._closed:
                raise RuntimeError(f"{self.describe()} capture store client is closed")
            return LineageResolution(ParentResolutionStatus.ROOT)
        if self._resolver is None:
            # One incremental cache per client: each look reads only entries committed since.
            self._resolver = IncrementalResolver(self.fetch_lineage)
        return await self._run(self._resolve_blocking, self._resolver, rollout_id, request_items)

    def _resolve_blocking(
        self, resolver: IncrementalResolver, rollout_id: str, request_items: list[dict[str, Any]]
    ) -> LineageResolution:
        res = resolver.resolve(rollout_id, request_items)
        if res.status is not ParentResolutionStatus.UNRESOLVED:
            return res
        commits: list[CaptureLedgerCommit] = self.transact_rollout(
            rollout_id,
            lambda s: Transition(),
            lambda s, _t: list(s.ledger_commits.values()),
            write=False,
        )
        return resolve_from_ledger(request_items, commits) or res

    def is_process_shared(self) -> bool:
        return True

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.close_backend()


_PRIVATE = frozenset(
    [n for n in vars(DurableStore) if n.startswith("_") and not n.startswith("__")]
    + ["_offload", "_closed", "_resolver"]
)
#: The primitives' names before they became public.
_RENAMED = {
    "_transact": "transact_rollout",
    "_freeze": "freeze_rollout",
    "_peek": "peek_rollout",
    "_lineage_fetch": "fetch_lineage",
    "_stream_transact": "transact_stream",
    "_remove_one": "remove_rollout",
    "_close": "close_backend",
}
