"""A minimal custom WorkSource for engine tests: shows the extension point and needs no I/O.

Chunks of ``chunk_size`` consecutive pointers over one dataset are dealt to lanes modulo
``canonical_replicas``; the final chunk may be short.
"""

from __future__ import annotations

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
