"""Where a pipeline's samples live: dataset names, shard files and JSON Lines line numbers.

A sample id ``(dataset, shard, row)`` is all a record carries; this turns it into what a person
looks up (``books``, ``data/books-0003.jsonl``, line 17). Line tables are built once per shard
and shared by every batch of the run, so resolving a segment costs a few lookups.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from zephon._image_fields import IMAGE_FIELDS
from zephon.io import Dataset
from zephon.provenance._cuts import CutLengths, Inputs

__all__ = ["Origin"]


class Origin:
    """Names, files, lines and extra fields (capture rollouts) of a list of datasets.

    ``inputs`` (a pipeline's) builds, on first use, what re-runs its records up to a stage,
    so provenance finds the whole length of documents its truncation cut; an origin of bare
    datasets knows of no cut. ``image_fields``: the fields the pipeline decodes images from,
    in its order (``decode_image``'s), which names the field each image of a sample came from;
    ``None``: ``decode_image``'s default fields."""

    def __init__(
        self,
        datasets: Sequence[Dataset],
        inputs: Callable[[], Inputs] | None = None,
        image_fields: Sequence[str] | None = None,
    ) -> None:
        self.datasets = list(datasets)
        self.image_fields = tuple(image_fields) if image_fields is not None else IMAGE_FIELDS
        self.names = [d.name for d in self.datasets]
        self._lines: dict[tuple[int, int], np.ndarray | None] = {}
        self._lock = threading.Lock()
        self._inputs = inputs
        self._cuts: CutLengths | None = None

    @classmethod
    def of(cls, thing: Any) -> Origin:
        """The origin of a pipeline, a work source, an origin or a list of datasets."""
        if isinstance(thing, Origin):
            return thing
        origin = getattr(thing, "provenance_origin", None)
        if callable(origin):
            return origin()  # type: ignore[no-any-return]
        datasets = getattr(thing, "datasets", None)
        if datasets is not None:
            return cls(datasets)
        if isinstance(thing, Sequence) and all(isinstance(d, Dataset) for d in thing):
            return cls(thing)
        raise TypeError(
            f"cannot find datasets in {type(thing).__name__}; pass the Pipeline, its work "
            "source or its list of datasets"
        )

    def cut_lengths(self) -> CutLengths | None:
        """The pipeline's counter of what truncation cut, or None (no truncating tokenize)."""
        if self._inputs is not None:
            with self._lock:
                if self._inputs is not None:
                    self._cuts, self._inputs = CutLengths.of(self._inputs()), None
        return self._cuts

    def name(self, dataset_id: int) -> str:
        if 0 <= dataset_id < len(self.names):
            return self.names[dataset_id]
        return f"dataset#{dataset_id}"

    def location(self, dataset_id: int, shard_id: int) -> str:
        if 0 <= dataset_id < len(self.datasets):
            shards = self.datasets[dataset_id].shards
            if 0 <= shard_id < len(shards):
                return shards[shard_id].location
        return f"<dataset {dataset_id} shard {shard_id}>"

    def line_table(self, dataset_id: int, shard_id: int) -> np.ndarray | None:
        """1-based line of every row of a JSON Lines shard; ``None`` for other formats."""
        key = (dataset_id, shard_id)
        if key in self._lines:
            return self._lines[key]
        with self._lock:
            if key not in self._lines:
                self._lines[key] = self._build_table(dataset_id, shard_id)
            return self._lines[key]

    def _build_table(self, dataset_id: int, shard_id: int) -> np.ndarray | None:
        if not 0 <= dataset_id < len(self.datasets):
            return None
        shards = self.datasets[dataset_id].shards
        if not 0 <= shard_id < len(shards):
            return None
        lines = getattr(shards[shard_id], "lines", None)
        return lines() if callable(lines) else None

    def line(self, dataset_id: int, shard_id: int, row: int) -> int | None:
        table = self.line_table(dataset_id, shard_id)
        if table is None or not 0 <= row < len(table):
            return None
        return int(table[row])

    def extra(self, dataset_id: int, shard_id: int, row: int) -> Mapping[str, Any] | None:
        """Fields a shard adds about a row (a capture rollout's id and call ids)."""
        if not 0 <= dataset_id < len(self.datasets):
            return None
        shards = self.datasets[dataset_id].shards
        if not 0 <= shard_id < len(shards):
            return None
        describe = getattr(shards[shard_id], "provenance_of", None)
        return describe(row) if callable(describe) else None

    def source_of(
        self, dataset_id: int, shard_id: int, row: int
    ) -> tuple[str, str, int, int | None] | None:
        """``(dataset, file, row, line)`` of the document a converted corpus's row was tokenized
        from (``zephon convert`` keeps it in a sidecar); ``None`` for every other shard."""
        if not 0 <= dataset_id < len(self.datasets):
            return None
        shards = self.datasets[dataset_id].shards
        if not 0 <= shard_id < len(shards):
            return None
        lookup = getattr(shards[shard_id], "source_of", None)
        return lookup(row) if callable(lookup) else None  # type: ignore[no-any-return]

    def read(self, dataset_id: int, shard_id: int, row: int) -> Mapping[str, Any]:
        """The source row itself (for previews and checks)."""
        return self.datasets[dataset_id].read(shard_id, [row])[0]
