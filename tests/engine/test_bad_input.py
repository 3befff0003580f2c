"""Malformed records: a clear error naming file and line, or skipped and reported."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon.errors import CheckpointError, DataFormatError


def write_shards(folder: Path, rows: int = 30) -> None:
    """Two shards of ``rows // 2`` rows; line 7 of b.jsonl is malformed."""
    folder.mkdir()
    half = rows // 2
    good = [json.dumps({"id": i, "text": f"row {i}"}) for i in range(rows)]
    (folder / "a.jsonl").write_text("\n".join(good[:half]) + "\n")
    lines = good[half:]
    lines[6] = f'{{"id": {half + 6}, "text": "unterminated'
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
    assert "skipped 1 unreadable record" in caplog.text
    logged = [r.getMessage() for r in caplog.records if "skipped a record" in r.getMessage()]
    assert len(logged) == 1
    assert "b.jsonl, line 7" in logged[0] and "dataset 'rows', shard 1, row 6" in logged[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runner", ["inline", "process"])
def test_skipped_records_go_to_the_quarantine_file_once_across_a_restore(
    tmp_path: Path, runner: str
):
    folder = tmp_path / "data"
    write_shards(folder)
    quarantine = tmp_path / "quarantine.jsonl"

    def build() -> Pipeline:
        return pipeline(folder, runner=runner, on_error="skip", quarantine=str(quarantine))

    expected = [r.payload["id"] for r in build()]
    quarantine.unlink()
    pipe = build()
    it = iter(pipe)
    first = [next(it).payload["id"] for _ in range(25)]  # past the bad line (id 21)
    state = json.loads(json.dumps(pipe.checkpoint()))
    it.close()  # type: ignore[attr-defined]
    rest = [r.payload["id"] for r in build().restore(state)]  # replays the bad line
    assert first + rest == expected
    entries = [json.loads(line) for line in quarantine.read_text().splitlines()]
    assert len(entries) == 1
    (entry,) = entries
    assert entry["file"].endswith("b.jsonl") and entry["line"] == 7
    assert (entry["dataset"], entry["shard"], entry["row"]) == ("rows", 1, 6)
    assert entry["sample_id"] == [0, 1, 6] and "malformed JSON" in entry["reason"]


@pytest.mark.timeout(60)
def test_a_run_that_raised_resumes_with_skip(tmp_path: Path):
    folder = tmp_path / "data"
    write_shards(folder, rows=400)
    expected = [r.payload["id"] for r in pipeline(folder, runner="inline", on_error="skip")]
    pipe = pipeline(folder, runner="inline")
    first = []
    with pytest.raises(DataFormatError):
        for record in pipe:
            first.append(record.payload["id"])
    assert first  # it failed mid-run, after delivering something
    state = json.loads(json.dumps(pipe.checkpoint()))
    resumed = pipeline(folder, runner="inline", on_error="skip").restore(state)
    assert first + [r.payload["id"] for r in resumed] == expected


def test_a_changed_dataset_refuses_resume_and_says_what_to_do(tmp_path: Path):
    folder = tmp_path / "data"
    write_shards(folder)
    state = pipeline(folder, runner="inline").checkpoint()
    lines = (folder / "b.jsonl").read_text().splitlines()
    (folder / "b.jsonl").write_text("\n".join(lines[:6] + lines[7:]) + "\n")  # bad line removed
    with pytest.raises(CheckpointError) as info:
        pipeline(folder, runner="inline").restore(state)
    message = str(info.value)
    assert "source.datasets[0].rows: checkpoint has 30, pipeline has 29" in message
    assert "on_error: skip" in message and "restore the file" in message


@pytest.mark.timeout(120)
def test_lane_workers_share_one_quarantine_file_cut_clean_first(tmp_path: Path):
    folder = tmp_path / "data"
    folder.mkdir()
    lines = [json.dumps({"id": i, "text": f"row {i}"}) for i in range(64)]
    bad = [3, 13, 22, 37, 50, 61]  # spread over the lanes
    for i in bad:
        lines[i] = f'{{"id": {i}, "text": "unterminated'
    (folder / "a.jsonl").write_text("\n".join(lines) + "\n")
    quarantine = tmp_path / "quarantine.jsonl"
    earlier = {"sample_id": [9, 9, 9], "reason": "from an earlier run"}
    quarantine.write_text(json.dumps(earlier) + "\n" + '{"sample_id": [0, 0, ')  # then a crash

    def build(**options) -> Pipeline:
        ds = Dataset.from_path("rows", folder)
        source = StaticMixtureWorkSource(
            datasets=[ds], mixture=MixtureSpec({"rows": 1.0}), chunk_size=4, seed=0
        )
        return Pipeline(source).decode_text().options(canonical_replicas=4, **options)

    ids = [r.payload["id"] for r in build(lane_workers=2, on_error="skip", quarantine=quarantine)]
    assert ids == [r.payload["id"] for r in build(runner="inline", on_error="skip")]
    assert sorted(ids) == [i for i in range(64) if i not in bad]
    entries = [json.loads(line) for line in quarantine.read_text().splitlines()]
    assert entries[0] == earlier
    assert sorted(e["line"] for e in entries[1:]) == [i + 1 for i in bad]
