"""A torch ``IterableDataset`` over a pipeline, resumable through ``state_dict``.

It works as the dataset of a plain ``torch.utils.data.DataLoader`` and of torchdata's
``StatefulDataLoader``: ``state_dict()`` is the pipeline checkpoint for exactly what this
dataset has yielded, and ``load_state_dict()`` restores it before the next iteration. With
DataLoader workers, each worker runs a disjoint subset of the rank's lanes (so the number of
lanes per rank must divide by the number of workers); torch is imported lazily and is optional.

``rows=True`` yields single rows instead of the pipeline's batches, for frameworks that batch
themselves (a DataLoader with ``batch_size``, Hugging Face ``Trainer``): the state is still taken
per pipeline batch, plus how many of its rows were already yielded.

``endless=True`` makes one iteration go on from pass to pass (each the pipeline's next epoch),
so data-parallel ranks, whose passes differ in length, never end an iteration at different
steps; the training loop's step limit ends it.

``accumulation_steps=n`` hands out each pass in whole groups of ``n`` pipeline batches (one
optimizer step of gradient accumulation), as ``PipelineDataLoader`` does: the fewer than ``n``
left at a pass end are left out of it, so no group spans two passes. The group is read before
its first item is handed out; the state is the checkpoint before the group plus how many of its
items (or rows) were handed out, so a state taken inside a group resumes the same group.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from zephon._engine.plan.runner_traits import REFERENCE, REGISTRY
from zephon._optional import require
from zephon.errors import CheckpointError, ConfigError

if TYPE_CHECKING:
    from zephon.pipeline import Pipeline

try:  # torch is optional: the class is only defined when it is installed
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError:  # pragma: no cover - exercised when torch is absent
    IterableDataset = object  # type: ignore[misc,assignment]
    get_worker_info = None  # type: ignore[assignment]

__all__ = [
    "GROUP_STATE_FORMAT",
    "ROWS_STATE_FORMAT",
    "PipelineDataset",
    "hf_tensors",
    "worker_pipeline",
]

ROWS_STATE_FORMAT = "zephon-rows-state"
GROUP_STATE_FORMAT = "zephon-group-state"
log = logging.getLogger("zephon")
# Keys of to_training's output that describe the whole batch, not one row.
_BATCH_LEVEL_KEYS = frozenset({"cu_seqlens", "cu_seq_lens_q", "cu_seq_lens_k"})


def worker_pipeline(pipeline: Pipeline, worker_id: int, num_workers: int) -> Pipeline:
    """The view of ``pipeline`` that DataLoader worker ``worker_id`` of ``num_workers`` runs.

    It runs the rank's lanes ``worker_id::num_workers`` (in the rank's round-robin order), so
    the workers together deliver each lane once, and reading one item from each worker in turn
    is the rank's own round-robin: the batch order does not depend on the worker count.
    """
    if num_workers < 1:  # no DataLoader workers: the pipeline runs in the consumer's process
        return pipeline
    opts = pipeline.runtime_options
    lanes_per_rank = opts.canonical_replicas // opts.dp_world_size
    if lanes_per_rank % num_workers:
        raise ConfigError(
            f"{num_workers} DataLoader workers cannot split the {lanes_per_rank} lanes of this "
            "rank evenly; use a worker count that divides it"
        )
    # a DataLoader worker (even the only one) is daemonic: it cannot start processes, so it
    # runs the reference, without lane workers or an engine process of its own
    runner = REFERENCE if REGISTRY[opts.runner].starts_processes else opts.runner
    return copy.copy(pipeline).options(
        runner=runner,
        lane_workers=None,
        engine_process=False,
        _worker_share=(worker_id, num_workers),
    )


def check_accumulation_steps(value: object, owner: str) -> int:
    """``value`` as a group size, or a ConfigError naming ``owner``."""
    if isinstance(value, bool) or not (isinstance(value, int) and value >= 1):
        raise ConfigError(f"{owner}: accumulation_steps must be an integer >= 1, got {value!r}")
    return value


def hf_tensors(item: Any) -> dict[str, Any]:
    """A batch as Hugging Face causal-LM tensors (``to_training(convention="hf")``): the default
    transform of ``rows=True`` and of the framework integrations."""
    return dict(item.to_training(convention="hf", return_tensors="pt"))


def _split_rows(out: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One dict per row of a transformed batch; batch-level keys and scalars are dropped."""
    per_row = {
        k: v for k, v in out.items() if k not in _BATCH_LEVEL_KEYS and getattr(v, "ndim", 0) >= 1
    }
    if not per_row:
        raise ConfigError("rows=True: the transform returned no per-row arrays to split")
    count = len(next(iter(per_row.values())))
    return [{k: v[i] for k, v in per_row.items()} for i in range(count)]


def _refuse_accelerate_resharding(pipeline: Pipeline) -> None:
    """Raise when accelerate shards or dispatches a pipeline that already holds one rank's lanes.

    accelerate's wrappers for iterable datasets assume every process reads the same stream;
    a zephon pipeline built with ``dp_rank`` reads only its own lanes, so they would drop or
    repeat lanes without a word.
    """
    opts = pipeline.runtime_options
    if opts.dp_world_size <= 1 or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == "accelerate.data_loader":
            raise ConfigError(
                f"accelerate is sharding or dispatching a zephon pipeline that already holds only "
                f"rank {opts.dp_rank}'s lanes (dp_world_size={opts.dp_world_size}), so lanes "
                "would be dropped or repeated; use zephon.integrations.transformers.ZephonTrainer"
                " with Trainer, or zephon.integrations.accelerate.prepare_pipeline instead of "
                "Accelerator.prepare"
            )
        frame = frame.f_back  # type: ignore[assignment]


class PipelineDataset(IterableDataset):  # type: ignore[misc,type-arg]
    """Yields the pipeline's items (or ``transform(item)``), resumable via state_dict."""

    def __init__(
        self,
        pipeline: Pipeline,
        transform: Callable[[Any], Any] | None = None,
        *,
        rows: bool = False,
        endless: bool = False,
        accumulation_steps: int = 1,
    ) -> None:
        if get_worker_info is None:
            require("torch", "to_torch_dataset")
        self.pipeline = pipeline
        self.rows = rows
        self.endless = endless
        self.accumulation_steps = check_accumulation_steps(accumulation_steps, "to_torch_dataset")
        self.left_out = 0  # batches left out at pass ends in this process (partial groups)
        self.transform = hf_tensors if rows and transform is None else transform
        self._worker_pipeline: Pipeline | None = None
        self._pending: Mapping[str, Any] | None = None
        self._batch_start: dict[str, Any] | None = None  # rows: checkpoint before the batch
        self._rows_taken = 0  # rows: rows of the current batch already yielded
        self._epoch: int | None = None  # set_epoch since the last load_state_dict

    def _pipeline_for_worker(self) -> Pipeline:
        info = get_worker_info() if get_worker_info is not None else None
        if info is None:
            return self.pipeline
        if self.accumulation_steps > 1 and info.num_workers > 1:
            raise ConfigError(
                f"to_torch_dataset(accumulation_steps={self.accumulation_steps}) with "
                f"{info.num_workers} DataLoader workers: the DataLoader interleaves the workers' "
                "items, so a group could mix two passes; use num_workers=0 or 1, or "
                "zephon.torch_loader.PipelineDataLoader(num_workers=..., accumulation_steps=...)"
            )
        if self._worker_pipeline is None:
            self._worker_pipeline = worker_pipeline(self.pipeline, info.id, info.num_workers)
        return self._worker_pipeline

    def __iter__(self) -> Iterator[Any]:
        pipe = self._pipeline_for_worker()
        _refuse_accelerate_resharding(pipe)
        pending, self._pending = self._pending, None
        skip = 0
        if pending is not None and pending.get("format") == ROWS_STATE_FORMAT:
            skip = int(pending["rows_taken"])
            pending = pending["checkpoint"]
        elif pending is not None and pending.get("format") == GROUP_STATE_FORMAT:
            self._check_group_state(pending)
            skip = int(pending["taken"])
            pending = pending["checkpoint"]
        if pending is not None:
            pipe.restore(pending)
            if self._epoch is not None:  # set after the load: continue, start or refuse
                pipe.set_epoch(self._epoch)
        if not self.endless:
            return self._one_pass(pipe, skip)
        return self._passes(pipe, skip, fresh=pending is None)

    def _one_pass(self, pipe: Pipeline, skip: int) -> Iterator[Any]:
        if self.accumulation_steps > 1:
            return self._iter_groups(pipe, skip)
        return self._iter_rows(pipe, skip) if self.rows else self._iter_items(pipe)

    def _passes(self, pipe: Pipeline, skip: int, *, fresh: bool) -> Iterator[Any]:
        """Pass after pass of ``pipe`` (``endless``): each the next epoch. ``fresh``: the
        first pass starts at its beginning (a pass that does and holds nothing is refused)."""
        while True:
            yielded = 0
            for yielded, item in enumerate(  # noqa: B007 - the count is read after the loop
                self._one_pass(pipe, skip), 1
            ):
                yield item
            if fresh and not yielded:
                raise ConfigError(
                    f"endless=True: pass {pipe.epoch} of this view's lanes handed out no item "
                    f"(accumulation_steps={self.accumulation_steps}), so the stream would never "
                    "deliver; check the data, or use fewer accumulation steps"
                )
            skip, fresh = 0, True
            pipe.set_epoch(pipe.epoch + 1)

    def _iter_items(self, pipe: Pipeline) -> Iterator[Any]:
        transform = self.transform
        for item in pipe:
            yield item if transform is None else transform(item)

    def _iter_rows(self, pipe: Pipeline, skip: int) -> Iterator[Any]:
        assert self.transform is not None
        self._batch_start, self._rows_taken = pipe.checkpoint(), skip
        for item in pipe:
            rows = _split_rows(self.transform(item))
            after = pipe.checkpoint()
            for index in range(skip, len(rows)):
                if index == len(rows) - 1:  # the batch is used up: no rows to skip on restore
                    self._batch_start, self._rows_taken = after, 0
                else:
                    self._rows_taken = index + 1
                yield rows[index]
            skip = 0
            self._batch_start, self._rows_taken = after, 0

    def _iter_groups(self, pipe: Pipeline, skip: int) -> Iterator[Any]:
        """Whole groups of ``accumulation_steps`` batches (their rows with ``rows``), the
        first ``skip`` items or rows of the first group left out (handed out before a
        restore); a partial last group of the pass is left out of it."""
        self._batch_start, self._rows_taken = pipe.checkpoint(), skip
        group: list[Any] = []
        for item in pipe:
            group.append(item)
            if len(group) < self.accumulation_steps:
                continue
            units = [unit for batch in group for unit in self._units(batch)]
            after = pipe.checkpoint()
            for index in range(skip, len(units)):
                if index == len(units) - 1:  # the group is used up: nothing to re-read
                    self._batch_start, self._rows_taken = after, 0
                else:
                    self._rows_taken = index + 1
                yield units[index]
            skip, group = 0, []
            self._batch_start, self._rows_taken = after, 0
        if group:
            self.left_out += len(group)
            log.info(
                "zephon: pass %d of rank %d ends with %d batch(es), fewer than "
                "accumulation_steps=%d: left out of that pass",
                pipe.epoch,
                pipe.runtime_options.dp_rank,
                len(group),
                self.accumulation_steps,
            )

    def _units(self, item: Any) -> list[Any]:
        """What one pipeline batch hands out: itself (transformed) or its rows."""
        if self.rows:
            assert self.transform is not None
            return _split_rows(self.transform(item))
        return [item if self.transform is None else self.transform(item)]

    def _check_group_state(self, state: Mapping[str, Any]) -> None:
        saved = (int(state["accumulation_steps"]), bool(state["rows"]))
        if saved != (self.accumulation_steps, self.rows):
            raise CheckpointError(
                f"the dataset state was saved with accumulation_steps={saved[0]}, "
                f"rows={saved[1]}; load it into to_torch_dataset(accumulation_steps={saved[0]}, "
                f"rows={saved[1]})"
            )

    def state_dict(self) -> dict[str, Any]:
        if self._pending is not None:  # loaded and not iterated since: that is the position
            return dict(self._pending)
        if self.accumulation_steps > 1:
            start = self._batch_start
            if start is None:  # not iterated yet
                start = self._pipeline_for_worker().checkpoint()
            return {
                "format": GROUP_STATE_FORMAT,
                "checkpoint": start,
                "taken": self._rows_taken,
                "accumulation_steps": self.accumulation_steps,
                "rows": self.rows,
            }
        if not self.rows:
            return self._pipeline_for_worker().checkpoint()
        start = self._batch_start
        if start is None:  # not iterated yet
            start = self._pipeline_for_worker().checkpoint()
        return {"format": ROWS_STATE_FORMAT, "checkpoint": start, "rows_taken": self._rows_taken}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._pending = state
        self._batch_start, self._rows_taken = None, 0
        self._epoch = None  # the state carries its epoch

    def set_epoch(self, epoch: int) -> None:
        """The next iteration is pass ``epoch`` over the data (``Pipeline.set_epoch``); call it
        before each epoch, before the DataLoader starts its workers. After
        ``load_state_dict`` it continues the saved epoch if it is the same, starts ``epoch``
        if the saved one was complete, and refuses to skip the rest of an unfinished one."""
        self._epoch = epoch
        if self._pending is None:
            self.pipeline.set_epoch(epoch)
            if self._worker_pipeline is not None:
                self._worker_pipeline.set_epoch(epoch)
