"""Pipeline checkpoints: the file format, checkpoint files, and merging ranks' checkpoints.

``pipeline.checkpoint()`` returns a small JSON-safe dict that carries a checksum of its own
content. :mod:`zephon.checkpoints.format` defines and checks that dict (:func:`parse_checkpoint`
returns it as a typed :class:`ParsedCheckpoint`); :mod:`zephon.checkpoints.files` puts such dicts
in files so that a crash, a full disk or an editor can never make a restore start from a wrong
position (temporary name, fsync, rename; a file that is empty, truncated, edited or not a zephon
checkpoint is refused naming it, and :func:`latest_checkpoint` falls back to the newest valid
one); :mod:`zephon.checkpoints.gather` merges the checkpoints of several ranks.
"""

from __future__ import annotations

from zephon.checkpoints.files import (
    CHECKPOINT_RE,
    REJECTED_SUFFIX,
    CheckpointWriteError,
    LatestCheckpoint,
    checkpoint_files,
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from zephon.checkpoints.format import (
    LaneCheckpoint,
    OperatorInfo,
    ParsedCheckpoint,
    SourceInfo,
    seal,
)
from zephon.checkpoints.format import parse as parse_checkpoint
from zephon.checkpoints.gather import (
    delivered_counts,
    refetch_counts,
)
from zephon.checkpoints.gather import (
    merge_checkpoints as merge_checkpoints,
)

__all__ = [
    "CHECKPOINT_RE",
    "REJECTED_SUFFIX",
    "CheckpointWriteError",
    "LaneCheckpoint",
    "LatestCheckpoint",
    "OperatorInfo",
    "ParsedCheckpoint",
    "SourceInfo",
    "checkpoint_files",
    "checkpoint_path",
    "delivered_counts",
    "latest_checkpoint",
    "load_checkpoint",
    "parse_checkpoint",
    "refetch_counts",
    "save_checkpoint",
    "seal",
]
