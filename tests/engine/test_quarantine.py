"""The quarantine file: one line per skipped record, each once, tolerant of a torn last line."""

from __future__ import annotations

import json
from pathlib import Path

from zephon._engine.run.quarantine import Quarantine


def info(row: int) -> dict:
    return {"dataset": "web", "shard": 0, "row": row, "file": "a.jsonl", "line": row + 1,
            "reason": f"a.jsonl, line {row + 1}: malformed JSON"}  # fmt: skip


def test_each_record_is_written_once_also_across_restarts(tmp_path: Path):
    path = tmp_path / "q.jsonl"
    first = Quarantine(path)
    first.add((0, 0, 3), info(3))
    first.add((0, 0, 3), info(3))  # replayed within one iteration
    first.close()
    path.write_text(path.read_text() + '{"sample_id": [0, 0, ')  # a crash mid-line
    second = Quarantine(path)
    second.add((0, 0, 3), info(3))  # replayed after a restore: already there
    second.add((0, 0, 9), info(9))
    second.close()
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    assert [e["sample_id"] for e in entries] == [[0, 0, 3], [0, 0, 9]]
    assert second.count == 2 and second.examples[1].endswith("malformed JSON")


def test_without_a_file_records_are_still_counted(tmp_path: Path):
    q = Quarantine(None)
    q.add((1, 2, 3), info(3))
    q.close()
    assert q.count == 1 and list(tmp_path.iterdir()) == []
