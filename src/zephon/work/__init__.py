"""Work sources: what is read and in which order, lanes and data-parallel ranks."""

from zephon.work._base import WorkChunk as WorkChunk
from zephon.work._base import WorkSource as WorkSource
from zephon.work._calibration import TokenCalibration as TokenCalibration
from zephon.work._delivered import MixtureStats
from zephon.work._lanes import LaneMapping, lanes_for_rank
from zephon.work._mixture import MixtureSpec as MixtureSpec
from zephon.work._schedule import MixtureSchedule as MixtureSchedule
from zephon.work._source_options import ExhaustedPolicy, LaneAssignment
from zephon.work._static import (
    StaticMixtureWorkSource as StaticMixtureWorkSource,
)
from zephon.work._traits import (
    FingerprintedSource,
    MixtureSource,
    SeededSource,
    TokenMeasuredSource,
    source_fingerprint,
    source_mixture,
    source_seed,
)

__all__ = [
    "ExhaustedPolicy",
    "FingerprintedSource",
    "LaneAssignment",
    "LaneMapping",
    "MixtureSource",
    "MixtureStats",
    "SeededSource",
    "TokenMeasuredSource",
    "lanes_for_rank",
    "source_fingerprint",
    "source_mixture",
    "source_seed",
]
