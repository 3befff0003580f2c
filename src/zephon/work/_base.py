"""The work-source contract: what is read, in which order, decided from metadata alone.

A :class:`WorkSource` emits :class:`WorkChunk` s of sample pointers ``(dataset_id, shard_id,
index)``. The engine clones one source per lane (``clone_for_lane``) and pulls chunks from each;
a lane's chunk sequence must depend only on the source's configuration and the lane id, never on
how many data-parallel ranks exist.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from zephon.errors import ConfigError
from zephon.types import SampleId

if TYPE_CHECKING:
    from zephon.io import Dataset


@dataclass(frozen=True, slots=True)
class WorkChunk:
    """One chunk of sample pointers, in delivery order.

    ``pointers`` is an ``(n, 3)`` int64 array of ``(dataset_id, shard_id, index)`` rows;
    ``dataset_id`` is the dataset's position in the source's ``datasets`` and doubles as the
    mixture component id.
    """

    pointers: np.ndarray
    global_index: int = -1
    target_mixture: Mapping[str, float] | None = None
    source_exhausted: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.pointers.ndim != 2 or self.pointers.shape[1] != 3:
            raise ValueError(
                f"WorkChunk.pointers must have shape (n, 3), got {self.pointers.shape}"
            )

    def __len__(self) -> int:
        return int(self.pointers.shape[0])

    def __iter__(self) -> Iterator[SampleId]:
        for row in self.pointers.tolist():
            yield (row[0], row[1], row[2])

    def sample_ids(self) -> list[SampleId]:
        return list(self)


class WorkSource(abc.ABC):
    """Decides the pointer stream. Subclass it for a custom source.

    Contract: ``next_chunk`` returns the next chunk or ``None`` when the lane is done;
    ``state_dict`` is small (cursors, epochs, seeds), JSON-safe and versioned, and
    ``load_state_dict(state_dict())`` continues identically; ``clone_for_lane`` returns an
    independent source that yields only that lane's chunks.
    """

    @property
    @abc.abstractmethod
    def datasets(self) -> Sequence[Dataset]:
        """The datasets pointers refer to, indexed by ``dataset_id``."""

    @abc.abstractmethod
    def next_chunk(self) -> WorkChunk | None:
        """The next chunk of this (lane's) stream, or ``None`` when it is exhausted."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Small, JSON-safe, versioned state from which ``next_chunk`` continues."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state produced by ``state_dict`` of an identically configured source."""

    def lean_state_dict(self) -> dict[str, Any]:
        """``state_dict`` without what the configuration alone determines, for the lanes of a
        pipeline checkpoint after its first (one summary of the settings is enough to name a
        difference; every lane's fingerprint still pins them). ``load_state_dict`` must take
        it. The default is the whole state."""
        return self.state_dict()

    @abc.abstractmethod
    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> WorkSource:
        """A fresh source yielding the chunks dealt to ``lane_id`` out of ``canonical_replicas``."""

    @property
    def epoch(self) -> int:
        """The pass over the data this source describes (see :meth:`with_epoch`)."""
        return 0

    def with_epoch(self, epoch: int) -> WorkSource:
        """A copy of this source for pass ``epoch``: the same data in a new deterministic order
        (every shuffle and deal keyed by the epoch too). Epoch 0 is the source itself.

        Override it in a source that can reorder; the default has only epoch 0.
        """
        if epoch == 0:
            return self
        raise ConfigError(
            f"{type(self).__name__} has no epochs: set_epoch({epoch}) needs a work source that "
            "implements with_epoch() (StaticMixtureWorkSource does); iterate again without "
            "set_epoch to repeat the same order"
        )

    def component_names(self) -> list[str]:
        """Mixture component names by component id (the dataset names by default)."""
        return [d.name for d in self.datasets]

    def release(self) -> None:
        """Close what producing chunks opened (a store client, say); called when an iteration
        over the source ends. A later iteration reopens it. Nothing by default."""
        return

    def interrupt(self) -> None:
        """Wake a ``next_chunk`` that waits for data to arrive (a stream whose producer is
        still running, say): it should raise or return soon after. Called from another thread
        on the source a pipeline was built with when its iteration closes, before the engine
        waits for its threads; lane clones that wait on their own must hear it from there.
        Nothing by default."""
        return

    def chunk_size_hint(self) -> int | None:
        """Typical chunk length, used to size buffers; ``None`` when unknown."""
        return None

    def planned_samples(self, lanes: Sequence[int], canonical_replicas: int) -> int | None:
        """How many sample pointers ``lanes`` (of ``canonical_replicas``) emit over the whole
        stream, from a fresh start: the total a progress bar counts against. ``None`` when the
        source cannot know it (an endless stream, one decided as it goes), the default."""
        return None
