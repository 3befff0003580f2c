"""How long a document was before a truncating tokenize cut it, found when provenance asks.

Records carry no mark of the cut, so records and checkpoints stay byte for byte as they were.
A cut record is still recognisable: it has exactly ``max_length`` tokens. For those only, the
document is re-run by cursor through the operators before tokenize (as a snapshot restore
rebuilds records) and counted without the cut. Answers are kept, so asking about a batch again
costs lookups.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from zephon.types import SampleCursor, SampleRecord

__all__ = ["CutLengths", "Inputs"]

log = logging.getLogger("zephon")

KEEP = 1 << 16  # whole lengths remembered (the oldest are forgotten first)


class Inputs(Protocol):
    """Rebuilds records as they entered a stage (``zephon._engine.plan.stage_inputs``)."""

    @property
    def ops(self) -> Sequence[Any]: ...

    def records(
        self, stage: int, lane: int, cursors: Sequence[SampleCursor]
    ) -> Mapping[SampleCursor, SampleRecord]: ...


class CutLengths:
    """Whole token counts of the records a truncating tokenize (stage ``stage``) made
    ``limit`` tokens long; ``None`` for one that could not be rebuilt."""

    def __init__(self, tokenize: Any, stage: int, inputs: Inputs) -> None:
        self.limit = int(tokenize.max_length)
        self.stage = stage
        self._tokenize = tokenize
        self._inputs = inputs
        self._known: dict[tuple[int, SampleCursor], int | None] = {}
        self._lock = threading.Lock()
        self._warned = False

    @classmethod
    def of(cls, inputs: Inputs) -> CutLengths | None:
        """For a run whose last tokenize truncates; None for any other run."""
        found = None
        for stage, op in enumerate(inputs.ops):
            if getattr(op, "name", "") == "tokenize" and hasattr(op, "whole_lengths"):
                found = (stage, op)
        if found is None or not found[1].truncation:
            return None
        return cls(found[1], found[0], inputs)

    def whole(self, lane: int, cursors: Sequence[SampleCursor]) -> dict[SampleCursor, int | None]:
        """``cursor -> whole token count`` of records of ``lane``, each rebuilt once."""
        missing = [c for c in dict.fromkeys(cursors) if (lane, c) not in self._known]
        if missing:
            counted = self._count(lane, missing)
            with self._lock:
                for cursor, n in zip(missing, counted, strict=True):
                    self._known[(lane, cursor)] = n
                while len(self._known) > KEEP:
                    del self._known[next(iter(self._known))]
        return {c: self._known.get((lane, c)) for c in cursors}

    def _count(self, lane: int, cursors: list[SampleCursor]) -> list[int | None]:
        try:
            records = self._inputs.records(self.stage, lane, cursors)
            return list(self._tokenize.whole_lengths([records[c] for c in cursors]))
        except Exception as exc:  # provenance describes a run; it never stops one
            if not self._warned:
                self._warned = True
                log.warning(
                    "zephon: provenance could not re-read documents tokenize(max_length=%d) "
                    "may have cut (%s: %s); their source_length is left unknown",
                    self.limit,
                    type(exc).__name__,
                    exc,
                )
            return [None] * len(cursors)
