"""The events of the rollout state machine: what every store persists, and its wire form.

Why a module of their own: the events are the durable format shared by every store (log lines
of the file store, rows of the SQL stores), while :mod:`._state` holds the decisions. Each
event is a frozen tagged msgspec struct; ``op`` names it on the wire.
"""

from __future__ import annotations

from typing import Any

import msgspec

from zephon.capture.records import CaptureLedgerCommit, EngineRefusalRecord

__all__ = [
    "CONFLICTING_LEDGER_RECORD",
    "CONFLICTING_PUT",
    "CONFLICTING_REFUSAL",
    "LOST_TAIL",
    "MARKED",
    "RECORD_FOR_REFUSED_CALL",
    "REFUSAL_FOR_COMMITTED_CALL",
    "CloseAdmissions",
    "Delete",
    "Event",
    "Freeze",
    "Intent",
    "LedgerFailure",
    "LedgerRecord",
    "MarkIncomplete",
    "Put",
    "Refusal",
    "RefuseCall",
    "Retire",
    "Score",
    "decode_event",
    "encode_event",
    "event_from_builtins",
    "event_to_builtins",
]

# Reason codes recorded by MarkIncomplete / LedgerFailure events.
MARKED = "marked"
CONFLICTING_PUT = "conflicting_put"
CONFLICTING_REFUSAL = "conflicting_refusal"
REFUSAL_FOR_COMMITTED_CALL = "refusal_for_committed_call"
CONFLICTING_LEDGER_RECORD = "conflicting_ledger_record"
RECORD_FOR_REFUSED_CALL = "record_for_refused_call"
LOST_TAIL = "lost_tail"  # a durable store found its newest write missing or damaged


# --------------------------------------------------------------------------- events


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="op"):
    pass


class Put(_Event, tag="put", frozen=True, omit_defaults=True):
    """A new entry. ``entry`` carries its canonical JSON (raw, not re-parsed); a store either
    persists it inside the event (file log line) or strips it and stores the payload beside
    the event (SQL column). An empty ``entry`` is omitted from the encoded event."""

    call_id: str
    key: str
    entry: msgspec.Raw = msgspec.Raw(b"")

    @property
    def entry_bytes(self) -> bytes:
        """The canonical entry bytes (empty if the event was stored without its payload)."""
        return bytes(self.entry)

    def without_entry(self) -> Put:
        return Put(call_id=self.call_id, key=self.key)


class Intent(_Event, tag="intent", frozen=True):
    """A durable pre-dispatch intent (``begin_call``)."""

    call_id: str


class Refusal(_Event, tag="refusal", frozen=True):
    """The engine refused ``record.model_call_id`` before generating."""

    record: EngineRefusalRecord


class MarkIncomplete(_Event, tag="incomplete", frozen=True):
    """The rollout lost a call (``reason``: marked, conflicting_put, ...); poisons it."""

    call_id: str = ""
    reason: str = MARKED


class Freeze(_Event, tag="freeze", frozen=True):
    """First freeze: fences sink writes; dangling intents fold into ``incomplete``."""

    snapshot_id: str


class Retire(_Event, tag="retire", frozen=True):
    """Records removed, fence kept (matching ``drop`` or unconditional ``retire``)."""


class Delete(_Event, tag="delete", frozen=True):
    """Records and fence removed; the rollout id reads as unused again."""


class LedgerRecord(_Event, tag="ledger_record", frozen=True):
    """A committed ledger row (token-free)."""

    call_id: str
    key: str
    commit: CaptureLedgerCommit


class LedgerFailure(_Event, tag="ledger_failure", frozen=True):
    """A poison row of the ledger."""

    call_id: str
    reason: str


class CloseAdmissions(_Event, tag="close_admissions", frozen=True):
    """Later ``begin_call`` is refused; existing intents may still commit."""


class RefuseCall(_Event, tag="refuse_call", frozen=True):
    """The worker acknowledged refusing the call; its intent is settled, kept for audit."""

    call_id: str


class Score(_Event, tag="score", frozen=True):
    """A verifier's score of the rollout: its canonical JSON (a :class:`RolloutScore`)."""

    verifier: str
    score: msgspec.Raw


Event = (
    Put
    | Intent
    | Refusal
    | MarkIncomplete
    | Freeze
    | Retire
    | Delete
    | LedgerRecord
    | LedgerFailure
    | CloseAdmissions
    | RefuseCall
    | Score
)

_EVENT_DECODER: msgspec.json.Decoder[Event] = msgspec.json.Decoder(Event)  # type: ignore[arg-type]
_EVENT_ENCODER = msgspec.json.Encoder()


def encode_event(event: Event) -> bytes:
    """Compact JSON of one event (one log line without the newline)."""
    return _EVENT_ENCODER.encode(event)


def decode_event(data: bytes | str) -> Event:
    """Decode one event; unknown keys are ignored, so stores may add their own."""
    try:
        return _EVENT_DECODER.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(f"invalid capture event: {exc}") from None


def event_to_builtins(event: Event) -> dict[str, Any]:
    """A plain dict of the event (e.g. for a JSONB column); ``Put.entry`` decoded if present."""
    out: dict[str, Any] = msgspec.json.decode(_EVENT_ENCODER.encode(event))
    return out


def event_from_builtins(data: dict[str, Any]) -> Event:
    """Convert a dict (e.g. a JSONB row) back into an event."""
    return decode_event(msgspec.json.encode(data))
