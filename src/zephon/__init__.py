"""zephon: exactly reproducible data pipelines and durable RL token capture for LLM training."""

from zephon._engine.checkpoint import merge_checkpoints
from zephon.distributed import gather_checkpoints
from zephon.io import CacheOptions, Dataset
from zephon.pipeline import Pipeline
from zephon.types import SampleBatch, SampleMeta, SampleRecord
from zephon.work import (
    MixtureSchedule,
    MixtureSpec,
    StaticMixtureWorkSource,
    TokenCalibration,
    WorkChunk,
    WorkSource,
)

__version__ = "0.1.0"

__all__ = [
    "CacheOptions",
    "Dataset",
    "MixtureSchedule",
    "MixtureSpec",
    "Pipeline",
    "SampleBatch",
    "SampleMeta",
    "SampleRecord",
    "StaticMixtureWorkSource",
    "TokenCalibration",
    "WorkChunk",
    "WorkSource",
    "__version__",
    "gather_checkpoints",
    "merge_checkpoints",
]
