"""The rollout state machine shared by every store: pure decisions, no I/O.

Why pure: the memory, file, sqlite and postgres stores must agree clause for clause on the fence
state machine. Each store only provides atomicity and
durability; the decisions live here once.

How a store uses it, under its own per-rollout lock or transaction::

    state = load(rollout_id)                 # RolloutState.replay(events) or from_json(row)
    t = state.put(entry.model_call_id, entry.canonical_bytes())
    persist(t.events)                        # durably, atomically, BEFORE acting on the result
    state.apply_all(t.events)
    return t.unwrap()                        # raises t.error (after persisting: poisoning sticks)

Decision methods never mutate; ``apply`` is the only mutator, and replaying every persisted event
from :meth:`RolloutState.empty` rebuilds the same state (tested with hypothesis).

Version: a per-rollout counter moved by every observable change of the snapshot: ``Put``,
``MarkIncomplete`` (marks and conflicts), ``Refusal`` and the first ``Freeze`` add 1; ``Intent``,
ledger events, ``Retire`` add 0; ``Delete`` resets the rollout to empty (version 0). The
``snapshot_id`` is minted by the store (``uuid4().hex``) and passed to :meth:`freeze`; it is kept
until ``Delete``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import msgspec

from zephon.capture.protocols import (
    CaptureAdmissionRefused,
    CaptureConflictError,
    CaptureOrderError,
    RolloutRetiredError,
    TokenCaptureFrozenError,
    TokenCaptureRetiredError,
)
from zephon.capture.records import (
    CaptureLedgerCommit,
    EngineRefusalRecord,
    ManifestFailure,
    RolloutManifest,
    TokenCaptureSnapshot,
    TokenEntry,
    canonical_json,
    entry_key,
    validate_call_id,
)
from zephon.capture.stores._events import (
    CONFLICTING_LEDGER_RECORD,
    CONFLICTING_PUT,
    CONFLICTING_REFUSAL,
    MARKED,
    RECORD_FOR_REFUSED_CALL,
    REFUSAL_FOR_COMMITTED_CALL,
    CloseAdmissions,
    Delete,
    Event,
    Freeze,
    Intent,
    LedgerFailure,
    LedgerRecord,
    MarkIncomplete,
    Put,
    Refusal,
    RefuseCall,
    Retire,
    Score,
)

__all__ = ["PutOutcome", "RolloutState", "Transition"]

T = TypeVar("T")

# --------------------------------------------------------------------------- transition


@dataclass(frozen=True, slots=True)
class Transition(Generic[T]):
    """A decision: events to persist (in order), then either ``result`` or ``error``."""

    events: tuple[Event, ...] = ()
    result: T = None  # type: ignore[assignment]
    error: Exception | None = None

    def unwrap(self) -> T:
        """Raise ``error`` if set (call only after persisting ``events``), else return result."""
        if self.error is not None:
            raise self.error
        return self.result


def _fail(error: Exception, *events: Event) -> Transition[Any]:
    return Transition(events=events, result=None, error=error)


def _bad_call_id(call_id: str) -> Transition[Any] | None:
    """The refusal of a call id some store could not hold (checked first, by every store)."""
    try:
        validate_call_id(call_id)
    except ValueError as exc:
        return _fail(exc)
    return None


PutOutcome = Literal["stored", "duplicate"]
LedgerOutcome = Literal["stored", "duplicate", "discarded"]


# --------------------------------------------------------------------------- state


class RolloutState(msgspec.Struct, kw_only=True):
    """Everything the fence state machine needs to decide, for one rollout.

    Token payloads are NOT held here (only their idempotency keys); stores keep payloads next to
    the ``Put`` events. The struct is JSON-serialisable (``to_json``/``from_json``) so a store may
    cache it in a row or sidecar instead of replaying the log on every open.
    """

    rollout_id: str
    version: int = 0
    frozen: bool = False
    retired: bool = False
    incomplete: bool = False
    snapshot_id: str = ""
    admissions_closed: bool = False
    entry_keys: dict[str, str] = msgspec.field(default_factory=dict)
    intents: dict[str, None] = msgspec.field(default_factory=dict)
    refusals: list[EngineRefusalRecord] = msgspec.field(default_factory=list)
    incomplete_calls: list[str] = msgspec.field(default_factory=list)
    ledger_keys: dict[str, str] = msgspec.field(default_factory=dict)
    ledger_commits: dict[str, CaptureLedgerCommit] = msgspec.field(default_factory=dict)
    ledger_failures: list[tuple[str, str]] = msgspec.field(default_factory=list)
    refused_calls: dict[str, None] = msgspec.field(default_factory=dict)
    scores: dict[str, bytes] = msgspec.field(default_factory=dict)

    # -- construction --------------------------------------------------------------------

    @classmethod
    def empty(cls, rollout_id: str) -> RolloutState:
        return cls(rollout_id=rollout_id)

    @classmethod
    def replay(cls, rollout_id: str, events: Iterable[Event]) -> RolloutState:
        """Rebuild the state from every persisted event, oldest first."""
        state = cls.empty(rollout_id)
        state.apply_all(events)
        return state

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> RolloutState:
        return msgspec.json.decode(data, type=cls)

    def copy(self) -> RolloutState:
        return RolloutState.from_json(self.to_json())

    # -- derived -------------------------------------------------------------------------

    @property
    def phase(self) -> Literal["open", "frozen", "retired"]:
        if self.retired:
            return "retired"
        return "frozen" if self.frozen else "open"

    def is_empty(self) -> bool:
        """True for a rollout id that has no state at all (never used, or deleted)."""
        return self == RolloutState.empty(self.rollout_id)

    def refusal_for(self, call_id: str) -> EngineRefusalRecord | None:
        for rec in self.refusals:
            if rec.model_call_id == call_id:
                return rec
        return None

    def dangling_intents(self) -> list[str]:
        """Intents with no entry, refusal, ledger row or acknowledged refusal."""
        refused = {r.model_call_id for r in self.refusals}
        failed = {cid for cid, _ in self.ledger_failures}
        return [
            cid
            for cid in self.intents
            if cid not in self.entry_keys
            and cid not in refused
            and cid not in self.ledger_commits
            and cid not in failed
            and cid not in self.refused_calls
        ]

    def snapshot_incomplete(self) -> bool:
        """The ``incomplete`` flag a snapshot of the current state reports."""
        if self.frozen:
            return self.incomplete  # dangling intents were folded in at the first freeze
        return self.incomplete or bool(self.dangling_intents())

    def snapshot(self, entries: Iterable[TokenEntry]) -> TokenCaptureSnapshot:
        """The snapshot of this state with the given entries (every store builds it here)."""
        return TokenCaptureSnapshot(
            rollout_id=self.rollout_id,
            entries=tuple(entries),
            incomplete=self.snapshot_incomplete(),
            snapshot_id=self.snapshot_id,
            version=self.version,
            engine_refusals=tuple(self.refusals),
        )

    def manifest(self) -> RolloutManifest:
        """The token-free ledger (call only when not retired; see :meth:`read_manifest`)."""
        return RolloutManifest(
            rollout_id=self.rollout_id,
            records=tuple(c.record for c in self.ledger_commits.values()),
            failures=tuple(
                ManifestFailure(model_call_id=cid, reason=reason)
                for cid, reason in self.ledger_failures
            ),
        )

    # -- mutation ------------------------------------------------------------------------

    def apply_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.apply(event)

    def apply(self, event: Event) -> None:
        """Apply one persisted event. The only mutator."""
        if isinstance(event, Put):
            self.entry_keys[event.call_id] = event.key
            self.version += 1
        elif isinstance(event, Intent):
            self.intents[event.call_id] = None
        elif isinstance(event, Refusal):
            self.refusals.append(event.record)
            self.version += 1
        elif isinstance(event, MarkIncomplete):
            self.incomplete = True
            self.incomplete_calls.append(event.call_id)
            self.version += 1
        elif isinstance(event, Freeze):
            if not self.frozen:
                if self.dangling_intents():
                    self.incomplete = True
                self.frozen = True
                self.snapshot_id = event.snapshot_id
                self.version += 1
        elif isinstance(event, Retire):
            keep = (self.snapshot_id, self.version, self.frozen)
            self._reset()
            self.snapshot_id, self.version, self.frozen = keep
            self.retired = True
        elif isinstance(event, Delete):
            self._reset()
        elif isinstance(event, LedgerRecord):
            self.ledger_keys[event.call_id] = event.key
            self.ledger_commits[event.call_id] = event.commit
        elif isinstance(event, LedgerFailure):
            if (event.call_id, event.reason) not in self.ledger_failures:
                self.ledger_failures.append((event.call_id, event.reason))
        elif isinstance(event, CloseAdmissions):
            self.admissions_closed = True
        elif isinstance(event, RefuseCall):
            self.refused_calls[event.call_id] = None
        elif isinstance(event, Score):
            self.scores[event.verifier] = bytes(event.score)
        else:  # pragma: no cover - exhaustive
            raise TypeError(f"unknown capture event {event!r}")

    def _reset(self) -> None:
        fresh = RolloutState.empty(self.rollout_id)
        for name in self.__struct_fields__:
            setattr(self, name, getattr(fresh, name))

    # -- fences --------------------------------------------------------------------------

    def _write_fence(self, what: str) -> Exception | None:
        if self.retired:
            return TokenCaptureRetiredError(
                f"rollout {self.rollout_id!r} is retired: {what} refused; drop the late record "
                "and do not mark the rollout incomplete (delete the rollout to reuse its id)"
            )
        if self.frozen:
            return TokenCaptureFrozenError(
                f"rollout {self.rollout_id!r} is frozen: {what} refused; drop the late record "
                "and do not mark the rollout incomplete"
            )
        return None

    def _read_fence(self, what: str) -> RolloutRetiredError | None:
        if self.retired:
            return RolloutRetiredError(
                f"rollout {self.rollout_id!r} is retired: cannot {what}; its records are gone "
                "(delete the rollout to reuse its id)"
            )
        return None

    # -- sink decisions ------------------------------------------------------------------

    def put(self, call_id: str, canonical: bytes) -> Transition[PutOutcome]:
        """Store an entry given its canonical bytes; identical bytes are a no-op."""
        bad = _bad_call_id(call_id)
        if bad is not None:
            return bad
        fence = self._write_fence(f"put of call {call_id!r}")
        if fence is not None:
            return _fail(fence)
        cut = self._admission_cut("put", call_id)
        if cut is not None:
            return _fail(cut)
        key = entry_key(canonical)
        if self.refusal_for(call_id) is not None:
            return _fail(
                CaptureConflictError(
                    f"rollout {self.rollout_id!r}: call {call_id!r} was recorded as an engine "
                    "refusal and cannot also have an entry; the rollout is now incomplete"
                ),
                MarkIncomplete(call_id=call_id, reason=CONFLICTING_PUT),
            )
        known = self.entry_keys.get(call_id)
        if known == key:
            return Transition(result="duplicate")
        if known is not None:
            return _fail(
                CaptureConflictError(
                    f"rollout {self.rollout_id!r}: call {call_id!r} was already put with "
                    "different bytes (a retry must resend the identical entry, timestamps "
                    "included); the rollout is now incomplete"
                ),
                MarkIncomplete(call_id=call_id, reason=CONFLICTING_PUT),
            )
        return Transition(
            events=(Put(call_id=call_id, key=key, entry=msgspec.Raw(canonical)),),
            result="stored",
        )

    def mark_incomplete(self, call_id: str = "") -> Transition[None]:
        """Allowed before and after freeze; always moves the version. Refused once retired."""
        bad = _bad_call_id(call_id) if call_id else None
        if bad is not None:
            return bad
        if self.retired:
            fence = self._write_fence("mark_incomplete")
            assert fence is not None
            return _fail(fence)
        return Transition(events=(MarkIncomplete(call_id=call_id, reason=MARKED),))

    def fail_call(self, call_id: str) -> Transition[None]:
        """A failed admitted call: marks while open; refused (no change) once frozen."""
        bad = _bad_call_id(call_id)
        if bad is not None:
            return bad
        fence = self._write_fence(f"failure mark of call {call_id!r}")
        if fence is not None:
            return _fail(fence)
        return Transition(events=(MarkIncomplete(call_id=call_id, reason=MARKED),))

    def _admission_cut(self, what: str, call_id: str) -> Exception | None:
        """After ``close_admissions`` only calls admitted before the cut may still commit."""
        if self.admissions_closed and call_id not in self.intents:
            return CaptureAdmissionRefused(
                f"rollout {self.rollout_id!r} closed its admissions: {what} of call {call_id!r} "
                "has no intent from before the cut and is refused (call begin_call before "
                "close_admissions)"
            )
        return None

    def begin_call(self, call_id: str) -> Transition[None]:
        """Record a pre-dispatch intent; refused when frozen, retired or admissions closed."""
        bad = _bad_call_id(call_id)
        if bad is not None:
            return bad
        fence = self._write_fence(f"begin_call of call {call_id!r}")
        if fence is not None:
            return _fail(fence)
        if self.admissions_closed:
            return _fail(
                CaptureAdmissionRefused(
                    f"rollout {self.rollout_id!r} closed its admissions: call {call_id!r} "
                    "must not generate"
                )
            )
        if call_id in self.intents:
            return Transition()
        return Transition(events=(Intent(call_id=call_id),))

    def record_engine_refusal(self, record: EngineRefusalRecord) -> Transition[None]:
        """Settle the call's intent with a refusal; after freeze this raises (no change)."""
        call_id = record.model_call_id
        bad = _bad_call_id(call_id)
        if bad is not None:
            return bad
        fence = self._write_fence(f"engine refusal of call {call_id!r}")
        if fence is not None:
            return _fail(fence)
        known = self.refusal_for(call_id)
        if known == record:
            return Transition()
        if known is not None:
            return _fail(
                CaptureConflictError(
                    f"rollout {self.rollout_id!r}: call {call_id!r} already has a different "
                    "engine refusal; the rollout is now incomplete"
                ),
                MarkIncomplete(call_id=call_id, reason=CONFLICTING_REFUSAL),
            )
        if call_id in self.entry_keys:
            return _fail(
                CaptureConflictError(
                    f"rollout {self.rollout_id!r}: call {call_id!r} already committed an entry "
                    "and cannot be an engine refusal; the rollout is now incomplete"
                ),
                MarkIncomplete(call_id=call_id, reason=REFUSAL_FOR_COMMITTED_CALL),
            )
        return Transition(events=(Refusal(record=record),))

    # -- source decisions ----------------------------------------------------------------

    def freeze(self, new_snapshot_id: str) -> Transition[None]:
        """Fence the rollout (first time: mint ``new_snapshot_id``, version + 1); idempotent.

        Freezing an unknown id fences it too and yields an empty snapshot (consumers mask it).
        """
        fence = self._read_fence("freeze it")
        if fence is not None:
            return _fail(fence)
        if self.frozen:
            return Transition()
        if not new_snapshot_id:
            raise ValueError("new_snapshot_id must be a non-empty string (use uuid4().hex)")
        return Transition(events=(Freeze(snapshot_id=new_snapshot_id),))

    def drop(self, snapshot_id: str, version: int) -> Transition[bool]:
        """Retire exactly the consumed snapshot; False if anything changed since."""
        matches = self.frozen and self.snapshot_id == snapshot_id and self.version == version
        if not matches:
            return Transition(result=False)
        if self.retired:
            return Transition(result=True)
        return Transition(events=(Retire(),), result=True)

    def retire(self) -> Transition[bool]:
        """Unconditional retirement with a fence; result says whether the state changed."""
        if self.retired:
            return Transition(result=False)
        return Transition(events=(Retire(),), result=True)

    def delete(self) -> Transition[bool]:
        """Remove records and fence; result says whether there was anything to remove."""
        if self.is_empty():
            return Transition(result=False)
        return Transition(events=(Delete(),), result=True)

    # -- ledger decisions ----------------------------------------------------------------

    def ledger_record(self, commit: CaptureLedgerCommit) -> Transition[LedgerOutcome]:
        """Publish a ledger row; identical replay no-op, different data fails and poisons."""
        call_id = commit.record.model_call_id
        bad = _bad_call_id(call_id)
        if bad is not None:
            return bad
        if self.retired:
            return Transition(result="discarded")
        key = entry_key(canonical_json(commit))
        known = self.ledger_keys.get(call_id)
        if known == key:
            return Transition(result="duplicate")
        if known is not None:
            return _fail(
                CaptureConflictError(
                    f"rollout {self.rollout_id!r}: ledger call {call_id!r} was already recorded "
                    "with different data; the rollout now has a failure row"
                ),
                LedgerFailure(call_id=call_id, reason=CONFLICTING_LEDGER_RECORD),
            )
        cut = self._admission_cut("ledger record", call_id)
        if cut is not None:
            return _fail(cut)
        if call_id in self.refused_calls:
            return _fail(
                CaptureConflictError(
                    f"rollout {self.rollout_id!r}: ledger call {call_id!r} was acknowledged as "
                    "refused and cannot commit; the rollout now has a failure row"
                ),
                LedgerFailure(call_id=call_id, reason=RECORD_FOR_REFUSED_CALL),
            )
        return Transition(
            events=(LedgerRecord(call_id=call_id, key=key, commit=commit),), result="stored"
        )

    def ledger_record_failure(self, call_id: str, reason: str) -> Transition[LedgerOutcome]:
        """Add a poison row (stored once per (call, reason)); discarded after retire."""
        if not call_id or not reason:
            raise ValueError("record_failure needs a non-empty model_call_id and reason")
        bad = _bad_call_id(call_id)
        if bad is not None:
            return bad
        if self.retired:
            return Transition(result="discarded")
        if (call_id, reason) in self.ledger_failures:
            return Transition(result="duplicate")
        return Transition(events=(LedgerFailure(call_id=call_id, reason=reason),), result="stored")

    def close_admissions(self) -> Transition[None]:
        """Admission cut; the caller returns :meth:`manifest` after applying."""
        fence = self._read_fence("close its admissions")
        if fence is not None:
            return _fail(fence)
        if self.admissions_closed:
            return Transition()
        return Transition(events=(CloseAdmissions(),))

    def refuse_call(self, call_id: str) -> Transition[LedgerOutcome]:
        """Settle an admitted call the worker refused; it stays in the audit trail only."""
        bad = _bad_call_id(call_id)
        if bad is not None:
            return bad
        if self.retired:
            return Transition(result="discarded")
        if call_id in self.refused_calls:
            return Transition(result="duplicate")
        if call_id not in self.intents:
            return _fail(
                CaptureOrderError(
                    f"rollout {self.rollout_id!r}: refuse_call for {call_id!r} without an "
                    f"admitted intent; call begin_call({call_id!r}) first"
                )
            )
        if call_id in self.ledger_commits:
            return _fail(
                CaptureConflictError(
                    f"rollout {self.rollout_id!r}: call {call_id!r} already committed a ledger "
                    "row and cannot be refused; the rollout now has a failure row"
                ),
                LedgerFailure(call_id=call_id, reason=RECORD_FOR_REFUSED_CALL),
            )
        return Transition(events=(RefuseCall(call_id=call_id),), result="stored")

    def read_manifest(self) -> Transition[RolloutManifest]:
        """The manifest, or :class:`RolloutRetiredError` for a retired rollout."""
        fence = self._read_fence("read its manifest")
        if fence is not None:
            return _fail(fence)
        return Transition(result=self.manifest())

    def read_snapshot(self) -> Transition[None]:
        """A read-only look at the snapshot: refused once retired (its records are gone)."""
        fence = self._read_fence("read its snapshot")
        return Transition() if fence is None else _fail(fence)

    # -- score decisions ----------------------------------------------------------------

    def put_score(self, verifier: str, canonical: bytes) -> Transition[PutOutcome]:
        """Attach a verifier's score (allowed after freeze: scoring follows capture)."""
        if self.retired:
            return _fail(
                TokenCaptureRetiredError(
                    f"rollout {self.rollout_id!r} is retired: its score by {verifier!r} is "
                    "refused; score a rollout before retiring it"
                )
            )
        if not self.entry_keys:
            return _fail(
                CaptureOrderError(
                    f"rollout {self.rollout_id!r} has no captured entries: put its entries "
                    f"before the score by {verifier!r}"
                )
            )
        known = self.scores.get(verifier)
        if known == canonical:
            return Transition(result="duplicate")
        if known is not None:
            return _fail(
                CaptureConflictError(
                    f"rollout {self.rollout_id!r} already has a different score by "
                    f"{verifier!r}; a verifier scores a rollout once (re-put the identical "
                    "score, or use another verifier name)"
                )
            )
        return Transition(events=(Score(verifier=verifier, score=msgspec.Raw(canonical)),))

    def read_scores(self) -> Transition[list[bytes]]:
        """The scores' canonical bytes by verifier name; refused once retired."""
        fence = self._read_fence("read its scores")
        if fence is not None:
            return _fail(fence)
        return Transition(result=[self.scores[v] for v in sorted(self.scores)])

    def read_has_rows(self) -> Transition[bool]:
        fence = self._read_fence("check its ledger rows")
        if fence is not None:
            return _fail(fence)
        return Transition(result=bool(self.ledger_commits or self.ledger_failures))
