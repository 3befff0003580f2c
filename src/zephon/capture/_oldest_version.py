"""The oldest weight version in a group's rollouts, for the streaming source's staleness bound.

Why: a partial rollout carries tokens of the versions its calls ran under, and a lagging engine
can generate under weights older than the trainer's version when the prompt was issued; the
bound must count from the oldest tokens a group will train on. A member's calls are read once
its capture is finished (captured or scored): later calls are never older than its first, so
the value is final and cached per attempt. Members still generating count with the version
their prompt was issued at.
"""

from __future__ import annotations

from typing import Any

import msgspec

from zephon.capture.ledger import PromptRow, PromptState
from zephon.capture.protocols import SupportsPeek

_FINISHED = (PromptState.CAPTURED, PromptState.SCORED)


class OldestVersions:
    """Rows of a prompt ledger with ``weight_version`` lowered to their rollouts' oldest."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._store: SupportsPeek | None = store if isinstance(store, SupportsPeek) else None
        self._known: dict[str, int | None] = {}  # rollout id (one per attempt) -> oldest

    async def rows(self, rows: list[PromptRow]) -> list[PromptRow]:
        """:meth:`row` of each, in order."""
        return [await self.row(r) for r in rows]

    async def row(self, row: PromptRow) -> PromptRow:
        """``row`` with its weight version replaced by the oldest of its finished members'
        calls when that is older (a row without a recorded version is left alone)."""
        if self._store is None or row.weight_version < 0:
            return row
        oldest = row.weight_version
        for member in row.members:
            if member.state in _FINISHED:  # a filtered member's tokens are never trained
                version = await self._member(member.rollout_id)
                if version is not None and version < oldest:
                    oldest = version
        if oldest == row.weight_version:
            return row
        return msgspec.structs.replace(row, weight_version=oldest)

    async def _member(self, rollout_id: str) -> int | None:
        if rollout_id not in self._known and self._store is not None:
            snapshot = await self._store.peek(rollout_id)
            versions = [e.weight_version for e in snapshot.entries if e.weight_version is not None]
            self._known[rollout_id] = min(versions) if versions else None
        return self._known.get(rollout_id)
