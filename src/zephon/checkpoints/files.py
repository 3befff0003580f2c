"""Checkpoint files: named by epoch and items, written atomically, checked when read, newest
valid one found.

``pipeline.checkpoint()`` returns a small JSON-safe dict that carries a checksum of its own
content. These helpers put such dicts in files so that a crash, a full disk or an editor can
never make a restore start from a wrong position: a file is written to a temporary name,
fsynced, renamed into place and its directory fsynced; a file that is empty, truncated, edited
or not a zephon checkpoint is refused with a message naming it and what is wrong, and
:func:`latest_checkpoint` falls back to the newest valid one in a directory.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zephon._atomic import write_atomic
from zephon.checkpoints.format import parse, seal
from zephon.errors import CheckpointError, ZephonError

__all__: list[str] = []  # its public names are exported by zephon.checkpoints

CHECKPOINT_RE = re.compile(r"^ckpt-(?:e(\d+)-)?(\d+)\.json$")
#: Suffix given to a checkpoint file found invalid, so it is never picked (or pruned) again.
REJECTED_SUFFIX = ".invalid"


_WRITE_FIXES = {
    errno.ENOSPC: "free space on that disk (or write checkpoints elsewhere)",
    errno.EDQUOT: "free space within your disk quota (or write checkpoints elsewhere)",
    errno.EACCES: "make the folder writable by this user, or write checkpoints elsewhere",
    errno.EPERM: "make the folder writable by this user, or write checkpoints elsewhere",
    errno.EROFS: "the file system is mounted read-only: remount it read-write, or write "
    "checkpoints elsewhere",
    errno.EFBIG: "the file size limit (ulimit -f) is below the checkpoint's size: raise it",
}


class CheckpointWriteError(ZephonError, OSError):
    """A checkpoint file cannot be written: names the file, the system's reason and the fix.
    The previous checkpoint file is untouched (writes go through a temporary file)."""

    def __init__(self, path: Path, error: OSError) -> None:
        fix = _WRITE_FIXES.get(error.errno or 0, "make that path writable")
        reason = error.strerror or str(error)
        self.message = (
            f"cannot write the checkpoint {path}: {reason}; {fix}, then resume (the newest "
            "checkpoint already written is intact)"
        )
        super().__init__(error.errno, self.message)
        self.path = path

    def __str__(self) -> str:
        return self.message


def save_checkpoint(path: str | os.PathLike[str], state: Mapping[str, Any]) -> Path:
    """Write ``state`` (sealed again, so entries you added are covered) atomically to ``path``.

    The folder is created when missing. A state a restart would refuse (any dict other than
    what ``pipeline.checkpoint()`` returned, plus entries of your own) is refused here, as a
    :class:`CheckpointError`, so the mistake shows when it is made and not at the restart. A
    full disk, a missing permission or a read-only file system is a
    :class:`CheckpointWriteError` naming the file and the fix.
    """
    target = Path(path)
    sealed = seal(state)
    try:
        parse(sealed)
    except CheckpointError as exc:
        raise CheckpointError(
            f"cannot save {target}: {exc}; save the dict pipeline.checkpoint() returned "
            "(entries of your own may be added to it)"
        ) from None
    try:
        write_atomic(target, json.dumps(sealed, indent=1) + "\n")
    except OSError as exc:
        raise CheckpointWriteError(target, exc) from exc
    return target


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a checkpoint file; :class:`CheckpointError` names the file and the fault."""
    target = Path(path)
    try:
        data = target.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{target}: no such checkpoint file") from None
    except OSError as exc:
        raise CheckpointError(f"{target}: cannot read it ({exc.strerror})") from None
    if not data.strip():
        raise CheckpointError(
            f"{target}: the file is empty ({len(data)} bytes); it was not written completely"
        )
    try:
        state = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(
            f"{target}: not valid JSON ({exc}); the file is truncated or damaged"
        ) from None
    try:
        parse(state)
    except CheckpointError as exc:
        raise CheckpointError(f"{target}: {exc}") from None
    if not isinstance(state, dict):  # parse() refuses anything else; this narrows the type
        raise CheckpointError(f"{target}: not a checkpoint")
    return state


def checkpoint_files(directory: str | os.PathLike[str]) -> list[Path]:
    """``ckpt-<items>.json`` (and ``ckpt-e<epoch>-<items>.json``) files of a checkpoint
    directory, oldest first: by epoch, then by items delivered in it."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = CHECKPOINT_RE.match(p.name)
        if m:
            found.append((int(m.group(1) or 0), int(m.group(2)), p))
    return [p for _, _, p in sorted(found)]


def checkpoint_path(directory: str | os.PathLike[str], items: int, epoch: int = 0) -> Path:
    """Where ``zephon run`` keeps the checkpoint taken after ``items`` delivered items of
    ``epoch`` (``ckpt-<items>.json`` in epoch 0, ``ckpt-e<epoch>-<items>.json`` after it, so a
    later epoch's checkpoints are always the newer ones)."""
    name = f"ckpt-{items:010d}.json" if epoch == 0 else f"ckpt-e{epoch:06d}-{items:010d}.json"
    return Path(directory) / name


@dataclass
class LatestCheckpoint:
    """The newest valid checkpoint of a directory and the newer files that were refused."""

    path: Path
    state: dict[str, Any]
    rejected: list[tuple[Path, str]] = field(default_factory=list)


def latest_checkpoint(
    directory: str | os.PathLike[str], *, set_aside: bool = False
) -> LatestCheckpoint | None:
    """The newest checkpoint of ``directory`` that passes every check, or None if none does.

    Newer files that fail are listed in ``rejected`` with the reason; with ``set_aside`` they are
    also renamed to ``<name>.invalid`` (only once a valid one is found) so they are never
    picked again and never count as the newest when old checkpoints are pruned. When every file
    is invalid this raises :class:`CheckpointError` rather than silently starting over.
    """
    rejected: list[tuple[Path, str]] = []
    for path in reversed(checkpoint_files(directory)):
        try:
            state = load_checkpoint(path)
        except CheckpointError as exc:
            rejected.append((path, str(exc)))
            continue
        if set_aside:
            rejected = [(_set_aside(bad), reason) for bad, reason in rejected]
        return LatestCheckpoint(path, state, rejected)
    if rejected:
        raise CheckpointError(
            f"no valid checkpoint in {directory}: " + "; ".join(reason for _, reason in rejected)
        )
    return None


def _set_aside(path: Path) -> Path:
    aside = path.with_name(path.name + REJECTED_SUFFIX)
    os.replace(path, aside)
    return aside
