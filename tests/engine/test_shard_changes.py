"""A shard file that changes while a run reads it stops the run with one line naming the file
and what happened; no row read from the changed file is delivered."""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.engine._gate import WAIT_S, Gate, wait_for
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon.errors import DataFormatError
from zephon.io import build_index

SHARDS = 4
ROWS = 400  # per shard: far more than the run reads ahead with the short queues below


def write_shard(path: Path, tag: str, rows: int = ROWS) -> None:
    lines = (json.dumps({"id": i, "text": f"{tag} row {i:04d}"}) for i in range(rows))
    path.write_text("".join(line + "\n" for line in lines))


def write_corpus(folder: Path) -> list[Path]:
    folder.mkdir(parents=True)
    paths = [folder / f"part-{s}.jsonl" for s in range(SHARDS)]
    for path in paths:
        write_shard(path, "old")
    return paths


def pipeline(folder: Path, runner: str, gate: Gate) -> Pipeline:
    ds = Dataset.from_path("rows", folder)
    source = StaticMixtureWorkSource(
        datasets=[ds], mixture=MixtureSpec({"rows": 1.0}), chunk_size=8, seed=0
    )
    pipe = Pipeline(source).map_transform(gate).options(runner=runner, queue_size=1)
    return pipe


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


def run_and_change(
    folder: Path, runner: str, change: Callable[[], None], **options: Any
) -> list[str]:
    """Run over ``folder``; while its first records are held at a gate after fetch (so the
    run is under way and has read little), a thread applies ``change``, then opens the gate.
    Returns the texts delivered; ``options["delivered"]``, a list, gets them as they come,
    also when the run raises."""
    texts: list[str] = options.pop("delivered", [])
    gate = Gate(folder.parent)

    def changer() -> None:
        if wait_for(gate.reached):
            change()
        gate.open.touch()

    thread = threading.Thread(target=changer, daemon=True)
    thread.start()
    try:
        for record in pipeline(folder, runner, gate).options(**options):
            texts.append(record.payload["text"])
    finally:
        gate.open.touch()
        thread.join(timeout=WAIT_S)
    return texts


@pytest.mark.timeout(600)
@pytest.mark.parametrize("runner", ["threads", "process"])
def test_a_shard_renamed_over_during_a_run_stops_it_in_ten_of_ten_tries(
    tmp_path: Path, runner: str
) -> None:
    for attempt in range(10):
        paths = write_corpus(tmp_path / f"try-{attempt}" / "data")
        delivered: list[str] = []
        change = functools.partial(rename_over, paths)
        with pytest.raises(DataFormatError) as info:
            run_and_change(paths[0].parent, runner, change, delivered=delivered)
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
        run_and_change(paths[0].parent, runner, lambda: truncate(paths))
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
        run_and_change(paths[0].parent, "threads", delete)


@pytest.mark.timeout(300)
def test_a_skipping_run_still_stops_on_a_changed_shard(tmp_path: Path) -> None:
    paths = write_corpus(tmp_path / "data")
    with pytest.raises(DataFormatError, match="was truncated while the run"):
        run_and_change(paths[0].parent, "threads", lambda: truncate(paths), on_error="skip")


@pytest.mark.timeout(300)
def test_the_stale_index_message_only_when_an_index_exists(tmp_path: Path) -> None:
    indexed = write_corpus(tmp_path / "indexed" / "data")
    build_index(indexed[0].parent)
    write_shard(indexed[1], "old", rows=ROWS - 3)  # changed after `zephon index`, before the run
    with pytest.raises(DataFormatError) as info:
        run_and_change(indexed[0].parent, "threads", lambda: None)
    assert f"{indexed[1]} has {ROWS - 3} rows but the dataset index says {ROWS}" in str(info.value)
    assert "rebuild the index" in str(info.value)

    counted = write_corpus(tmp_path / "counted" / "data")

    def shorten() -> None:
        for path in counted:
            write_shard(path, "old", rows=ROWS - 3)

    with pytest.raises(DataFormatError) as info:
        run_and_change(counted[0].parent, "process", shorten)
    assert "zephon index" not in str(info.value) and "while the run was reading it" in str(
        info.value
    )
