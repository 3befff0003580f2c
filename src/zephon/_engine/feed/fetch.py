"""fetch: turn sample pointers into rows, reading each shard once per micro-batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter, itemgetter
from typing import Any, Literal

from zephon.errors import DataError, DataFormatError
from zephon.io import Dataset, InMemoryShard
from zephon.ops import Accumulator, BaseOp, CountingAccumulator, OpContext, OpTraits
from zephon.types import SampleMeta, SampleRecord, StreamItem, Tombstone, tombstone_meta

FETCH_MICRO_BATCH = 64
FETCH_LATENCY_MS = 5.0
_META_OF = attrgetter("meta")
_ID_OF = attrgetter("sample_id")
_SHARD_OF = itemgetter(0, 1)
_ROW_OF = itemgetter(2)


class FetchOp(BaseOp):
    """Reads the payload of each pointer record (implicit first operator of every pipeline).

    ``on_error="skip"`` turns an unreadable row into a tombstone that says where the row is
    (dataset, shard, row, file, line) and why it was skipped; the engine logs, counts and
    quarantines it instead of failing the pipeline.
    """

    name = "fetch"

    def __init__(
        self,
        datasets: Sequence[Dataset],
        *,
        max_batch: int = FETCH_MICRO_BATCH,
        on_error: Literal["raise", "skip"] = "raise",
    ) -> None:
        super().__init__()
        self.datasets = list(datasets)
        self.max_batch = max_batch
        self.on_error = on_error

    def pin_files(self) -> None:
        """Record every shard's file as it is now, before any worker reads it: each fetch
        compares against this, so a file changed during the run stops it."""
        for dataset in self.datasets:
            for shard in dataset.shards:
                shard.pin()

    def teardown(self) -> None:
        for dataset in self.datasets:
            for shard in dataset.shards:
                shard.release()

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return CountingAccumulator(self.max_batch, None if deterministic else FETCH_LATENCY_MS)

    def traits(self) -> OpTraits:
        # Two readers overlap file and network reads, which release the GIL; rows already
        # held in memory are copied under it, so a second reader could only wait.
        in_memory = all(isinstance(s, InMemoryShard) for d in self.datasets for s in d.shards)
        return OpTraits(
            preserves_cursor_order=True, parallelism=1 if in_memory else 2, elementwise=True
        )

    def config(self) -> Mapping[str, Any]:
        # on_error is left out on purpose: a run that raised never delivered the record a
        # later "skip" drops, so switching raise -> skip on resume agrees with history.
        return {"datasets": [d.name for d in self.datasets]}

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        if not elems:
            return []
        metas = list(map(_META_OF, elems))
        ids = list(map(_ID_OF, metas))
        shards = list(map(_SHARD_OF, ids))
        if shards.count(shards[0]) == len(shards):  # one shard: the usual micro-batch
            return self._read(shards[0], metas, list(map(_ROW_OF, ids)))
        groups: dict[tuple[int, int], list[int]] = {}
        for pos, key in enumerate(shards):
            groups.setdefault(key, []).append(pos)
        out: list[StreamItem] = [elems[0]] * len(elems)
        for key, positions in groups.items():
            part = [metas[p] for p in positions]
            read = self._read(key, part, [ids[p][2] for p in positions])
            for p, record in zip(positions, read, strict=True):
                out[p] = record
        return out

    def _read(
        self, key: tuple[int, int], metas: list[SampleMeta], indices: list[int]
    ) -> list[StreamItem]:
        """Records of rows ``indices`` of one shard (``key`` = dataset, shard), in order."""
        ds, shard = key
        dataset = self.datasets[ds]
        source = dataset.shards[shard]
        try:
            rows: list[Any] = dataset.read(shard, indices)
        except Exception as exc:
            source.check_unchanged()  # a file changed under the run explains any failure
            if self.on_error == "raise" or not isinstance(exc, DataError):
                raise
            rows = self._read_one_by_one(dataset, shard, indices)
            source.check_unchanged()
            return [
                self._skipped(dataset, shard, meta, row)
                if isinstance(row, _Skipped)
                else SampleRecord(meta, row)
                for meta, row in zip(metas, rows, strict=True)
            ]
        # After the read, not before: rows read from a file that changed meanwhile never leave.
        source.check_unchanged()
        if len(rows) != len(metas):
            raise ValueError(
                f"dataset {dataset.name!r} shard {shard} returned {len(rows)} rows for "
                f"{len(metas)} indices; Shard.read must return one row per index, in order"
            )
        return list(map(SampleRecord, metas, rows))

    @staticmethod
    def _skipped(dataset: Dataset, shard: int, meta: SampleMeta, row: _Skipped) -> SampleRecord:
        reason = f"skipped: {row.reason}"
        info = row.describe(dataset, shard, meta.sample_id[2])
        dead = tombstone_meta(meta, reason=reason).with_control(Tombstone(reason, skipped=info))
        return SampleRecord(dead, None)

    @staticmethod
    def _read_one_by_one(dataset: Dataset, shard: int, indices: list[int]) -> list[Any]:
        rows: list[Any] = []
        for index in indices:
            try:
                rows.append(dataset.read(shard, [index])[0])
            except DataError as exc:
                rows.append(_Skipped(exc))
        return rows


class _Skipped:
    """An unreadable row: the reason, and the file and line when the reader knows them."""

    __slots__ = ("line", "location", "reason")

    def __init__(self, error: DataError) -> None:
        self.reason = error.what if isinstance(error, DataFormatError) else str(error)
        self.location = error.location if isinstance(error, DataFormatError) else None
        self.line = error.line if isinstance(error, DataFormatError) else None

    def describe(self, dataset: Dataset, shard: int, row: int) -> dict[str, Any]:
        location = self.location
        if location is None:
            location = dataset.shards[shard].location
        return {
            "dataset": dataset.name,
            "shard": shard,
            "row": row,
            "file": location,
            "line": self.line,
            "reason": self.reason,
        }
