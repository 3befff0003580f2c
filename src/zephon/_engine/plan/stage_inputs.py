"""The payloads records had as they entered a stage, rebuilt from their source records.

Provenance asks this of the few documents a truncating tokenize cut: how long a document was
before the cut is in no tag or checkpoint (those stay as they were), so it re-runs only those
records, by cursor, through the operators before tokenize, as a snapshot restore does.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

from zephon._engine.plan.compile import CompiledRun
from zephon._engine.state.snapshots import Rebuilder, stand_in_meta
from zephon._snapshot_codec import HeldRecord
from zephon.ops import BaseOp
from zephon.types import SampleCursor, SampleRecord

__all__ = ["StageInputs"]


class StageInputs:
    """Rebuilds what records looked like entering stage ``i`` of a compiled run's operators
    (``ops``: the run's stages, the fetch first), on copies of them set up for each call and
    torn down after it, so nothing stays open between provenance queries."""

    def __init__(self, run: CompiledRun) -> None:
        self.ops: list[BaseOp] = [spec.op for spec in run.specs]
        self._roles = list(run.snapshot_plan.roles)
        self._contexts = list(run.contexts)

    def records(
        self, stage: int, lane: int, cursors: Sequence[SampleCursor]
    ) -> Mapping[SampleCursor, SampleRecord]:
        """``cursor -> record`` as each record of ``lane`` entered ``stage`` (its meta a
        stand-in: cursor and lane); raises what the operators raise (a source that changed,
        a stage that cannot be re-run)."""
        held = [(lane, HeldRecord(stand_in_meta(lane, SampleCursor(*c)))) for c in cursors]
        rebuilder = Rebuilder([copy.copy(op) for op in self.ops], self._roles)
        ready: list[BaseOp] = []
        try:
            for op, ctx in zip(rebuilder.ops[:stage], self._contexts, strict=False):
                op.setup(ctx)
                ready.append(op)
            rebuilt = rebuilder.payloads(stage, held)
        finally:
            for op in ready:
                op.teardown()
        return {
            c: SampleRecord(h.meta, rebuilt[id(h)]) for c, (_, h) in zip(cursors, held, strict=True)
        }
