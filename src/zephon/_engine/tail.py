"""Split the merged stream back into lanes and deliver them in strict round-robin.

A rank's output is then a function of its lanes' streams only, not of how the engine happened
to interleave them, which is what lets another number of ranks reproduce the same lanes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from zephon.types import TAG_ERROR, TAG_TOMBSTONE, StreamItem, is_control


class LaneMux:
    """Buffers delivered items per lane; ``pop`` returns the next item in lane round-robin."""

    def __init__(self, lanes: Sequence[int]) -> None:
        self.order = list(lanes)
        self._queues: dict[int, deque[StreamItem]] = {lane: deque() for lane in self.order}
        self._turn = 0
        self.ended = False
        self.tombstones = 0
        self.errors: list[str] = []

    def add(self, items: Iterable[StreamItem]) -> None:
        queues = self._queues
        for item in items:
            if is_control(item):
                tags = item.meta.tags
                if TAG_TOMBSTONE in tags:
                    self.tombstones += 1
                    if TAG_ERROR in tags and str(tags[TAG_ERROR]).startswith("skipped:"):
                        self.errors.append(str(tags[TAG_ERROR]))
                continue
            queues[item.meta.lane_id].append(item)

    def pop(self) -> StreamItem | None:
        """The next item, or None when the current lane needs more input (or all is done)."""
        while self.order:
            lane = self.order[self._turn]
            queue = self._queues[lane]
            if queue:
                self._turn = (self._turn + 1) % len(self.order)
                return queue.popleft()
            if not self.ended:
                return None
            # Stream over and this lane is drained: it leaves the rotation.
            del self.order[self._turn]
            if self.order:
                self._turn %= len(self.order)
        return None

    @property
    def done(self) -> bool:
        return self.ended and not self.order

    def buffered(self) -> int:
        return sum(len(q) for q in self._queues.values())
