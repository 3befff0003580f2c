"""A shard file that changes while a run reads it stops the run with one line naming the file
and what happened; no row read from the changed file is delivered."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon.errors import DataFormatError
from zephon.io import build_index

SHARDS = 4
ROWS = 2500  # per shard: far more than the run reads ahead with the short queues below


def write_shard(path: Path, tag: str, rows: int = ROWS) -> None:
    lines = (json.dumps({"id": i, "text": f"{tag} row {i:04d}"}) for i in range(rows))
    path.write_text("".join(line + "\n" for line in lines))


def write_corpus(folder: Path) -> list[Path]:
    folder.mkdir(parents=True)
    paths = [folder / f"part-{s}.jsonl" for s in range(SHARDS)]
    for path in paths:
        write_shard(path, "old")
    return paths


def pipeline(folder: Path, runner: str) -> Pipeline:
    ds = Dataset.from_path("rows", folder)
    source = StaticMixtureWorkSource(
        datasets=[ds], mixture=MixtureSpec({"rows": 1.0}), chunk_size=8, seed=0
    )
    return Pipeline(source).options(runner=runner, queue_size=1, max_inflight=2)


def rename_over(paths: list[Path]) -> None:
    """Write a new file with the same rows (other text) beside each shard, renamed over it."""
    for path in paths:
        fresh = path.with_name(path.name + ".new")
        write_shard(fresh, "new")
        os.replace(fresh, path)


def truncate(paths: list[Path]) -> None:
    for path in paths:
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)


def run_and_change(pipe: Pipeline, change: Callable[[], None], after: int = 20) -> list[str]:
    """Iterate ``pipe``; once ``after`` records arrived, a thread applies ``change`` while the
    consumer waits for it (so the run is mid-way, its read-ahead bounded by its queues), then
    the consumer goes on. Returns the texts delivered before the run raised."""
    reached, changed = threading.Event(), threading.Event()

    def changer() -> None:
        if reached.wait(timeout=120):
            change()
        changed.set()

    thread = threading.Thread(target=changer, daemon=True)
    thread.start()
    texts: list[str] = []
    try:
        for record in pipe:
            texts.append(record.payload["text"])
            if len(texts) == after:
                reached.set(); import sys as _s, time as _t; print("REACHED", _t.monotonic(), file=_s.stderr)
                assert changed.wait(timeout=120)
    finally:
        reached.set()
        thread.join(timeout=120)
    return texts


@pytest.mark.timeout(600)
@pytest.mark.parametrize("runner", ["threads", "process"])
def test_a_shard_renamed_over_during_a_run_stops_it_in_ten_of_ten_tries(
    tmp_path: Path, runner: str
) -> None:
    for attempt in range(10):
        paths = write_corpus(tmp_path / f"try-{attempt}")
        delivered: list[str] = []
        with pytest.raises(DataFormatError) as info:
            delivered = run_and_change(pipeline(paths[0].parent, runner), lambda: rename_over(paths))
        message = str(info.value)
        assert "was replaced by another file while the run was reading it" in message
        assert any(str(p) in message for p in paths), message
        assert "start a new --checkpoint-dir" in message and "\n" not in message
        assert not [t for t in delivered if t.startswith("new")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_a_shard_truncated_during_a_run_is_named_as_truncated(tmp_path: Path, runner: str) -> None:
    paths = write_corpus(tmp_path / "data")
    with pytest.raises(DataFormatError) as info:
        run_and_change(pipeline(paths[0].parent, runner), lambda: truncate(paths))
    message = str(info.value)
    assert "was truncated while the run was reading it" in message, message
    assert any(str(p) in message for p in paths), message
    assert "malformed JSON" not in message and "on_error" not in message


@pytest.mark.timeout(300)
def test_a_shard_deleted_during_a_run_is_named(tmp_path: Path) -> None:
    paths = write_corpus(tmp_path / "data")

    def delete() -> None:
        for path in paths:
            path.unlink()

    with pytest.raises(DataFormatError, match="was deleted or moved away while the run"):
        run_and_change(pipeline(paths[0].parent, "threads"), delete)


@pytest.mark.timeout(300)
def test_a_skipping_run_still_stops_on_a_changed_shard(tmp_path: Path) -> None:
    paths = write_corpus(tmp_path / "data")
    pipe = pipeline(paths[0].parent, "threads").options(on_error="skip")
    with pytest.raises(DataFormatError, match="was truncated while the run"):
        run_and_change(pipe, lambda: truncate(paths))


@pytest.mark.timeout(300)
def test_the_stale_index_message_only_when_an_index_exists(tmp_path: Path) -> None:
    indexed = write_corpus(tmp_path / "indexed")
    build_index(indexed[0].parent)
    write_shard(indexed[1], "old", rows=ROWS - 3)  # changed after `zephon index`, before the run
    with pytest.raises(DataFormatError) as info:
        list(pipeline(indexed[0].parent, "threads"))
    assert f"{indexed[1]} has {ROWS - 3} rows but the dataset index says {ROWS}" in str(info.value)
    assert "rebuild the index" in str(info.value)

    counted = write_corpus(tmp_path / "counted")

    def shorten() -> None:
        for path in counted:
            write_shard(path, "old", rows=ROWS - 3)

    with pytest.raises(DataFormatError) as info:
        run_and_change(pipeline(counted[0].parent, "process"), shorten)
    assert "zephon index" not in str(info.value) and "while the run was reading it" in str(
        info.value
    )
