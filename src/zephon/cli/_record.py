"""The ``--record`` file: where a checkpoint says it ended, and cutting it back there on resume.

A checkpoint stores the record's size and its path twice: absolute (real path) and relative to
the checkpoint directory. A run folder moved or remounted between a kill and the resume changes
the first but not the second, so the record is still recognised and cut. A resume that finds no
checkpoint starts from the beginning, so the record starts empty too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def record_position(path: Path, checkpoint_dir: Path, size: int) -> dict[str, Any]:
    """The ``run.record`` entry of a checkpoint: the record's identity and its size now."""
    real = os.path.realpath(path)
    return {
        "path": real,
        "relative": os.path.relpath(real, os.path.realpath(checkpoint_dir)),
        "bytes": size,
    }


def _same_record(path: Path, checkpoint_dir: Path, saved: Mapping[str, Any]) -> bool:
    here = record_position(path, checkpoint_dir, 0)
    return bool(here["path"] == saved.get("path") or here["relative"] == saved.get("relative"))


def _truncate(path: Path, size: int) -> None:
    os.truncate(path, size)
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _warn(message: str) -> None:
    print(f"zephon run: warning: {message}", file=sys.stderr)


def cut_record(path: Path, checkpoint_dir: Path, run_meta: Mapping[str, Any] | None) -> None:
    """Cut the record back to its size at the checkpoint being resumed (``run_meta`` is that
    checkpoint's ``run`` entry; None when the resume found no checkpoint).

    Lines written after that checkpoint (a crash, a kill) are items the resumed run delivers
    again; without the cut they would be in the file twice.
    """
    if not path.exists():
        return
    size = path.stat().st_size
    if run_meta is None:
        if size:
            _warn(
                f"no checkpoint to resume: the run starts from the beginning, so {path} "
                f"({size} bytes from an earlier run that left no checkpoint) starts empty"
            )
            _truncate(path, 0)
        return
    saved = run_meta.get("record")
    if not isinstance(saved, Mapping):
        return
    if not _same_record(path, checkpoint_dir, saved):
        _warn(
            f"{path} is not the record of the checkpoint being resumed (that was "
            f"{saved.get('path')}); it is not cut back and may repeat items"
        )
        return
    keep = int(saved.get("bytes", 0))
    if size > keep:
        _truncate(path, keep)
    elif size < keep:
        _warn(
            f"{path} is shorter ({size} bytes) than when the checkpoint was taken ({keep} "
            "bytes); it no longer holds every delivered item"
        )
