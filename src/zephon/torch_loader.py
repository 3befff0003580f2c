"""A DataLoader over one rank's pipeline whose state is exactly what its consumer received.

Frameworks read ahead: a DataLoader's workers prefetch, a trainer fetches every batch of a
gradient-accumulation step before the first backward pass. A ``StatefulDataLoader`` snapshot
taken at the optimizer step is therefore a position the model has not reached. Here every item
travels with the checkpoint of the worker pipeline that produced it (workers pay that cost, off
the training thread), and :meth:`PipelineDataLoader.state_dict` answers for the last item handed
out. Without workers the pipeline runs in the consumer's process and nothing runs ahead, so the
state is taken only when asked for.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zephon._optional import require
from zephon.errors import CheckpointError
from zephon.torch_data import worker_pipeline

if TYPE_CHECKING:
    from zephon.pipeline import Pipeline

try:  # torch is optional: the classes are only usable when it is installed
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ImportError:  # pragma: no cover - exercised when torch is absent
    DataLoader = None  # type: ignore[assignment,misc]
    IterableDataset = object  # type: ignore[misc,assignment]
    get_worker_info = None  # type: ignore[assignment]

__all__ = ["LOADER_STATE_FORMAT", "PipelineDataLoader", "merge_loader_states"]

LOADER_STATE_FORMAT = "zephon-loader-state"
# A start position: from the beginning, one checkpoint for every view, or one per view.
_Start = Mapping[str, Any] | Sequence[Mapping[str, Any]] | None


class _WorkerDone:
    """A worker's last item: its lanes are used up."""


_WORKER_DONE = _WorkerDone()


def _identity(item: Any) -> Any:
    return item


class _StampedDataset(IterableDataset):  # type: ignore[misc,type-arg]
    """Yields ``(worker_id, checkpoint_after_item, transform(item))`` from a worker's lanes."""

    def __init__(
        self, pipeline: Pipeline, transform: Callable[[Any], Any] | None, *, stamp: bool
    ) -> None:
        self.pipeline = pipeline
        self.transform = transform
        self.stamp = stamp  # stamp items without workers too (a consumer that reads ahead)
        self.pending: _Start = None

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any] | None, Any]]:
        info = get_worker_info()
        worker, workers = (0, 0) if info is None else (info.id, info.num_workers)
        pipe = worker_pipeline(self.pipeline, worker, workers)
        pending = self.pending
        if isinstance(pending, Sequence):
            pending = pending[worker]
        if pending is not None:
            pipe.restore(pending)
        transform = self.transform
        for item in pipe:
            state = pipe.checkpoint() if workers or self.stamp else None
            yield worker, state, item if transform is None else transform(item)
        if workers:
            yield worker, None, _WORKER_DONE


class PipelineDataLoader:
    """Iterates the transformed items of ``pipeline`` (one rank's view) through a torch
    ``DataLoader``; ``state_dict()`` is the position just after the last item it yielded.

    ``num_workers`` runs disjoint shares of the rank's lanes in DataLoader worker processes (it
    must divide the rank's lane count). ``device`` moves tensors there as they are handed out.
    ``history`` keeps the position after each of the last ``history`` items handed out, for a
    consumer that reads ahead of what it trains (``state_dict(upto=index)``); without workers
    that takes a checkpoint per item. The remaining keyword arguments go to
    ``torch.utils.data.DataLoader``.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        transform: Callable[[Any], Any] | None = None,
        *,
        num_workers: int = 0,
        device: Any = None,
        history: int = 0,
        **dataloader_kwargs: Any,
    ) -> None:
        require("torch", "PipelineDataLoader")
        self.pipeline = pipeline
        self.num_workers = num_workers
        self.device = device
        self._dataset = _StampedDataset(pipeline, transform, stamp=history > 0)
        # (index of an item handed out, each view's state after it, the turn after it)
        self._history: deque[tuple[int, dict[int, dict[str, Any]], int]] = deque(maxlen=history)
        self._dataloader_kwargs = dataloader_kwargs
        if num_workers:
            worker_pipeline(pipeline, 0, num_workers)  # refuse a worker count that cannot split
        self._restored: _Start = None  # loaded, for the next iteration
        self._start: _Start = None  # where the current (or last) iteration started
        self._latest: dict[int, dict[str, Any]] = {}
        self._start_turn = 0  # the worker whose item comes first in the next iteration
        self._turn = 0  # the worker whose item comes next
        self.items_yielded = 0  # items handed out by this loader, over all its iterations

    def __iter__(self) -> Iterator[Any]:
        self._dataset.pending = self._start = self._restored
        self._restored = None
        self._latest = {}
        self._history.clear()
        self._turn = self._start_turn
        loader = DataLoader(
            self._dataset,
            batch_size=None,
            collate_fn=_identity,
            num_workers=self.num_workers,
            **self._dataloader_kwargs,
        )
        items = loader if self.num_workers == 0 else self._in_turn(loader)
        for worker, state, payload in items:
            if state is not None:
                self._latest[worker] = state
            if self._history.maxlen:
                self._history.append((self.items_yielded, dict(self._latest), self._turn))
            self.items_yielded += 1
            yield payload if self.device is None else _to_device(payload, self.device)

    def _in_turn(self, loader: Any) -> Iterator[tuple[int, dict[str, Any] | None, Any]]:
        """The workers' items in strict rotation from ``self._turn``.

        torch's DataLoader always starts its rotation at worker 0; a resumed loader starts at
        the worker whose turn was next, so it holds back at most one item per worker.
        """
        workers = self.num_workers
        queues: list[deque[tuple[dict[str, Any] | None, Any]]] = [deque() for _ in range(workers)]
        done = [False] * workers
        for worker, state, payload in loader:
            if isinstance(payload, _WorkerDone):
                done[worker] = True
            else:
                queues[worker].append((state, payload))
            while not all(done) or any(queues):
                turn = self._turn
                if queues[turn]:
                    state, payload = queues[turn].popleft()
                    self._turn = (turn + 1) % workers
                    yield turn, state, payload
                elif done[turn]:
                    self._turn = (turn + 1) % workers
                else:
                    break  # wait for this worker's next item

    def _start_state(self, worker: int, start: _Start) -> dict[str, Any]:
        """Where worker ``worker``'s view starts from ``start``, as that view's checkpoint."""
        pipe = copy.copy(worker_pipeline(self.pipeline, worker, self.num_workers))
        if isinstance(start, Sequence):
            start = start[worker]
        if start is not None:
            pipe.restore(start)
        return pipe.checkpoint()

    def state_dict(self, upto: int | None = None) -> dict[str, Any]:
        """The checkpoints of this rank's pipeline views (one per DataLoader worker), JSON-safe.

        By default the position after the last item handed out; ``upto=i`` (with ``history``)
        the position after item ``i`` (``items_yielded - 1`` is the last one).
        :func:`merge_loader_states` over every rank's state gives one pipeline checkpoint that
        any world size restores.
        """
        if upto is not None:
            return self._state_after(upto)
        if self._restored is not None:  # loaded and not iterated since
            states = [self._start_state(w, self._restored) for w in range(self._views)]
        elif self.num_workers == 0:
            states = [self.pipeline.checkpoint()]
        else:
            states = [
                self._latest[w] if w in self._latest else self._start_state(w, self._start)
                for w in range(self.num_workers)
            ]
        turn = self._start_turn if self._restored is not None else self._turn
        return {"format": LOADER_STATE_FORMAT, "version": 1, "checkpoints": states, "turn": turn}

    def _state_after(self, index: int) -> dict[str, Any]:
        for seen, latest, turn in self._history:
            if seen == index:
                states = [
                    latest[w] if w in latest else self._start_state(w, self._start)
                    for w in range(self._views)
                ]
                return {"format": LOADER_STATE_FORMAT, "version": 1, "checkpoints": states,
                        "turn": turn}  # fmt: skip
        kept = [seen for seen, _, _ in self._history]
        raise CheckpointError(
            f"state_dict(upto={index}): the loader keeps the positions after items "
            f"{kept[:1] + kept[-1:] if kept else 'none'} (history={self._history.maxlen}); "
            "raise history to cover how far the consumer reads ahead"
        )

    def _turn_in(self, saved: Any) -> int:
        """This rank's worker rotation in a merged state saved with the same world and workers."""
        opts = self.pipeline.runtime_options
        if not isinstance(saved, Mapping) or saved.get("views_per_rank") != self._views:
            return 0
        turns = saved.get("turns")
        if not isinstance(turns, list) or len(turns) != opts.dp_world_size:
            return 0
        return int(turns[opts.dp_rank]) % self._views

    @property
    def _views(self) -> int:
        return max(1, self.num_workers)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` at the next iteration: a loader state (this rank's, with the
        same worker count, or merged), or a pipeline checkpoint (merged over ranks, or this
        rank's own)."""
        self._start_turn = 0
        if state.get("format") != LOADER_STATE_FORMAT:
            self._restored = state
            self._start_turn = self._turn_in(state.get("loader"))
        elif len(state["checkpoints"]) == self._views:
            self._restored = list(state["checkpoints"])
            self._start_turn = int(state.get("turn", 0)) % self._views
        else:
            self._restored = merge_loader_states([state])
        self._latest = {}


def merge_loader_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One pipeline checkpoint from the loader states of every rank, in rank order.

    It restores on any world size; on the same world size and worker count, each rank's
    worker rotation also continues where it was (kept under ``"loader"``).
    """
    from zephon import merge_checkpoints
    from zephon.checkpoints import seal

    checkpoints: list[Mapping[str, Any]] = []
    for state in states:
        if state.get("format") != LOADER_STATE_FORMAT:
            raise CheckpointError(
                f"not a PipelineDataLoader state (format={state.get('format')!r})"
            )
        checkpoints.extend(state["checkpoints"])
    merged = merge_checkpoints(checkpoints)
    workers = {len(state["checkpoints"]) for state in states}
    if len(workers) == 1:
        turns = [int(state.get("turn", 0)) for state in states]
        merged["loader"] = {"views_per_rank": workers.pop(), "turns": turns}
    return seal(merged)


def _to_device(payload: Any, device: Any) -> Any:
    if hasattr(payload, "to"):
        return payload.to(device)
    if isinstance(payload, Mapping):
        return {k: _to_device(v, device) for k, v in payload.items()}
    return payload
