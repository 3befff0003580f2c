"""Malformed records: a clear error naming file and line, or skipped and reported."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon.errors import DataFormatError


def write_shards(folder: Path) -> None:
    folder.mkdir()
    good = [json.dumps({"id": i, "text": f"row {i}"}) for i in range(30)]
    (folder / "a.jsonl").write_text("\n".join(good[:15]) + "\n")
    lines = good[15:]
    lines[6] = '{"id": 21, "text": "unterminated'  # line 7 of b.jsonl
    (folder / "b.jsonl").write_text("\n".join(lines) + "\n")


def pipeline(folder: Path, **options) -> Pipeline:
    ds = Dataset.from_path("rows", folder)
    source = StaticMixtureWorkSource(
        datasets=[ds], mixture=MixtureSpec({"rows": 1.0}), chunk_size=8, seed=0
    )
    return Pipeline(source).decode_text().tokenize("bytes").options(**options)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_malformed_line_names_file_and_line(tmp_path: Path, runner: str):
    folder = tmp_path / "data"
    write_shards(folder)
    with pytest.raises(DataFormatError) as info:
        list(pipeline(folder, runner=runner))
    message = str(info.value)
    assert "b.jsonl" in message and "line 7" in message


@pytest.mark.timeout(60)
def test_skip_counts_and_reports_malformed_lines(tmp_path: Path, caplog):
    folder = tmp_path / "data"
    write_shards(folder)
    pipe = pipeline(folder, runner="threads", on_error="skip")
    with caplog.at_level(logging.WARNING, logger="zephon"):
        ids = sorted(r.payload["id"] for r in pipe)
    assert ids == [i for i in range(30) if i != 21]  # nothing else lost
    stats = pipe.stats()
    assert stats is not None and stats.skipped == 1
    assert "line 7" in stats.skipped_examples[0]
    assert "skipped 1 malformed record" in caplog.text
