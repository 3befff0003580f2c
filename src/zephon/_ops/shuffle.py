"""shuffle: reorder each lane's records inside a bounded window, with data-derived randomness.

Every random choice is a hash of record cursors, the lane and the seed (never an RNG advanced
per call), so the same records shuffle the same way whatever the micro-batch boundaries, the
runner or a restart (replay restarts a lane at an epoch boundary, where the buffer is empty).

* ``streaming`` (default): a per-lane reservoir in the accumulator. It starts small (a warm-up
  of ``max(1, min(128, buffer_size // 16))`` records) and grows by one record per emission up to
  ``buffer_size``; each arrival beyond the target evicts the record at a hashed index.
* ``block``: blocks of ``buffer_size`` records per lane, each permuted on a worker.
* ``block_warmup``: like ``block``, but blocks start small after every reset and grow by
  ``warmup_growth`` up to ``buffer_size``, so the first records leave sooner.

A flush (sentinel or end of stream) drains the lane's buffer in hashed order. From epoch 1 on
(``Pipeline.set_epoch``) the seed is keyed by the epoch, so every pass shuffles differently.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from zephon._ops._bookkeeping import CloserTracker, cursor_hash, mix, settle_block
from zephon.errors import ConfigError, did_you_mean
from zephon.ops import Accumulator, BaseOp, CountingAccumulator, OpContext, OpTraits, Rebuild
from zephon.ops.accumulators import MicroBatch
from zephon.types import LaneId, SampleRecord, StreamItem

ShuffleAlgorithm = Literal["streaming", "block", "block_warmup"]
DEFAULT_BUFFER_SIZE = 8192
_LANE_SALT = 0x9E3779B97F4A7C15
_EPOCH_SALT = 0x3C6EF372FE94F82B


def epoch_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of pass ``epoch`` (epoch 0: the seed itself)."""
    return seed if epoch == 0 else mix(seed, epoch, _EPOCH_SALT)


def lane_seed(seed: int, lane_id: int) -> int:
    """The hashing seed of one lane: lanes with equal cursors still shuffle differently."""
    return mix(seed, lane_id, _LANE_SALT)


def warmup_size(buffer_size: int) -> int:
    return max(1, min(128, buffer_size // 16))


def hashed_order(elems: Sequence[StreamItem], seed: int) -> list[StreamItem]:
    """``elems`` (one lane) sorted by the hash of their cursors: a data-derived permutation."""
    if not elems:
        return []
    lseed = lane_seed(seed, elems[0].meta.lane_id)
    keyed = sorted(
        ((cursor_hash(e.meta.cursor, lseed), i) for i, e in enumerate(elems)),
    )
    return [elems[i] for _, i in keyed]


class _Reservoir:
    __slots__ = ("emitted", "items", "seed", "target", "tracker")

    def __init__(self, seed: int, target: int) -> None:
        self.items: list[StreamItem] = []
        self.emitted = 0
        self.target = target
        self.seed = seed
        self.tracker = CloserTracker()


class StreamingShuffleAccumulator(Accumulator):
    """Per-lane reservoirs; each arrival past the target evicts a hashed victim (O(1))."""

    state_holds_records = True  # the reservoir's records are saved by meta and rebuilt
    state_payloads_lazy = True  # payloads are read only at push, so rebuilt on leaving

    def state_dict(self, lane_id: LaneId) -> dict[str, Any]:
        """The lane's reservoir (records in slot order), target and emission count. Copies a
        list only: the closer tracker's open offsets are those of the records it holds."""
        res = self._lanes.get(lane_id)
        if res is None:
            return {}
        return {
            "items": list(res.items),
            "emitted": res.emitted,
            "target": res.target,
            "deferred": res.tracker.deferred(),
        }

    def load_state_dict(self, lane_id: LaneId, state: dict[str, Any]) -> None:
        self._lanes.pop(lane_id, None)
        if not state:
            return
        res = self._lane(lane_id)
        res.items = list(state["items"])
        res.emitted = int(state["emitted"])
        res.target = int(state["target"])
        res.tracker = CloserTracker.of_buffer((e.meta for e in res.items), state["deferred"])

    def __init__(self, buffer_size: int, seed: int) -> None:
        self.buffer_size = buffer_size
        self.seed = seed
        self._lanes: dict[LaneId, _Reservoir] = {}

    def _lane(self, lane_id: LaneId) -> _Reservoir:
        res = self._lanes.get(lane_id)
        if res is None:
            res = _Reservoir(lane_seed(self.seed, lane_id), warmup_size(self.buffer_size))
            self._lanes[lane_id] = res
        return res

    def push_many(self, elems: Sequence[StreamItem]) -> list[MicroBatch]:
        out: MicroBatch = []
        lanes = self._lanes
        cap = self.buffer_size
        for elem in elems:
            lane_id = elem.meta.lane_id
            res = lanes.get(lane_id) or self._lane(lane_id)
            res.tracker.add(elem.meta)
            items = res.items
            items.append(elem)
            size = len(items)
            if size <= res.target:
                continue
            salt = cursor_hash(elem.meta.cursor, res.seed)
            victim = mix(res.seed, salt, res.emitted, size) % size
            last = items.pop()
            if victim < size - 1:
                chosen = items[victim]
                items[victim] = last
            else:
                chosen = last
            res.emitted += 1
            if res.target < cap:
                res.target += 1
            out.append(self._leave(res, chosen))
        return [out] if out else []

    @staticmethod
    def _leave(res: _Reservoir, elem: StreamItem) -> StreamItem:
        if isinstance(elem, SampleRecord):
            return res.tracker.settled_record(elem)
        return elem

    def flush(self, *, reset: bool = False, lane_id: LaneId | None = None) -> list[MicroBatch]:
        lanes = sorted(self._lanes) if lane_id is None else [lane_id]
        out: MicroBatch = []
        for lane in lanes:
            res = self._lanes.pop(lane, None)
            if res is None:
                continue
            order = sorted(
                (cursor_hash(e.meta.cursor, res.seed), i) for i, e in enumerate(res.items)
            )
            out.extend(self._leave(res, res.items[i]) for _, i in order)
        return [out] if out else []

    def has_pending_data(self, lane_id: LaneId | None = None) -> bool:
        if lane_id is None:
            return any(r.items for r in self._lanes.values())
        res = self._lanes.get(lane_id)
        return res is not None and bool(res.items)


class WarmupBlockAccumulator(Accumulator):
    """Per-lane blocks that start at the warm-up size and grow by ``growth`` after each reset."""

    def __init__(self, buffer_size: int, growth: float) -> None:
        self.buffer_size = buffer_size
        self.growth = growth
        self._buffers: dict[LaneId, list[StreamItem]] = {}
        self._targets: dict[LaneId, int] = {}

    def push_many(self, elems: Sequence[StreamItem]) -> list[MicroBatch]:
        ready: list[MicroBatch] = []
        start = warmup_size(self.buffer_size)
        for elem in elems:
            lane = elem.meta.lane_id
            buf = self._buffers.setdefault(lane, [])
            buf.append(elem)
            target = self._targets.setdefault(lane, start)
            if len(buf) >= target:
                ready.append(buf)
                self._buffers[lane] = []
                self._targets[lane] = min(
                    self.buffer_size, max(target + 1, math.ceil(target * self.growth))
                )
        return ready

    def flush(self, *, reset: bool = False, lane_id: LaneId | None = None) -> list[MicroBatch]:
        lanes = sorted(set(self._buffers) | set(self._targets)) if lane_id is None else [lane_id]
        out: list[MicroBatch] = []
        for lane in lanes:
            buf = self._buffers.pop(lane, None)
            self._targets.pop(lane, None)
            if buf:
                out.append(buf)
        return out

    def has_pending_data(self, lane_id: LaneId | None = None) -> bool:
        if lane_id is None:
            return any(self._buffers.values())
        return bool(self._buffers.get(lane_id))


class ShuffleOp(BaseOp):
    """Shuffles each lane within a window of ``buffer_size`` records; see the module docs."""

    name = "shuffle"

    def __init__(
        self,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        *,
        seed: int = 0,
        algorithm: ShuffleAlgorithm = "streaming",
        warmup_growth: float = 1.5,
    ) -> None:
        super().__init__()
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ConfigError(f"shuffle: buffer_size must be a positive int, got {buffer_size!r}")
        if algorithm not in ("streaming", "block", "block_warmup"):
            raise ConfigError(
                "shuffle: algorithm must be 'streaming', 'block' or 'block_warmup', got "
                f"{algorithm!r}" + did_you_mean(algorithm, ("streaming", "block", "block_warmup"))
            )
        if not warmup_growth > 1.0:
            raise ConfigError(f"shuffle: warmup_growth must be > 1, got {warmup_growth}")
        if not isinstance(seed, int):
            raise ConfigError(f"shuffle: seed must be an int, got {seed!r}")
        self.buffer_size = buffer_size
        self.seed = seed
        self.algorithm: ShuffleAlgorithm = algorithm
        self.warmup_growth = warmup_growth
        self._pass_seed = seed  # the seed of the epoch being run (set up per worker copy)

    def setup(self, ctx: OpContext) -> None:
        self._pass_seed = epoch_seed(self.seed, ctx.epoch)

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        if self.algorithm == "streaming":
            return StreamingShuffleAccumulator(self.buffer_size, epoch_seed(self.seed, ctx.epoch))
        if self.algorithm == "block":
            return CountingAccumulator(self.buffer_size)
        return WarmupBlockAccumulator(self.buffer_size, self.warmup_growth)

    def traits(self) -> OpTraits:
        # The streaming reservoir does all its work in the accumulator: nothing to ship.
        return OpTraits(
            preserves_cursor_order=False,
            parallelism=1,
            runs_in_driver=self.algorithm == "streaming",
            rebuild=Rebuild.UNCHANGED if self.algorithm == "streaming" else None,
        )

    def config(self) -> Mapping[str, Any]:
        return {
            "buffer_size": self.buffer_size,
            "seed": self.seed,
            "algorithm": self.algorithm,
            "warmup_growth": self.warmup_growth,
        }

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        if self.algorithm == "streaming" or len(elems) < 2:
            return elems
        shuffled = hashed_order(elems, self._pass_seed)
        if all(isinstance(e, SampleRecord) for e in shuffled):
            return list(settle_block([e for e in shuffled if isinstance(e, SampleRecord)]))
        return shuffled
