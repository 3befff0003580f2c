"""One task: run the document operators over a part of an input shard and write one shard.

The rows go through the pipeline's own operators (the inline runner over a view of the part),
so a converted document has exactly the tokens a training run of the same pipeline would have
made. The files are written ``.idx`` last (see :class:`Out`): a shard whose ``.idx`` exists is
whole; a killed task leaves only temporary files or none.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from zephon.convert._out import Out
from zephon.convert._plan import Plan, Task
from zephon.errors import DataFormatError
from zephon.io import Dataset, Row, Shard
from zephon.io._converted import MASK_SUFFIX, ORIGIN_SUFFIX
from zephon.io._megatron import index_bytes

#: Per process: the plan's datasets, opened once (a worker serves many tasks).
_OPENED: dict[int, tuple[Plan, list[Dataset]]] = {}

#: Documents between two polls of ``stop`` inside a task.
STOP_POLL_EVERY = 16


class ConvertStopped(Exception):
    """``stop()`` asked the conversion to end; the finished shards are recorded."""


class PartView(Shard):
    """Rows ``[start, stop)`` of a shard, as a shard of their own (read lazily)."""

    def __init__(self, base: Shard, start: int, stop: int) -> None:
        self.base, self.start, self.stop = base, start, stop

    @property
    def location(self) -> str:
        return self.base.location

    def __len__(self) -> int:
        return self.stop - self.start

    def read(self, indices: Sequence[int]) -> list[Row]:
        return self.base.read([self.start + int(i) for i in indices])


def _datasets(plan: Plan) -> list[Dataset]:
    key = id(plan)
    if key not in _OPENED:
        _OPENED.clear()
        _OPENED[key] = (plan, plan.config.open_datasets())
    return _OPENED[key][1]


def _records(
    plan: Plan, task: Task, stop: Callable[[], bool] | None
) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
    """Tokens, masks and part-relative rows of every document the task produces, in order;
    raises :class:`ConvertStopped` when ``stop()`` says so (nothing is written yet)."""
    dataset = _datasets(plan)[task.dataset]
    part = Dataset(dataset.name, [PartView(dataset.shards[task.shard], task.start, task.stop)])
    pipe = plan.config.build_on([part], source={"shuffle_shards": False, "stop_after_passes": 1})
    pipe.options(runner="inline")
    tokens: list[np.ndarray] = []
    masks: list[np.ndarray] = []
    rows: list[int] = []
    field, mask_field = plan.output_field, plan.mask_field
    for record in pipe:
        if stop is not None and len(rows) % STOP_POLL_EVERY == 0 and stop():
            raise ConvertStopped
        payload = record.payload
        tokens.append(np.asarray(payload[field]))
        if mask_field is not None:
            masks.append(np.asarray(payload[mask_field], dtype=np.uint8))
        rows.append(int(record.meta.cursor.sample_id[2]))
    return tokens, masks, rows


def _lines(shard: Shard, rows: list[int]) -> list[int] | None:
    lines = getattr(shard, "lines", None)
    if not callable(lines):
        return None
    table = lines()
    return None if table is None else [int(table[r]) for r in rows]


def _checked(tokens: np.ndarray, dtype: np.dtype[Any], task: Task, where: str) -> np.ndarray:
    if len(tokens) and np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        low, high = int(tokens.min()), int(tokens.max())
        if low < info.min or high > info.max:
            wide = "int64" if dtype == np.dtype(np.int32) else "int32"
            raise DataFormatError(
                f"shard {task.name} (from {where}): token id {high if high > info.max else low} "
                f"does not fit dtype {dtype}; set the dtype option to {wide} (zephon convert "
                f"--dtype {wide}, or convert(..., dtype={wide!r}))",
                location=where,
            )
    return tokens.astype(dtype, copy=False)


def run_task(
    plan: Plan, task: Task, out: Out, stop: Callable[[], bool] | None = None
) -> dict[str, Any]:
    """Convert one part and write its files into ``out``; returns its manifest entry."""
    tokens, masks, rel_rows = _records(plan, task, stop)
    shard = _datasets(plan)[task.dataset].shards[task.shard]
    dtype = np.dtype(plan.dtype)
    flat = np.concatenate(tokens) if tokens else np.zeros(0, np.int64)
    flat = _checked(flat, dtype, task, shard.location)
    rows = [task.start + r for r in rel_rows]
    origin = {
        "dataset": _datasets(plan)[task.dataset].name,
        "source": shard.location,
        "rows": rows,
        "lines": _lines(shard, rows),
    }
    lengths = np.array([len(t) for t in tokens], dtype=np.int32)
    parts = [(".bin", flat.tobytes()), (ORIGIN_SUFFIX, json.dumps(origin).encode())]
    if plan.mask_field is not None:
        mask = np.concatenate(masks) if masks else np.zeros(0, np.uint8)
        parts.append((MASK_SUFFIX, mask.astype(np.uint8).tobytes()))
    parts.append((".idx", index_bytes(lengths, dtype)))  # last: the shard is whole
    out.write_shard(task.name, parts)
    return {
        "name": task.name,
        "dataset": origin["dataset"],
        "source": shard.location,
        "rows": [task.start, task.stop],
        "documents": len(lengths),
        "tokens": int(lengths.sum()),
        "dtype": str(dtype),
        "mask": plan.mask_field is not None,
    }
