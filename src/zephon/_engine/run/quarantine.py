"""Records skipped with ``on_error="skip"``: logged once each, counted, and kept in a file.

A skipped record must never disappear silently. Each one is logged (dataset, shard, row, file,
line, reason) and, when a quarantine path is set, appended as one JSON line to that file. A
restore replays part of a lane, so the same record can be skipped again: records the file
already holds are neither logged nor written twice.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("zephon")

MAX_EXAMPLES = 10


def _sample_id(value: Any) -> tuple[int, int, int] | None:
    try:
        ds, shard, row = value
        return int(ds), int(shard), int(row)
    except (TypeError, ValueError):
        return None


class Quarantine:
    """Collects the skipped records of one iteration (optionally into a JSONL file)."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path is not None else None
        self.count = 0
        self.examples: list[str] = []
        self._seen: set[tuple[int, int, int]] = set()
        self._known: set[tuple[int, int, int]] | None = None  # read at the first skip
        self._fh: IO[str] | None = None

    def _load(self) -> set[tuple[int, int, int]]:
        """Sample ids the quarantine file already holds (from runs before a restore)."""
        known: set[tuple[int, int, int]] = set()
        if self.path is None or not self.path.exists():
            return known
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    sid = _sample_id(json.loads(line).get("sample_id"))
                except (ValueError, AttributeError):
                    continue  # a torn last line from a crash: that record is written again
                if sid is not None:
                    known.add(sid)
        return known

    def add(self, sample_id: tuple[int, int, int], info: Mapping[str, Any]) -> None:
        sid = (int(sample_id[0]), int(sample_id[1]), int(sample_id[2]))
        if sid in self._seen:
            return
        self._seen.add(sid)
        self.count += 1
        reason = str(info.get("reason", "unreadable record"))
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(reason)
        if self._known is None:
            self._known = self._load()
        if sid in self._known:
            return
        where = f"dataset {info.get('dataset')!r}, shard {info.get('shard')}, row {info.get('row')}"
        file = info.get("file")
        if file and str(file) not in reason:
            where += f", {file}"
        log.warning("zephon: skipped a record (%s): %s", where, reason)
        if self.path is not None:
            self._write({"sample_id": list(sid), **info})

    def _write(self, entry: Mapping[str, Any]) -> None:
        if self._fh is None:
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            drop_torn_tail(self.path)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open)
        self._fh.write(json.dumps(entry) + "\n")
        self._fh.flush()

    def close(self) -> None:
        """Make what was written durable and close the file."""
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None


def drop_torn_tail(path: Path) -> None:
    """Cut a last line without its newline (a crash mid-write) so new lines start clean.

    Lane workers append to one file from several processes: the process that starts them
    cuts it first, so none of them cuts a line another has just appended."""
    if not path.exists():
        return
    with open(path, "rb+") as fh:
        data = fh.read()
        if data and not data.endswith(b"\n"):
            fh.truncate(data.rfind(b"\n") + 1)
