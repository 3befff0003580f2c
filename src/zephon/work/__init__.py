"""Work sources: what is read and in which order, lanes and data-parallel ranks."""

from zephon.work._base import WorkChunk, WorkSource
from zephon.work._calibration import TokenCalibration
from zephon.work._lanes import LaneMapping, lanes_for_rank
from zephon.work._mixture import MixtureSpec
from zephon.work._schedule import MixtureSchedule
from zephon.work._static import ExhaustedPolicy, LaneAssignment, StaticMixtureWorkSource

__all__ = [
    "ExhaustedPolicy",
    "LaneAssignment",
    "LaneMapping",
    "MixtureSchedule",
    "MixtureSpec",
    "StaticMixtureWorkSource",
    "TokenCalibration",
    "WorkChunk",
    "WorkSource",
    "lanes_for_rank",
]
