"""A minimal custom WorkSource for engine tests: shows the extension point and needs no I/O.

Chunks of ``chunk_size`` consecutive pointers over one dataset are dealt to lanes modulo
``canonical_replicas``; the final chunk may be short. :class:`GatedSource` holds one chunk
back until the test opens a gate: work is then surely left when the test acts mid-run.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from zephon.io import Dataset
from zephon.work import WorkChunk, WorkSource


class RangeSource(WorkSource):
    def __init__(
        self, datasets: Sequence[Dataset], chunk_size: int, lane: int = 0, replicas: int = 1
    ) -> None:
        self._datasets = list(datasets)
        self.chunk_size = chunk_size
        self.lane = lane
        self.replicas = replicas
        self.pointers = np.array(
            [
                (d, s, i)
                for d, ds in enumerate(self._datasets)
                for s, n in enumerate(ds.counts())
                for i in range(n)
            ],
            dtype=np.int64,
        ).reshape(-1, 3)
        self.next_global = lane

    @property
    def datasets(self) -> Sequence[Dataset]:
        return self._datasets

    def next_chunk(self) -> WorkChunk | None:
        start = self.next_global * self.chunk_size
        if start >= len(self.pointers):
            return None
        chunk = WorkChunk(self.pointers[start : start + self.chunk_size], self.next_global)
        self.next_global += self.replicas
        return chunk

    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "next_global": self.next_global}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.next_global = int(state["next_global"])

    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> RangeSource:
        return RangeSource(self._datasets, self.chunk_size, lane_id, canonical_replicas)


GATE_S = 60.0
"""How long a held source waits for its gate: a test that failed before opening it ends."""


class GatedSource(RangeSource):
    """Holds the source thread at chunk ``hold_at`` until ``gate`` opens: the run cannot end
    (nor its engine threads finish their work) before the test lets it."""

    def __init__(self, gate: threading.Event, hold_at: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = gate
        self.hold_at = hold_at

    def next_chunk(self) -> WorkChunk | None:
        if self.next_global == self.hold_at:
            assert self.gate.wait(GATE_S), "the test never opened the gate"
        return super().next_chunk()

    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> GatedSource:
        base = super().clone_for_lane(lane_id, canonical_replicas)
        return GatedSource(
            self.gate, self.hold_at, base.datasets, base.chunk_size, lane_id, canonical_replicas
        )
