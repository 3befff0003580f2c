"""Work sources: what is read and in which order, lanes and data-parallel ranks."""

from zephon.work._base import WorkChunk, WorkSource
from zephon.work._lanes import LaneMapping, lanes_for_rank

__all__ = ["LaneMapping", "WorkChunk", "WorkSource", "lanes_for_rank"]
