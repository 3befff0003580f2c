"""The prompt ledger of an RL stream: where every issued prompt and group member stands.

Why in the capture store: a trainer, its rollout workers and the proxy crash independently,
and "which prompts are still owed" must survive all of them in the one place they already share.
Each prompt a :class:`zephon.capture.rl.PromptSource` draws gets a position (0, 1, 2, ... with
no gaps) and ``n`` group members; each member moves

    issued -> captured -> scored -> trained      or, from any of the first three, -> filtered

and every move is one validated, durable transaction (:meth:`StreamLedger.issue`,
:meth:`StreamLedger.advance`, :meth:`StreamLedger.reissue` are the pure decisions every store
runs). Repeating a move that already happened is a no-op, so a retry after a lost answer is
safe; a move that contradicts the ledger (trained at another step, a skipped state, another
prompt at a taken position) raises :class:`LedgerTransitionError` and changes nothing.

The stream also keeps the pipeline checkpoint taken right after its newest prompt was drawn,
written in the same transaction as that prompt: a restart resumes the pipeline exactly there,
so no prompt is skipped or drawn twice (the ledger is frontier-aligned by construction).
"""

from __future__ import annotations

import enum
from collections.abc import Container, Iterable, Sequence
from typing import Any

import msgspec

from zephon.capture.records import validate_rollout_id
from zephon.errors import ZephonError

__all__ = [
    "MAX_STREAM_CHARS",
    "Admission",
    "LedgerDelta",
    "MemberRef",
    "PromptMember",
    "PromptRow",
    "member_rollout_id",
    "validate_stream",
]

MAX_STREAM_CHARS = 120
"""Longest stream name: the rollout ids minted from it stay within the 200-character limit."""


class LedgerTransitionError(ZephonError, ValueError):
    """A ledger move contradicts what the ledger already holds; nothing was changed."""


class PromptState(enum.StrEnum):
    """Where a group member stands; ``trained`` and ``filtered`` are terminal."""

    ISSUED = "issued"
    CAPTURED = "captured"
    SCORED = "scored"
    TRAINED = "trained"
    FILTERED = "filtered"

    @property
    def terminal(self) -> bool:
        return self in (PromptState.TRAINED, PromptState.FILTERED)


_RANK = {
    PromptState.ISSUED: 0,
    PromptState.CAPTURED: 1,
    PromptState.SCORED: 2,
    PromptState.TRAINED: 3,
}
_BEFORE = {
    PromptState.CAPTURED: PromptState.ISSUED,
    PromptState.SCORED: PromptState.CAPTURED,
    PromptState.TRAINED: PromptState.SCORED,
}

MemberRef = tuple[int, int] | tuple[int, int, int]
"""``(position, member index)`` of one group member, or ``(position, member index, attempt)``:
with the attempt, a move by the worker of an attempt that was re-issued since is refused."""


def validate_stream(stream: object) -> str:
    """Return ``stream`` if it is a valid rollout-id prefix of at most 120 characters."""
    name = validate_rollout_id(stream, field="stream")
    if len(name) > MAX_STREAM_CHARS:
        raise ValueError(
            f"stream {name[:40]!r}... is invalid: {len(name)} characters, at most "
            f"{MAX_STREAM_CHARS} (rollout ids are minted from it)"
        )
    return name


def member_rollout_id(stream: str, position: int, member: int, attempt: int = 0) -> str:
    """The rollout id the ledger mints for a member's attempt (a re-issue is a new attempt,
    so a half-written capture of an abandoned attempt never mixes with the new one)."""
    return f"{stream}.p{position}.m{member}.a{attempt}"


class PromptMember(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One group member: its rollout id (per attempt) and state; ``step`` once trained,
    ``reason`` and ``filtered_from`` once filtered; ``started_at`` (Unix seconds, 0: not
    given) when its current attempt was issued, for the wall-clock cap of :meth:`overdue`."""

    index: int
    rollout_id: str
    state: PromptState = PromptState.ISSUED
    attempt: int = 0
    step: int = -1
    reason: str = ""
    filtered_from: PromptState | None = None
    started_at: float = 0.0

    def passed(self, state: PromptState) -> bool:
        """Whether the member is in or went through ``state``."""
        if self.state is PromptState.FILTERED:
            if state is PromptState.FILTERED:
                return True
            return state is not PromptState.TRAINED and (
                _RANK[state] <= _RANK[self.filtered_from or PromptState.ISSUED]
            )
        return state is not PromptState.FILTERED and _RANK[state] <= _RANK[self.state]


class PromptRow(msgspec.Struct, frozen=True, kw_only=True):
    """One issued prompt: its position, the pipeline's key for it, its payload, its members,
    and the trainer's weight version when it was issued (-1: not given)."""

    position: int
    prompt_key: str
    payload: Any
    members: tuple[PromptMember, ...]
    weight_version: int = -1

    @property
    def done(self) -> bool:
        return all(m.state.terminal for m in self.members)


def _all_filtered(row: PromptRow) -> bool:
    return all(m.state is PromptState.FILTERED for m in row.members)


def _complete(row: PromptRow) -> bool:
    states = [m.state for m in row.members]
    ok = (PromptState.SCORED, PromptState.FILTERED)
    return all(s in ok for s in states) and PromptState.SCORED in states


class Admission(msgspec.Struct, frozen=True, kw_only=True):
    """What :meth:`StreamLedger.admit` lets a trainer train now."""

    groups: tuple[PromptRow, ...] = ()
    wait_for: PromptRow | None = None
    stale: tuple[int, ...] = ()

    def refs(self) -> list[MemberRef]:
        """The scored members of the admitted groups (what to mark trained), with attempts."""
        return [
            (row.position, m.index, m.attempt)
            for row in self.groups
            for m in row.members
            if m.state is PromptState.SCORED
        ]


class LedgerDelta(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one transaction changed in a stream, as a store appends it to the stream's log:
    the prompts it issued (with the pipeline cursor after them) and the members it replaced.
    Applying a stream's deltas in order to an empty ledger rebuilds it exactly."""

    rows: tuple[PromptRow, ...] = ()
    cursor: Any = None
    members: tuple[tuple[int, PromptMember], ...] = ()


class StreamLedger(msgspec.Struct, kw_only=True, dict=True):
    """The whole ledger of one stream (what a store keeps; decisions mutate a copy).

    ``dict=True`` holds the change tracking of :meth:`track` and the index of the prompts not
    yet done (never encoded): the index makes :meth:`pending`, :meth:`admit` and
    :meth:`overdue` cost O(prompts in flight), not O(prompts), on a ledger a store keeps
    up to date delta by delta."""

    stream: str
    prompts: list[PromptRow] = msgspec.field(default_factory=list)
    cursor: Any = None

    # -- change tracking (the stores append deltas instead of rewriting the ledger) ----------

    def track(self) -> None:
        """Start recording what the next decisions change, for :meth:`take_delta`."""
        self.__dict__["_mark"] = len(self.prompts)
        self.__dict__["_moved"] = {}

    def take_delta(self) -> LedgerDelta | None:
        """What changed since :meth:`track` (None: nothing); tracking stops."""
        mark: int = self.__dict__.pop("_mark")
        moved: dict[tuple[int, int], None] = self.__dict__.pop("_moved")
        rows = tuple(self.prompts[mark:])
        members = tuple((p, self.prompts[p].members[i]) for p, i in moved if p < mark)
        if not rows and not members:
            return None
        return LedgerDelta(rows=rows, cursor=self.cursor if rows else None, members=members)

    def apply_delta(self, delta: LedgerDelta) -> None:
        """Replay one delta of this stream's log (a LedgerTransitionError if it does not fit)."""
        for row in delta.rows:
            if row.position != len(self.prompts):
                raise LedgerTransitionError(
                    f"stream {self.stream!r}: its log issues position {row.position} after "
                    f"{len(self.prompts)} prompts; the log is damaged or from another stream"
                )
            self._append(row)
        if delta.rows:
            self.cursor = delta.cursor
        for position, new in delta.members:
            self.member((position, new.index))  # exists, or the error names it
            self._replace(position, new)

    def copy(self) -> StreamLedger:
        """A copy that shares nothing mutable with this ledger (a store's cached ledger is
        never handed out): rows and members are frozen and shared, payloads and the cursor
        are copied (4x cheaper than a JSON round trip of the whole ledger)."""
        prompts = [
            row
            if _immutable(row.payload)
            else msgspec.structs.replace(row, payload=_clone(row.payload))
            for row in self.prompts
        ]
        return StreamLedger(stream=self.stream, prompts=prompts, cursor=_clone(self.cursor))

    def _replace(self, position: int, new: PromptMember) -> None:
        row = self.prompts[position]
        members = list(row.members)
        members[new.index] = new
        self.prompts[position] = row = msgspec.structs.replace(row, members=tuple(members))
        index = self._open()
        if row.done and position in index:
            del index[position]
            self.__dict__["_open_filtered"][0] += _all_filtered(row)
        moved = self.__dict__.get("_moved")
        if moved is not None:
            moved[(position, new.index)] = None

    def _append(self, row: PromptRow) -> None:
        index = self._open()
        self.prompts.append(row)
        self.__dict__["_open_seen"] = (self.prompts, len(self.prompts))
        if not row.done:
            index[row.position] = None
        self.__dict__["_open_filtered"][0] += _all_filtered(row)

    def _open(self) -> dict[int, None]:
        """Positions of the prompts not done, ascending; rebuilt (O(prompts)) on first use
        and when ``prompts`` was replaced or grown other than by :meth:`issue` or
        :meth:`apply_delta`."""
        index: dict[int, None] | None = self.__dict__.get("_open_index")
        seen = self.__dict__.get("_open_seen")
        if (
            index is None
            or seen is None
            or seen[0] is not self.prompts
            or seen[1] != len(self.prompts)
        ):
            index = {row.position: None for row in self.prompts if not row.done}
            self.__dict__["_open_index"] = index
            self.__dict__["_open_seen"] = (self.prompts, len(self.prompts))
            self.__dict__["_open_filtered"] = [sum(_all_filtered(r) for r in self.prompts)]
        return index

    # -- reads ---------------------------------------------------------------------------

    @property
    def next_position(self) -> int:
        return len(self.prompts)

    def pending(self) -> list[PromptRow]:
        """Prompts with a member neither trained nor filtered, oldest first."""
        return [self.prompts[p] for p in self._open()]

    @property
    def unfiltered(self) -> int:
        """Prompts issued minus those whose every member was filtered: the groups that are,
        or will be, admitted for training (O(1) on a ledger kept up to date)."""
        self._open()
        filtered: int = self.__dict__["_open_filtered"][0]
        return len(self.prompts) - filtered

    def trained_after(self, step: int) -> dict[int, list[MemberRef]]:
        """Members trained at a step after ``step``, by step: what a trainer restored from the
        checkpoint of ``step`` must train again, batch for batch."""
        out: dict[int, list[MemberRef]] = {}
        for row in self.prompts:
            for m in row.members:
                if m.state is PromptState.TRAINED and m.step > step:
                    out.setdefault(m.step, []).append((row.position, m.index))
        return dict(sorted(out.items()))

    def admit(
        self,
        weight_version: int,
        max_staleness: int,
        limit: int,
        exclude: Container[int] = (),
    ) -> Admission:
        """Complete groups to train at trainer version ``weight_version``, oldest first.

        A group is complete when each member is scored or filtered and one is scored. At most
        ``limit`` groups are admitted. The staleness bound: a group issued at version ``v`` is
        trained by version ``v + max_staleness``; so when an incomplete group has reached it,
        ``wait_for`` names it and nothing is admitted: the trainer waits for the slow group
        instead of stepping past it (none is discarded for being slow), which also paces
        generation. A complete group already past the bound is admitted (oldest first) and
        listed in ``stale``, never dropped. Positions in ``exclude`` (groups already admitted
        and not yet trained) are passed over.
        """
        rows = (row for row in self.pending() if row.position not in exclude)
        return admit_rows(rows, weight_version, max_staleness, limit)

    def overdue(self, now: float, cap_s: float) -> list[MemberRef]:
        """Members still generating (issued or captured) whose attempt started ``cap_s`` or
        more seconds before ``now``, with their attempts: filter them (reason: the cap) so one
        stuck rollout cannot stall its group; the decision is then in the ledger, so a replay
        from it is exact although the clock is not. Members without ``started_at`` never are."""
        if cap_s <= 0:
            raise ValueError(f"overdue needs a cap above 0 seconds, got {cap_s}")
        generating = (PromptState.ISSUED, PromptState.CAPTURED)
        return [
            (row.position, m.index, m.attempt)
            for row in self.pending()
            for m in row.members
            if m.state in generating and 0 < m.started_at <= now - cap_s
        ]

    def counts(self) -> dict[str, int]:
        """Members per state (every state named, zeros included)."""
        out = {s.value: 0 for s in PromptState}
        for row in self.prompts:
            for m in row.members:
                out[m.state.value] += 1
        return out

    def member(self, ref: MemberRef) -> PromptMember:
        position, index = ref[0], ref[1]
        if not 0 <= position < len(self.prompts):
            raise LedgerTransitionError(
                f"stream {self.stream!r} has no position {position} (issued: "
                f"{len(self.prompts)}); issue the prompt first"
            )
        members = self.prompts[position].members
        if not 0 <= index < len(members):
            raise LedgerTransitionError(
                f"stream {self.stream!r} position {position} has no member {index} "
                f"(n={len(members)})"
            )
        return members[index]

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_json(cls, data: bytes) -> StreamLedger:
        return msgspec.json.decode(data, type=cls)

    # -- decisions (each returns whether the ledger changed) --------------------------------

    def issue(
        self,
        position: int,
        prompt_key: str,
        payload: Any,
        n: int,
        cursor: Any = None,
        weight_version: int = -1,
        started_at: float = 0.0,
    ) -> bool:
        """Record prompt ``position`` with ``n`` members and the pipeline ``cursor`` after it
        (a retry of the same prompt is a no-op and keeps what the first issue stored)."""
        where = f"stream {self.stream!r} position {position}"
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{where}: n is {n!r}; a prompt needs at least one group member")
        payload = _json_safe(payload, f"{where}: payload")
        cursor = _json_safe(cursor, f"{where}: cursor")
        if position < len(self.prompts):
            row = self.prompts[position]
            if (row.prompt_key, row.payload, len(row.members)) == (prompt_key, payload, n):
                return False
            raise LedgerTransitionError(
                f"{where} already holds prompt {row.prompt_key!r} (n={len(row.members)}), not "
                f"{prompt_key!r} (n={n}): two sources write one stream, or the pipeline changed "
                "(use a new stream name for a new pipeline)"
            )
        if position != len(self.prompts):
            raise LedgerTransitionError(
                f"{where}: the next position is {len(self.prompts)}; positions have no gaps"
            )
        members = tuple(
            PromptMember(
                index=i,
                rollout_id=member_rollout_id(self.stream, position, i),
                started_at=float(started_at),
            )
            for i in range(n)
        )
        self._append(
            PromptRow(
                position=position,
                prompt_key=prompt_key,
                payload=payload,
                members=members,
                weight_version=int(weight_version),
            )
        )
        self.cursor = cursor
        return True

    def advance(
        self,
        refs: Sequence[MemberRef],
        to: PromptState | str,
        *,
        step: int = -1,
        reason: str = "",
    ) -> bool:
        """Move every member of ``refs`` to ``to``, all or none (one batch of a trainer step is
        one transaction, so a restart never sees half a step)."""
        target = PromptState(to)
        if target is PromptState.ISSUED:
            raise LedgerTransitionError("members are issued by issue(), not advance()")
        if target is PromptState.TRAINED and (isinstance(step, bool) or step < 0):
            raise ValueError(f"advance to trained needs the trainer step (>= 0), got {step!r}")
        if target is PromptState.FILTERED and not (isinstance(reason, str) and reason.strip()):
            raise ValueError("advance to filtered needs a reason (e.g. 'all rewards equal')")
        moves = [(ref, self._move(ref, target, step, reason)) for ref in refs]
        for ref, new in moves:
            if new is not None:
                self._replace(ref[0], new)
        return any(new is not None for _, new in moves)

    def _move(self, ref: MemberRef, to: PromptState, step: int, reason: str) -> PromptMember | None:
        m = self.member(ref)
        where = f"stream {self.stream!r} position {ref[0]} member {ref[1]}"
        if len(ref) == 3 and ref[2] != m.attempt:
            raise LedgerTransitionError(
                f"{where}: attempt {ref[2]} was re-issued as attempt {m.attempt} "
                f"({m.rollout_id}); drop the result of the abandoned attempt"
            )
        if m.passed(to):
            if to is PromptState.TRAINED and m.step != step:
                raise LedgerTransitionError(
                    f"{where} was already trained at step {m.step}; a member is trained once "
                    f"(this asks for step {step})"
                )
            if to is PromptState.FILTERED and m.reason != reason:
                raise LedgerTransitionError(
                    f"{where} was already filtered ({m.reason!r}), not {reason!r}"
                )
            return None  # the same move again: a retry
        if m.state.terminal:
            raise LedgerTransitionError(
                f"{where} is already {m.state.value}"
                + (f" at step {m.step}" if m.state is PromptState.TRAINED else f" ({m.reason})")
                + f"; it cannot become {to.value}"
            )
        if to is PromptState.FILTERED:
            return msgspec.structs.replace(m, state=to, reason=reason, filtered_from=m.state)
        if m.state is not _BEFORE[to]:
            raise LedgerTransitionError(
                f"{where} cannot go {m.state.value} -> {to.value}: mark it "
                f"{_BEFORE[to].value} first (states are not skipped)"
            )
        return msgspec.structs.replace(m, state=to, step=step if to is PromptState.TRAINED else -1)

    def reissue(self, ref: MemberRef, attempt: int, started_at: float = 0.0) -> bool:
        """Give an issued (never captured) member attempt ``attempt`` (its current + 1) and the
        rollout id of that attempt; repeating the same re-issue is a no-op."""
        m = self.member(ref)
        where = f"stream {self.stream!r} position {ref[0]} member {ref[1]}"
        if m.attempt == attempt:
            return False
        if m.state is not PromptState.ISSUED:
            raise LedgerTransitionError(
                f"{where} is {m.state.value}: only an issued member is re-issued (resume from "
                "its capture instead)"
            )
        if attempt != m.attempt + 1:
            raise LedgerTransitionError(
                f"{where} is at attempt {m.attempt}; the re-issue must ask for {m.attempt + 1}, "
                f"not {attempt} (another source re-issued it?)"
            )
        new = msgspec.structs.replace(
            m,
            attempt=attempt,
            rollout_id=member_rollout_id(self.stream, ref[0], ref[1], attempt),
            started_at=float(started_at),
        )
        self._replace(ref[0], new)
        return True


_JSON = msgspec.json.Decoder()


def _immutable(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float)


def _clone(value: Any) -> Any:
    """A copy of JSON data (what payloads and cursors hold)."""
    return value if _immutable(value) else _JSON.decode(msgspec.json.encode(value))


def _json_safe(value: Any, what: str) -> Any:
    """``value`` as JSON reads it back (lists for tuples), or a ValueError naming ``what``."""
    try:
        return msgspec.json.decode(msgspec.json.encode(value))
    except (TypeError, msgspec.EncodeError) as exc:
        raise ValueError(
            f"{what} is not JSON-safe ({exc}); map it to dicts, lists, strings and numbers"
        ) from None


def admit_rows(
    rows: Iterable[PromptRow], weight_version: int, max_staleness: int, limit: int
) -> Admission:
    """:meth:`StreamLedger.admit` over ``rows``: prompts in flight, oldest first (a caller
    may lower their ``weight_version`` first, e.g. to their rollouts' oldest)."""
    if max_staleness < 0 or limit < 1:
        raise ValueError(
            f"admit needs max_staleness >= 0 and limit >= 1, got {max_staleness}, {limit}"
        )
    bound = weight_version - max_staleness
    ready: list[PromptRow] = []
    for row in rows:
        if _complete(row):
            ready.append(row)
        elif 0 <= row.weight_version <= bound:
            return Admission(wait_for=row)
    groups = tuple(ready[:limit])
    stale = tuple(r.position for r in groups if 0 <= r.weight_version < bound)
    return Admission(groups=groups, stale=stale)
