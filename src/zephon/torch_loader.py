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
import logging
import pickle
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from zephon._optional import require
from zephon.checkpoints import (
    LaneCheckpoint,
    ParsedCheckpoint,
    delivered_counts,
    parse_checkpoint,
)
from zephon.checkpoints.passes import split_later, start_of_pass
from zephon.errors import CheckpointError, ConfigError
from zephon.torch_data import check_accumulation_steps, worker_pipeline
from zephon.work import lanes_for_rank

if TYPE_CHECKING:
    from zephon.pipeline import Pipeline

try:  # torch is optional: the classes are only usable when it is installed
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    from zephon import _shared_batch
except ImportError:  # pragma: no cover - exercised when torch is absent
    DataLoader = None  # type: ignore[assignment,misc]
    IterableDataset = object  # type: ignore[misc,assignment]
    get_worker_info = None  # type: ignore[assignment]

__all__ = ["LOADER_STATE_FORMAT", "PipelineDataLoader", "merge_loader_states"]

LOADER_STATE_FORMAT = "zephon-loader-state"
log = logging.getLogger("zephon")
# A start position: from the beginning, one checkpoint for every view, or one per view.
_Start = Mapping[str, Any] | Sequence[Mapping[str, Any]] | None


class _WorkerDone:
    """A worker's last item: its lanes are used up."""


_WORKER_DONE = _WorkerDone()
# A view's checkpoint after an item: a worker sends it pickled, and the training process
# unpickles only the one a state_dict() asks for, not one per item; without workers, a mark
# of the pipeline that builds it when asked for.
_Stamp = dict[str, Any] | bytes | Callable[[], dict[str, Any]]
# What a worker sends: (worker id, lane, its view's checkpoint after the item, the item).
_Stamped = tuple[int, int, _Stamp | None, Any]


def _identity(item: Any) -> Any:
    return item


class _StampedDataset(IterableDataset):  # type: ignore[misc,type-arg]
    """Yields ``(worker_id, lane, checkpoint_after_item, transform(item))`` from a worker's
    share of the rank's lanes."""

    def __init__(
        self, pipeline: Pipeline, transform: Callable[[Any], Any] | None, *, stamp: int
    ) -> None:
        self.pipeline = pipeline
        self.transform = transform
        self.stamp = stamp  # without workers, stamp every item (1) or none (0)
        self.pending: _Start = None
        self.shm_prefix = ""  # names the shm files of the items of the current iteration

    def __iter__(self) -> Iterator[_Stamped]:
        info = get_worker_info()
        worker, workers = (0, 0) if info is None else (info.id, info.num_workers)
        pipe = worker_pipeline(self.pipeline, worker, workers)
        pending = self.pending
        if isinstance(pending, Sequence):
            pending = pending[worker]
        if pending is not None:
            pipe.restore(pending)
        if not workers:
            yield from self._in_process(pipe)
            return
        transform = self.transform
        for item in pipe:
            state = pickle.dumps(pipe.checkpoint(), protocol=pickle.HIGHEST_PROTOCOL)
            payload = item if transform is None else transform(item)
            payload = _shared_batch.pack(payload, self.shm_prefix)
            yield worker, item.lane_id, state, payload
        yield worker, -1, None, _WORKER_DONE

    def _in_process(self, pipe: Pipeline) -> Iterator[_Stamped]:
        """Without workers: the transform runs where the engine does (in its engine process
        with ``engine_process=True``), and an item's state is a mark built when asked for."""
        items = pipe.iter_training(
            self.transform or _identity, engine_process=pipe.runtime_options.engine_process
        )
        for payload in items:
            yield 0, -1, pipe._mark() if self.stamp else None, payload


class _RankRotation:
    """The rank's round-robin over its running lanes, rebuilt from the items' lanes.

    Each lane's next item is due when it has delivered the fewest items, ties going to the
    first lane in the rank's order: that is the engine's own round-robin, so reading the
    workers' items in this order gives the rank's batch order whatever the worker count.
    """

    def __init__(self, lanes: list[int], counts: Mapping[int, int], workers: int) -> None:
        self.order = [lane for lane in lanes if lane in counts]  # lanes that have not ended
        self.counts = {lane: counts[lane] for lane in self.order}
        self.owner = {lane: index % max(1, workers) for index, lane in enumerate(lanes)}

    def due(self) -> int | None:
        """The lane whose item comes next, or None when every lane has ended."""
        if not self.order:
            return None
        counts, order = self.counts, self.order
        return order[min(range(len(order)), key=lambda i: (counts[order[i]], i))]

    def delivered(self, lane: int) -> None:
        self.counts[lane] += 1

    def ended(self, lane: int) -> None:
        self.order.remove(lane)


class PipelineDataLoader:
    """Iterates the transformed items of ``pipeline`` (one rank's view) through a torch
    ``DataLoader``; ``state_dict()`` is the position just after the last item it yielded.

    ``num_workers`` runs shares of the rank's lanes in DataLoader worker processes (worker
    ``w`` runs lanes ``w::num_workers`` of the rank; the count must divide the rank's lane
    count) and only changes speed: the items come in the rank's own round-robin order, and a
    state saved with one worker count resumes with any other. ``device`` moves tensors there
    as they are handed out. ``history`` keeps the position after each of the last ``history``
    items handed out, for a consumer that reads ahead of what it trains
    (``state_dict(upto=index)``); without workers that takes a checkpoint per item. The
    remaining keyword arguments go to ``torch.utils.data.DataLoader``.

    Each iteration is one pass over the data (:attr:`epoch`); call :meth:`set_epoch` between
    iterations for the next one, as with a ``DistributedSampler``, or pass ``auto_epoch=True``:
    an iteration that starts after its epoch finished then passes the next epoch, so
    ``for epoch in range(n): for batch in loader: ...`` gives n different passes and, after
    ``load_state_dict``, continues the loaded epoch first.

    ``endless=True`` makes one iteration the rank's whole stream, pass after pass (epochs as
    with ``auto_epoch``), so only the consumer's step limit ends it: ranks whose passes differ
    in length never see a pass end at different steps. ``accumulation_steps=n`` hands out each
    pass in whole groups of ``n`` items (one optimizer step of gradient accumulation): the
    fewer than ``n`` items a pass has left after its last whole group are left out of that
    pass (counted in :attr:`left_out`), so no group spans two passes. Take states between
    groups: without workers or ``history`` one inside a group is refused.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        transform: Callable[[Any], Any] | None = None,
        *,
        num_workers: int = 0,
        device: Any = None,
        history: int = 0,
        auto_epoch: bool = False,
        endless: bool = False,
        accumulation_steps: int = 1,
        **dataloader_kwargs: Any,
    ) -> None:
        require("torch", "PipelineDataLoader")
        self.pipeline = pipeline
        self.auto_epoch = auto_epoch or endless
        self.endless = endless
        self.accumulation_steps = check_accumulation_steps(accumulation_steps, "PipelineDataLoader")
        self.left_out = 0  # items left out at pass ends (fewer than one accumulation group)
        self.num_workers = num_workers
        self.device = device
        # a consumer that reads ahead: each item carries its position. Accumulation groups
        # need none: between groups the pipeline is where the last item handed out left it
        self._dataset = _StampedDataset(pipeline, transform, stamp=1 if history > 0 else 0)
        self._pass_handed = 0  # items handed out since the current (or last) pass started
        # (index of an item handed out, each view's state after it, where its pass started)
        self._history: deque[tuple[int, dict[int, _Stamp], _Start]] = deque(maxlen=history)
        self._dataloader_kwargs = dataloader_kwargs
        if num_workers:
            worker_pipeline(pipeline, 0, num_workers)  # refuse a worker count that cannot split
        self._restored: _Start = None  # loaded, for the next iteration
        self._later: dict[int, LaneCheckpoint] = {}  # rank lanes the last start saved later
        self._start: _Start = None  # where the current (or last) iteration started
        self._latest: dict[int, _Stamp] = {}
        self.items_yielded = 0  # items handed out by this loader, over all its iterations
        self._exhausted = False  # the last iteration delivered the rest of its epoch

    @property
    def epoch(self) -> int:
        """The pass over the data the next (or current) iteration delivers: a loaded state's
        epoch until it is iterated, otherwise the pipeline's (:meth:`Pipeline.set_epoch`)."""
        if self._restored is not None:
            return _parsed_views(self._restored)[0].epoch
        return self.pipeline.epoch

    @property
    def epoch_finished(self) -> bool:
        """Whether :attr:`epoch` has nothing left to deliver: the last iteration ran to its
        end, or the loaded state was saved at the end of its epoch."""
        if self._restored is not None:
            lanes = self._rank_lanes()
            return all(view.finished_for(lanes) for view in _parsed_views(self._restored))
        return self._exhausted

    def _rank_lanes(self) -> list[int]:
        opts = self.pipeline.runtime_options
        return lanes_for_rank(
            opts.dp_rank, opts.dp_world_size, opts.canonical_replicas, opts.mapping
        )

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration pass ``epoch`` over the data (between iterations).

        A loaded state in that epoch is continued; one at the end of another epoch is
        dropped (the new epoch starts at its beginning, where lanes it saved in that epoch
        continue); one in the middle of another epoch is refused, naming the epoch to set.
        """
        if self._restored is not None and self.epoch != epoch:
            if not self.epoch_finished:
                raise CheckpointError(
                    f"set_epoch({epoch}): the loaded state is in the middle of epoch "
                    f"{self.epoch}; call set_epoch({self.epoch}) (or leave it) to finish that "
                    f"epoch first"
                )
            self._restored = self._advanced(self._restored, epoch)
        elif self._restored is None and self._later:  # lanes a restore saved in a later pass
            self._restored = self._start_with(self._later, epoch)
        self.pipeline.set_epoch(epoch)
        self._exhausted = False

    def _advanced(self, restored: _Start, epoch: int) -> _Start:
        """A finished loaded state moved to the start of pass ``epoch``: None, unless some of
        the rank's lanes were saved in a later pass (they continue there)."""
        return self._start_with(self._later_of(restored), epoch)

    def _later_of(self, start: _Start) -> dict[int, LaneCheckpoint]:
        """The rank's lanes that ``start`` saved in a pass after its own."""
        if start is None:
            return {}
        lanes = self._rank_lanes()
        return {n: lc for v in _parsed_views(start) for n, lc in split_later(v, lanes)[1].items()}

    def _start_with(self, later: Mapping[int, LaneCheckpoint], epoch: int) -> _Start:
        """The rank's start of pass ``epoch`` where ``later`` lanes continue (None: none)."""
        if not later:
            return None
        return start_of_pass(self.pipeline.pass_start(epoch), epoch, later)

    def __iter__(self) -> Iterator[Any]:
        self._history.clear()
        while True:
            fresh = self._restored is None and not self._later  # a pass from its beginning
            handed = self.items_yielded
            yield from self._one_pass()
            if not self.endless:
                return
            if fresh and self.items_yielded == handed:
                raise ConfigError(
                    f"endless=True: pass {self.pipeline.epoch} of this rank's lanes handed out "
                    f"no item ({self.left_out} left out in all, accumulation_steps="
                    f"{self.accumulation_steps}), so the stream would never deliver; check the "
                    "data, or use fewer accumulation steps"
                )

    def _one_pass(self) -> Iterator[Any]:
        if self.auto_epoch and self.epoch_finished:
            self.set_epoch(self.epoch + 1)
        elif self._restored is not None:
            self.pipeline.set_epoch(self.epoch)  # the workers' copies restore; keep it here too
        self._dataset.pending = self._start = self._restored
        self._later = self._later_of(self._start)  # the workers restore them: kept for later
        self._restored = None
        self._exhausted = False
        self._latest = {}
        self._pass_handed = 0
        self._dataset.shm_prefix = prefix = _shared_batch.new_prefix()
        loader = iter(
            DataLoader(
                self._dataset,
                batch_size=None,
                collate_fn=_identity,
                num_workers=self.num_workers,
                **self._dataloader_kwargs,
            )
        )
        try:
            yield from self._hand_out(loader if self.num_workers == 0 else self._in_turn(loader))
        finally:
            shutdown = getattr(loader, "_shutdown_workers", None)
            if shutdown is not None:  # no worker writes an item now
                shutdown()
            _shared_batch.remove_left(prefix)
        self._exhausted = True

    def _hand_out(self, items: Iterator[_Stamped]) -> Iterator[Any]:
        """The items' payloads, keeping each one's position."""
        if self.accumulation_steps > 1:
            items = self._whole_groups(items)
        for worker, _, state, payload in items:
            if state is not None:
                self._latest[worker] = state
            if self._history.maxlen:
                self._history.append((self.items_yielded, dict(self._latest), self._start))
            self.items_yielded += 1
            self._pass_handed += 1
            payload = _shared_batch.unpack(payload)
            yield payload if self.device is None else _to_device(payload, self.device)

    def _whole_groups(self, items: Iterator[_Stamped]) -> Iterator[_Stamped]:
        """``items`` in whole groups of ``accumulation_steps``; a partial last group of the
        pass is left out."""
        group: list[_Stamped] = []
        for stamped in items:
            group.append(stamped)
            if len(group) == self.accumulation_steps:
                yield from group
                group = []
        if group:
            self.left_out += len(group)
            log.info(
                "zephon: pass %d of rank %d ends with %d item(s), fewer than "
                "accumulation_steps=%d: left out of that pass",
                self.pipeline.epoch,
                self.pipeline.runtime_options.dp_rank,
                len(group),
                self.accumulation_steps,
            )

    def _rotation(self) -> _RankRotation:
        """The rank's round-robin where this iteration starts."""
        lanes = self._rank_lanes()
        start = self._start
        if start is None:
            counts = dict.fromkeys(lanes, 0)
        else:  # lanes saved in a later pass are finished in this one, as the engine runs them
            views = [split_later(view, lanes)[0] for view in _parsed_views(start)]
            counts = {lane: n for view in views for lane, n in delivered_counts(view).items()}
        return _RankRotation(lanes, counts, self.num_workers)

    def _in_turn(self, loader: Iterator[_Stamped]) -> Iterator[_Stamped]:
        """The workers' items in the rank's round-robin order.

        A worker's items come in its own round-robin, the rank's order restricted to its
        lanes; when a worker sends another lane than the one due (or stops), the due lane has
        ended. Items wait in their worker's queue until due, at most one round per worker.
        """
        rotation = self._rotation()
        queues: list[deque[_Stamped]] = [deque() for _ in range(self.num_workers)]
        done = [False] * self.num_workers
        for stamped in loader:
            if isinstance(stamped[3], _WorkerDone):
                done[stamped[0]] = True
            else:
                queues[stamped[0]].append(stamped)
            while (lane := rotation.due()) is not None:
                queue = queues[rotation.owner[lane]]
                if queue and queue[0][1] == lane:
                    rotation.delivered(lane)
                    yield queue.popleft()
                elif queue or done[rotation.owner[lane]]:
                    rotation.ended(lane)
                else:
                    break  # wait for the owner's next item

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
        any world size and worker count restores.
        """
        if upto is not None:
            return self._state_after(upto)
        if self._restored is not None:  # loaded and not iterated since
            states = [self._start_state(w, self._restored) for w in range(self._views)]
        elif self.num_workers == 0 and not self._dataset.stamp:
            self._refuse_inside_a_group()
            states = [self.pipeline.checkpoint()]
        else:
            states = self._view_states(self._latest, self._start)
        return {"format": LOADER_STATE_FORMAT, "version": 1, "checkpoints": states}

    def _refuse_inside_a_group(self) -> None:
        """Without workers a group is read before it is handed out, so inside one the
        pipeline is ahead of the consumer: the state exists between groups only."""
        every = self.accumulation_steps
        if self._pass_handed % every:
            raise CheckpointError(
                f"state_dict() after item {self._pass_handed % every} of a group of "
                f"accumulation_steps={every}: without workers or history the loader has the "
                "state between groups only; ask for it at optimizer steps"
            )

    def _view_states(self, latest: Mapping[int, _Stamp], start: _Start) -> list[dict[str, Any]]:
        return [
            _unstamped(latest[w]) if w in latest else self._start_state(w, start)
            for w in range(self._views)
        ]

    def _state_after(self, index: int) -> dict[str, Any]:
        for seen, latest, start in self._history:
            if seen == index:
                states = self._view_states(latest, start)
                return {"format": LOADER_STATE_FORMAT, "version": 1, "checkpoints": states}
        kept = [seen for seen, _, _ in self._history]
        raise CheckpointError(
            f"state_dict(upto={index}): the loader keeps the positions after items "
            f"{kept[:1] + kept[-1:] if kept else 'none'} (history={self._history.maxlen}); "
            "raise history to cover how far the consumer reads ahead"
        )

    @property
    def _views(self) -> int:
        return max(1, self.num_workers)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` at the next iteration: a loader state (this rank's, saved
        with any worker count, or merged), or a pipeline checkpoint (merged over ranks, or this
        rank's own)."""
        if state.get("format") != LOADER_STATE_FORMAT:
            self._restored = state
        elif len(state["checkpoints"]) == self._views:
            self._restored = list(state["checkpoints"])
        else:  # saved with another worker count: this rank's lanes in one checkpoint
            from zephon import merge_checkpoints

            self._restored = merge_checkpoints(state["checkpoints"], partial=True)
        self._latest = {}


def _unstamped(state: _Stamp) -> dict[str, Any]:
    """A view's checkpoint as a dict the caller owns (a worker's comes pickled)."""
    if callable(state):
        return state()
    loaded: dict[str, Any] = (
        pickle.loads(state) if isinstance(state, bytes) else copy.deepcopy(state)
    )
    return loaded


def _parsed_views(start: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[ParsedCheckpoint]:
    views = start if isinstance(start, Sequence) else [start]
    return [parse_checkpoint(view) for view in views]


def merge_loader_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One pipeline checkpoint from the loader states of every rank, in rank order.

    It restores on any world size and with any DataLoader worker count.
    """
    from zephon import merge_checkpoints

    checkpoints: list[Mapping[str, Any]] = []
    for state in states:
        if state.get("format") != LOADER_STATE_FORMAT:
            raise CheckpointError(
                f"not a PipelineDataLoader state (format={state.get('format')!r})"
            )
        checkpoints.extend(state["checkpoints"])
    return merge_checkpoints(checkpoints)


def _to_device(payload: Any, device: Any) -> Any:
    if hasattr(payload, "to"):
        return payload.to(device)
    if isinstance(payload, Mapping):
        return {k: _to_device(v, device) for k, v in payload.items()}
    return payload
