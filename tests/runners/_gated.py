"""A source that holds the rest of a run back until the test lets it through.

A test that kills workers mid-run needs work left for them when it kills them: what the
engine buffers ahead of a slow consumer (a loaded machine) can otherwise be the whole run.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from tests.engine._sources import RangeSource
from zephon.io import Dataset
from zephon.work import WorkChunk

GATE_S = 60.0
"""How long a lane waits for the gate at most: a test that failed before opening it must
still let its engine close."""


class GatedSource(RangeSource):
    """:class:`RangeSource` that deals ``ahead`` chunks per lane, then waits for ``gate``."""

    def __init__(
        self,
        datasets: Sequence[Dataset],
        chunk_size: int,
        gate: threading.Event,
        ahead: int,
        lane: int = 0,
        replicas: int = 1,
    ) -> None:
        super().__init__(datasets, chunk_size, lane, replicas)
        self.gate = gate
        self.ahead = ahead
        self.dealt = 0

    def next_chunk(self) -> WorkChunk | None:
        if self.dealt >= self.ahead:
            self.gate.wait(timeout=GATE_S)
        self.dealt += 1
        return super().next_chunk()

    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> GatedSource:
        return GatedSource(
            self._datasets, self.chunk_size, self.gate, self.ahead, lane_id, canonical_replicas
        )
