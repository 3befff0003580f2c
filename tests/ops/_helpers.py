"""Sources and checks shared by the stateful-operator tests.

Token ids encode where they come from (``doc_id * STRIDE + position``), so any output row can be
traced back to its documents and positions without trusting the operator's own metadata.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from zephon import Dataset, Pipeline
from zephon.types import TAG_CONTRIBUTORS, TAG_PACKING, SampleBatch, SampleRecord
from zephon.work import WorkChunk, WorkSource

STRIDE = 1 << 20
PAD = -1


def token_rows(lengths: Sequence[int], *, first_id: int = 0, mask: bool = False) -> list[dict]:
    rows = []
    for i, n in enumerate(lengths):
        doc = first_id + i
        row: dict[str, Any] = {
            "id": doc,
            "input_ids": doc * STRIDE + np.arange(n, dtype=np.int64),
        }
        if mask:
            row["loss_mask"] = (np.arange(n) % 3 != 0).astype(np.uint8)
        rows.append(row)
    return rows


class ListSource(WorkSource):
    """Explicit pointers cut into chunks of ``chunk_size``, dealt to lanes modulo replicas.

    ``target_mixture`` (if given) is stamped on every chunk, as a mixture-aware source would.
    """

    def __init__(
        self,
        datasets: Sequence[Dataset],
        pointers: Sequence[tuple[int, int, int]],
        chunk_size: int,
        lane: int = 0,
        replicas: int = 1,
        mixture: Mapping[str, float] | None = None,
    ) -> None:
        self._datasets = list(datasets)
        self.all_pointers = list(pointers)
        self.chunk_size = chunk_size
        self.lane = lane
        self.replicas = replicas
        self.next_global = lane
        self.mixture = mixture

    @property
    def datasets(self) -> Sequence[Dataset]:
        return self._datasets

    def next_chunk(self) -> WorkChunk | None:
        start = self.next_global * self.chunk_size
        if start >= len(self.all_pointers):
            return None
        rows = np.array(self.all_pointers[start : start + self.chunk_size], dtype=np.int64)
        self.next_global += self.replicas
        return WorkChunk(rows.reshape(-1, 3), self.next_global - self.replicas)

    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "next_global": self.next_global}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.next_global = int(state["next_global"])

    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> ListSource:
        return ListSource(
            self._datasets,
            self.all_pointers,
            self.chunk_size,
            lane_id,
            canonical_replicas,
            self.mixture,
        )


def sequential_pointers(datasets: Sequence[Dataset]) -> list[tuple[int, int, int]]:
    return [
        (d, s, i)
        for d, ds in enumerate(datasets)
        for s, n in enumerate(ds.counts())
        for i in range(n)
    ]


def lane_of(index: int, chunk_size: int, replicas: int) -> int:
    return (index // chunk_size) % replicas


def run(pipe: Pipeline) -> list[Any]:
    return list(pipe)


def closing_refs(records: Sequence[SampleRecord]) -> list[tuple[int, int]]:
    """Base offsets closed by the delivered records, one entry per closing ref."""
    out = []
    for r in records:
        for ref in r.meta.contributors:
            if ref.is_last_child:
                out.append((ref.cursor.chunk_id, ref.cursor.chunk_offset))
    return out


def packing(record: SampleRecord) -> Mapping[str, Any]:
    return record.meta.tags[TAG_PACKING]


def has_contributors(record: SampleRecord) -> bool:
    return TAG_CONTRIBUTORS in record.meta.tags


def describe(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (str(value.dtype), hashlib.sha1(value.tobytes()).hexdigest())
    if isinstance(value, dict):
        return sorted((k, describe(v)) for k, v in value.items())
    if isinstance(value, list):
        return [describe(v) for v in value]
    return value


def digest(items) -> list[Any]:
    out = []
    for item in items:
        records = item.records if isinstance(item, SampleBatch) else [item]
        for r in records:
            tags = r.meta.tags
            out.append(
                (
                    r.meta.lane_id,
                    r.meta.cursor,
                    tuple(tags.get(TAG_CONTRIBUTORS, ())),
                    describe(dict(tags.get(TAG_PACKING, {}))),
                    describe(r.payload),
                )
            )
    return out
