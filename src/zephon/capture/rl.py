"""A prompt source with an in-flight ledger: RL prompts that survive any crash exactly once.

``PromptSource`` draws prompts from an ordinary zephon :class:`~zephon.pipeline.Pipeline`
(datasets, mixtures, shuffle) and, before handing one out, issues it in the capture store's
prompt ledger (:mod:`zephon.capture.ledger`) together with the pipeline checkpoint taken right
after it. After a crash of anything, :meth:`PromptSource.open` hands out first every prompt the
ledger still owes (oldest first; members never captured get a fresh attempt and rollout id,
captured or scored ones keep theirs), then continues the pipeline from that checkpoint. So no
prompt is skipped and none is drawn twice; with the trainer marking each batch ``trained`` at
its step (one transaction) and :meth:`StreamLedger.trained_after` telling a restored trainer
which steps to redo, none is trained twice.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from zephon.capture.ledger import (
    MemberRef,
    PromptMember,
    PromptRow,
    PromptState,
    StreamLedger,
    validate_stream,
)
from zephon.capture.protocols import PromptLedger, view_stream
from zephon.errors import ConfigError
from zephon.pipeline import Pipeline
from zephon.types import SampleBatch, StreamItem

__all__ = ["PromptGroup", "PromptSource", "view_stream"]


@dataclass(frozen=True, slots=True)
class PromptGroup:
    """One prompt and its ``n`` members as the ledger holds them when handed out.

    ``resumed`` is True for a prompt the ledger still owed after a restart: act on each
    member's ``state`` (generate for ``issued``, score ``captured``, train ``scored``).
    """

    position: int
    prompt_key: str
    payload: Any
    members: tuple[PromptMember, ...]
    resumed: bool = False

    def refs(self, *states: PromptState) -> list[MemberRef]:
        """``(position, index, attempt)`` of the members in ``states`` (all without states):
        a move with the attempt is refused once the member was re-issued."""
        return [
            (self.position, m.index, m.attempt)
            for m in self.members
            if not states or m.state in states
        ]


class PromptSource:
    """Issues prompts of ``pipeline`` into ``stream`` of ``store``; build with :meth:`open`."""

    def __init__(
        self, store: PromptLedger, stream: str, pipeline: Pipeline, ledger: StreamLedger, n: int
    ) -> None:
        self.store = store
        self.stream = stream
        self.n = n
        self.ledger = ledger
        """The ledger as read at :meth:`open` (``trained_after`` for a restored trainer)."""
        self._pipeline = pipeline
        self._iter: Iterator[StreamItem] | None = None
        self._owed = ledger.pending()
        self._next = ledger.next_position

    @classmethod
    async def open(
        cls, store: PromptLedger, stream: str, pipeline: Pipeline, *, n: int = 1
    ) -> PromptSource:
        """Read the stream's ledger and restore ``pipeline`` to its cursor (if any)."""
        validate_stream(stream)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"PromptSource n is {n!r}: use the group size, at least 1")
        if not isinstance(store, PromptLedger):
            raise TypeError(
                f"{type(store).__name__} keeps no prompt ledger (issue_prompt, advance, "
                "reissue, stream_ledger): open a zephon capture store with open_store(url)"
            )
        ledger = await store.stream_ledger(stream)
        if ledger.cursor is not None:
            pipeline.restore(ledger.cursor)
        elif ledger.prompts:
            raise ConfigError(
                f"stream {stream!r} holds {len(ledger.prompts)} prompts but no pipeline cursor "
                "(they were issued without one): its pipeline cannot resume after them; use a "
                "new stream name"
            )
        return cls(store, stream, pipeline, ledger, n)

    async def next_group(self, weight_version: int = -1) -> PromptGroup | None:
        """The next prompt owed by the ledger, else the next one of the pipeline (issued
        durably before it is returned, with the trainer's ``weight_version`` for the
        staleness bound of :meth:`StreamLedger.admit`); None once both are exhausted."""
        if self._owed:
            return await self._resume(self._owed.pop(0))
        item = self._draw()
        if item is None:
            return None
        position = self._next
        key = ".".join(str(part) for part in item.meta.sample_id)
        row = await self.store.issue_prompt(
            self.stream,
            position,
            prompt_key=key,
            payload=item.payload,
            n=self.n,
            cursor=self._pipeline.checkpoint(),
            weight_version=weight_version,
            started_at=time.time(),
        )
        self._next += 1
        return PromptGroup(row.position, row.prompt_key, row.payload, row.members)

    async def backfill(
        self,
        in_flight: int,
        weight_version: int = -1,
        *,
        pace: tuple[int, int] | None = None,
    ) -> list[PromptGroup]:
        """The groups to generate now so the stream holds ``in_flight`` prompts not yet trained
        or filtered: every prompt the ledger still owes, then new prompts of the pipeline.

        Call it whenever the generator has room: a group the trainer filtered (or trained)
        leaves the count, so it is replaced by the next prompt of the pipeline, and the steps
        of a :class:`~zephon.capture.batching.StepBatcher` keep their budget; the prompts it
        draws are the pipeline's, in order, so the run stays replayable. Fewer (or none) once
        the pipeline is exhausted.

        ``pace=(groups_per_step, max_staleness)`` (those of the trainer's
        :class:`~zephon.capture.streaming.StreamingCaptureSource`) also holds new prompts back
        while the stream holds ``groups_per_step * (weight_version + max_staleness + 1)``
        groups not wholly filtered: a prompt issued at version ``v`` then always finds a slot
        among the admissions trained by version ``v + max_staleness``, so it is never trained
        staler than the bound, even when the trainer's pipeline reads ahead (without it, a
        prompt issued at the trainer's version after the source admitted the groups of
        later steps is trained late, listed in the admission's ``stale``).
        """
        if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1:
            raise ConfigError(f"backfill in_flight is {in_flight!r}: use an int >= 1")
        out = [await self._resume(self._owed.pop(0)) for _ in range(len(self._owed))]
        open_now, unfiltered = await view_stream(
            self.store, self.stream, lambda led: (len(led.pending()), led.unfiltered)
        )
        room = in_flight - open_now
        if pace is not None:
            per_step, staleness = pace
            room = min(room, per_step * (max(weight_version, 0) + staleness + 1) - unfiltered)
        for _ in range(room):
            group = await self.next_group(weight_version)
            if group is None:
                break
            out.append(group)
        return out

    async def advance(
        self, refs: Sequence[MemberRef], to: PromptState | str, *, step: int = -1, reason: str = ""
    ) -> bool:
        """Move members of this stream (one transaction; see :meth:`StreamLedger.advance`)."""
        return await self.store.advance(self.stream, refs, to, step=step, reason=reason)

    async def _resume(self, row: PromptRow) -> PromptGroup:
        members = []
        for m in row.members:
            if m.state is PromptState.ISSUED:
                # Never captured: the attempt may have died mid-generation; start a new one.
                m = await self.store.reissue(
                    self.stream, (row.position, m.index), m.attempt + 1, started_at=time.time()
                )
            members.append(m)
        return PromptGroup(row.position, row.prompt_key, row.payload, tuple(members), True)

    def _draw(self) -> Any:
        if self._iter is None:
            self._iter = iter(self._pipeline)
        item = next(self._iter, None)
        if isinstance(item, SampleBatch):
            raise ConfigError(
                "PromptSource needs a pipeline that yields single records (one per prompt); "
                "remove .batch() from the prompt pipeline"
            )
        return item
