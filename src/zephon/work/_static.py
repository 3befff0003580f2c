"""StaticMixtureWorkSource: a fixed-weight mixture of datasets dealt to lanes in chunks.

The *global* chunk sequence ``g = 0, 1, 2, ...`` is a pure function of the configuration: chunk
``g`` takes per-dataset quotas (:mod:`zephon.work._mixture`) from each dataset's read order
(:mod:`zephon.work._order`) and interleaves them smoothly. Chunks are dealt to
``canonical_replicas`` lanes one per lane per block of ``L`` consecutive chunks (``permute``: a
keyed permutation per block; ``modulo``: ``g % L``), so lane ``l``'s ``k``-th chunk is
``k*L + j_l(k)`` in closed form. A lane clone advances the chunk sequence
(:mod:`zephon.work._chunks`) over the other lanes' chunks with integer arithmetic only and
builds pointers for its own chunks alone. Nothing depends on the number of data-parallel ranks.
Options are checked in :mod:`zephon.work._source_options`, the mixture resolved into phases in
:mod:`zephon.work._phased`, and states saved and checked in :mod:`zephon.work._source_state`.

End of data (see docs/work-sources.md): ``stop`` ends the source in the chunk where the dataset
runs out; ``repeat`` starts a new (reshuffled) pass, up to ``max_repeats`` extra passes, then
ends the source like ``stop``; ``redistribute`` retires the dataset and renormalises the other
weights from the next chunk on. The chunk in which any of this happens is emitted even though
it is short, so no sample of a pass is lost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from zephon._fingerprint import fingerprint
from zephon.errors import ConfigError
from zephon.work._base import WorkChunk, WorkSource
from zephon.work._chunks import ChunkSequence
from zephon.work._hashing import TAG_EPOCH, TAG_LANES, mix64, permutation
from zephon.work._phased import PhasedMixture
from zephon.work._source_options import (
    UNSET,
    ExhaustedPolicy,
    LaneAssignment,
    SourceOptions,
    checked_datasets,
    is_int,
)
from zephon.work._source_state import (
    LaneCursor,
    load_state_dict,
    source_config,
    state_dict,
)

if TYPE_CHECKING:
    from zephon.io import Dataset
    from zephon.work._mixture import MixtureSpec
    from zephon.work._schedule import MixtureSchedule


class StaticMixtureWorkSource(WorkSource):
    """Reads ``datasets`` in a fixed mixture, deterministically, in chunks of ``chunk_size``.

    Args:
        datasets: the datasets; a pointer's ``dataset_id`` is the position in this list.
        mixture: target proportions by dataset name; ``None`` weights datasets by their size.
        chunk_size: samples per chunk (only the chunk in which a dataset runs out is shorter).
        seed: drives every shuffle and the chunk->lane deal.
        shuffle_shards: permute the shard order of every pass.
        shuffle_within_shard: permute the rows inside each shard (costs O(shard) memory).
        shuffle_block_size: also permute blocks of this many consecutive positions of a pass
            (``"auto"``: 8 x the largest shard; ``"global"``: the whole dataset, O(N) memory).
        exhausted_policy: ``"stop"``, ``"repeat"`` or ``"redistribute"``, or a dict per
            dataset name (unnamed datasets: ``"repeat"``).
        max_repeats: extra passes a dataset may make (int or dict); then it counts as
            exhausted under ``stop`` semantics (``repeat``) or is retired (``redistribute``).
        stop_after_passes: end once every dataset finished this many passes (faster datasets
            repeat meanwhile). Defaults to 1 when neither ``exhausted_policy`` nor
            ``max_repeats`` is given, else to ``None`` (no such limit).
        lane_assignment: ``"permute"`` (default) or ``"modulo"``.
        reshuffle_on_repeat: a repeated pass gets a fresh order (else it repeats the first).
    """

    def __init__(
        self,
        datasets: Sequence[Dataset],
        mixture: MixtureSpec | MixtureSchedule | Mapping[str, float] | None = None,
        chunk_size: int = 16384,
        seed: int = 0,
        *,
        shuffle_shards: bool = True,
        shuffle_within_shard: bool = False,
        shuffle_block_size: int | Literal["auto", "global"] | None = None,
        exhausted_policy: ExhaustedPolicy | Mapping[str, ExhaustedPolicy] | None = None,
        max_repeats: int | Mapping[str, int] | None = None,
        stop_after_passes: int | None = UNSET,
        lane_assignment: LaneAssignment = "permute",
        reshuffle_on_repeat: bool = True,
    ) -> None:
        self._datasets = checked_datasets(datasets)
        names = [d.name for d in self._datasets]
        self._options = SourceOptions.validated(
            names,
            chunk_size=chunk_size,
            seed=seed,
            shuffle_shards=shuffle_shards,
            shuffle_within_shard=shuffle_within_shard,
            shuffle_block_size=shuffle_block_size,
            exhausted_policy=exhausted_policy,
            max_repeats=max_repeats,
            stop_after_passes=stop_after_passes,
            lane_assignment=lane_assignment,
            reshuffle_on_repeat=reshuffle_on_repeat,
        )
        self._mixture = PhasedMixture(mixture, self._datasets)
        if (
            self._mixture.schedule is not None
            and self._options.stop_after_passes is not None
            and 0 in self._mixture.phases[-1].weights
        ):
            raise ConfigError(
                "the last phase of the mixture schedule leaves out a dataset, so with "
                "stop_after_passes that dataset would never finish its pass; weight every "
                "dataset in the last phase or pass exhausted_policy=..."
            )
        self._epoch = 0
        self._lane = LaneCursor(None, None)
        self._configure()

    def _configure(self) -> None:
        """Summarise the configuration and start its chunk sequence and this lane at 0."""
        self._config = source_config(self._datasets, self._options, self._mixture, self._epoch)
        self._fingerprint = fingerprint(self._config)
        self._chunks = ChunkSequence(
            self._datasets,
            self._options,
            self._mixture.phases,
            self._mixture.first.unit,
            self._epoch,
        )
        self._lane = LaneCursor(self._lane.lane_id, self._lane.lanes)

    def _copy(self) -> StaticMixtureWorkSource:
        other = object.__new__(StaticMixtureWorkSource)
        other.__dict__.update(self.__dict__)
        return other

    # -- configuration ------------------------------------------------------------------------

    def needs_measuring(self) -> bool:
        """Whether the mixture is in tokens with nothing measured yet (see measure_tokens)."""
        return self._mixture.unmeasured

    def measure_tokens(self, count: Callable[[list[Any]], list[int]]) -> bool:
        """Measure a token mixture's estimates with ``count`` (rows -> the tokens each
        becomes in the pipeline) on rows picked as :class:`TokenCalibration` picks them
        (every row of a smaller dataset). False when the mixture needs no measuring. The
        estimates join the configuration and its fingerprint, as calibrated ones do."""
        if not self._mixture.unmeasured:
            return False
        self._mixture = self._mixture.measured(self._datasets, count)
        self._configure()
        return True

    @property
    def datasets(self) -> Sequence[Dataset]:
        return self._datasets

    @property
    def mixture(self) -> MixtureSpec:
        return self._mixture.first

    @property
    def seed(self) -> int:
        """The seed of every shuffle and deal; operators' seeds are derived from it too."""
        return self._options.seed

    @property
    def lane(self) -> tuple[int, int] | None:
        """``(lane_id, canonical_replicas)`` for a lane clone, else ``None``."""
        if self._lane.lane_id is None or self._lane.lanes is None:
            return None
        return self._lane.lane_id, self._lane.lanes

    @property
    def fingerprint(self) -> str:
        """A hash of the configuration; a state from another configuration is refused."""
        self._mixture.require_measured()
        return self._fingerprint

    @property
    def total_samples(self) -> int:
        """Rows over all datasets (one pass of each)."""
        return sum(self._chunks.totals)

    def chunk_size_hint(self) -> int | None:
        return self._options.chunk_size

    @property
    def epoch(self) -> int:
        return self._epoch

    def with_epoch(self, epoch: int) -> StaticMixtureWorkSource:
        """This source for pass ``epoch`` over the data: shard, row and block orders of every
        dataset pass and the chunk->lane deal are keyed by the epoch as well (epoch 0 is the
        order the source always had), so each epoch is a new order, the same in every run."""
        if not is_int(epoch) or epoch < 0:
            raise ConfigError(f"epoch must be an integer >= 0, got {epoch!r}")
        if epoch == self._epoch:
            return self
        other = self._copy()
        other._epoch = int(epoch)
        other._configure()
        return other

    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> StaticMixtureWorkSource:
        if isinstance(canonical_replicas, bool) or canonical_replicas < 1:
            raise ConfigError(f"canonical_replicas must be >= 1, got {canonical_replicas}")
        if not 0 <= lane_id < canonical_replicas:
            raise ConfigError(f"lane_id must be in [0, {canonical_replicas}), got {lane_id}")
        clone = self._copy()
        clone._chunks = self._chunks.fresh()
        clone._lane = LaneCursor(lane_id, canonical_replicas)
        return clone

    # -- chunks ---------------------------------------------------------------------------------

    def chunk_sequence(self) -> ChunkSequence:
        """A fresh copy of the global chunk sequence, at chunk 0 (for counting a run ahead)."""
        return self._chunks.fresh()

    def deal(self, block: int, lanes: int) -> np.ndarray:
        """The lanes of global chunks ``block*lanes ... block*lanes + lanes - 1``, in order:
        each block of ``lanes`` consecutive chunks gives every lane one."""
        if self._options.lane_assignment == "modulo" or lanes == 1:
            return np.arange(lanes)
        key = mix64(self._options.seed, TAG_LANES, block)
        if self._epoch:
            key = mix64(key, TAG_EPOCH, self._epoch)
        return permutation(lanes, key)

    def _lane_target(self, lane_id: int, lanes: int, k: int) -> int:
        perm = self.deal(k, lanes)
        return k * lanes + int(np.flatnonzero(perm == lane_id)[0])

    def planned_samples(self, lanes: Sequence[int], canonical_replicas: int) -> int | None:
        """Samples ``lanes`` emit over the whole run, from the chunk sequence computed without
        building pointers (see :mod:`zephon.work._plan`); ``None`` for an endless source."""
        from zephon.work._plan import planned_samples

        return planned_samples(self, lanes, canonical_replicas)

    def next_chunk(self) -> WorkChunk | None:
        self._mixture.require_measured()
        chunks, lane = self._chunks, self._lane
        if lane.lane_id is None or lane.lanes is None:
            return None if chunks.done else chunks.step(generate=True)
        if lane.done:
            return None
        chunks.skip(self._lane_target(lane.lane_id, lane.lanes, lane.chunks) - chunks.g)
        if chunks.done:
            self._lane = lane._replace(done=True)
            return None
        chunk = chunks.step(generate=True)
        self._lane = lane._replace(chunks=lane.chunks + 1)
        return chunk

    # -- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        self._mixture.require_measured()
        scheduled = self._mixture.schedule is not None
        return state_dict(self._config, self._lane, self._chunks, scheduled)

    def lean_state_dict(self) -> dict[str, Any]:
        """The state without its configuration summary (the fingerprint stays)."""
        state = self.state_dict()
        del state["config"]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        scheduled = self._mixture.schedule is not None
        self._lane = load_state_dict(state, self._config, self._lane, self._chunks, scheduled)
