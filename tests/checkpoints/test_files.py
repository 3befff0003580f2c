"""Checkpoint files: atomic writes, every kind of damage refused by name, newest valid found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.checkpoints import (
    checkpoint_files,
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    seal,
)
from zephon.errors import CheckpointError


def state_after(items: int) -> dict:
    rows = [{"text": f"doc {i}"} for i in range(64)]
    source = StaticMixtureWorkSource([Dataset.from_records("d", rows)], chunk_size=8)
    pipe = Pipeline(source).decode_text().tokenize("bytes").batch(2).options(runner="inline")
    it = iter(pipe)
    for _ in range(items):
        next(it)
    return pipe.checkpoint()


def test_save_is_atomic_and_round_trips(tmp_path: Path):
    state = state_after(3)
    path = save_checkpoint(checkpoint_path(tmp_path / "new-dir", 3), state)
    assert [p.name for p in (tmp_path / "new-dir").iterdir()] == ["ckpt-0000000003.json"]
    assert load_checkpoint(path) == json.loads(json.dumps(state))


def test_entries_added_by_the_caller_are_covered_by_the_checksum(tmp_path: Path):
    state = {**state_after(1), "mine": {"step": 7}}
    path = save_checkpoint(tmp_path / "c.json", state)  # sealed again on save
    assert load_checkpoint(path)["mine"] == {"step": 7}
    raw = json.loads(path.read_text())
    raw["mine"]["step"] = 8
    path.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        load_checkpoint(path)
    assert seal(raw)["checksum"] != raw["checksum"]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "the file is empty (0 bytes)"),
        (b"\n  \n", "the file is empty"),
        (b'{"format": "zephon.pipeline-checkpoint", "ver', "not valid JSON"),
        (b"\xff\xfe\x00", "not valid JSON"),
        (b'{"format": "other", "version": 1}', "not a zephon pipeline checkpoint"),
        (b"[1, 2, 3]", "a checkpoint is a dict"),
    ],
)
def test_damaged_files_are_refused_naming_the_file(tmp_path: Path, content: bytes, words: str):
    path = tmp_path / "ckpt-0000000001.json"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value).startswith(f"{path}: ") and words in str(info.value)


def test_a_missing_file_is_named(tmp_path: Path):
    with pytest.raises(CheckpointError, match="no such checkpoint file"):
        load_checkpoint(tmp_path / "absent.json")


def test_latest_checkpoint_skips_damaged_newer_files(tmp_path: Path):
    for n in (2, 4, 6):
        save_checkpoint(checkpoint_path(tmp_path, n), state_after(n))
    checkpoint_path(tmp_path, 6).write_text("{")
    checkpoint_path(tmp_path, 4).write_text("")
    found = latest_checkpoint(tmp_path)
    assert found is not None and found.path == checkpoint_path(tmp_path, 2)
    assert [p.name for p, _ in found.rejected] == ["ckpt-0000000006.json", "ckpt-0000000004.json"]
    assert len(checkpoint_files(tmp_path)) == 3  # looking changes nothing
    found = latest_checkpoint(tmp_path, set_aside=True)
    assert found is not None
    assert [p.name for p in checkpoint_files(tmp_path)] == ["ckpt-0000000002.json"]
    assert sorted(p.name for p in tmp_path.glob("*.invalid")) == [
        "ckpt-0000000004.json.invalid",
        "ckpt-0000000006.json.invalid",
    ]


def test_no_valid_checkpoint_is_an_error_and_nothing_is_set_aside(tmp_path: Path):
    checkpoint_path(tmp_path, 1).write_text("")
    with pytest.raises(CheckpointError, match="no valid checkpoint in"):
        latest_checkpoint(tmp_path, set_aside=True)
    assert checkpoint_path(tmp_path, 1).exists()
    assert latest_checkpoint(tmp_path / "empty-dir") is None
