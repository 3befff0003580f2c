"""A torch ``IterableDataset`` over a pipeline, resumable through ``state_dict``.

It works as the dataset of a plain ``torch.utils.data.DataLoader`` and of torchdata's
``StatefulDataLoader``: ``state_dict()`` is the pipeline checkpoint for exactly what this
dataset has yielded, and ``load_state_dict()`` restores it before the next iteration. With
DataLoader workers, each worker runs a disjoint subset of the rank's lanes (so the number of
lanes per rank must divide by the number of workers); torch is imported lazily and is optional.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from zephon._optional import require
from zephon.errors import ConfigError

if TYPE_CHECKING:
    from zephon.pipeline import Pipeline

try:  # torch is optional: the class is only defined when it is installed
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError:  # pragma: no cover - exercised when torch is absent
    IterableDataset = object  # type: ignore[misc,assignment]
    get_worker_info = None  # type: ignore[assignment]

__all__ = ["PipelineDataset"]


class PipelineDataset(IterableDataset):  # type: ignore[misc,type-arg]
    """Yields the pipeline's items (or ``transform(item)``), resumable via state_dict."""

    def __init__(self, pipeline: Pipeline, transform: Callable[[Any], Any] | None = None) -> None:
        if get_worker_info is None:
            require("torch", "to_torch_dataset")
        self.pipeline = pipeline
        self.transform = transform
        self._worker_pipeline: Pipeline | None = None
        self._pending: Mapping[str, Any] | None = None

    def _pipeline_for_worker(self) -> Pipeline:
        info = get_worker_info() if get_worker_info is not None else None
        if info is None or info.num_workers == 1:
            return self.pipeline
        if self._worker_pipeline is None:
            opts = self.pipeline.runtime_options
            lanes_per_rank = opts.canonical_replicas // opts.dp_world_size
            if lanes_per_rank % info.num_workers:
                raise ConfigError(
                    f"{info.num_workers} DataLoader workers cannot split the {lanes_per_rank} "
                    "lanes of this rank evenly; use a worker count that divides it"
                )
            # Sub-ranks whose lanes partition this rank's lanes under the same mapping.
            if opts.mapping == "contiguous":
                sub_rank = opts.dp_rank * info.num_workers + info.id
            else:
                sub_rank = opts.dp_rank + opts.dp_world_size * info.id
            pipe = copy.copy(self.pipeline)
            pipe.options(
                runner="inline" if opts.runner == "process" else opts.runner,
                dp_rank=sub_rank,
                dp_world_size=opts.dp_world_size * info.num_workers,
            )
            self._worker_pipeline = pipe
        return self._worker_pipeline

    def __iter__(self) -> Iterator[Any]:
        pipe = self._pipeline_for_worker()
        if self._pending is not None:
            pipe.restore(self._pending)
            self._pending = None
        transform = self.transform
        for item in pipe:
            yield item if transform is None else transform(item)

    def state_dict(self) -> dict[str, Any]:
        return self._pipeline_for_worker().checkpoint()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._pending = state
