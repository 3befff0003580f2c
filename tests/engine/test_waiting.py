"""``Pipeline.interrupt_when`` on every runner and in the engine process: once the caller's
check says stop while the iteration waits for an item (here an operator that turned slow),
the iteration raises ``WaitInterrupted`` and its checkpoint resumes exactly."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline
from zephon.errors import WaitInterrupted
from zephon.types import SampleBatch

CRAWL = "ZEPHON_TEST_CRAWL"


def crawl(payload: dict[str, Any]) -> dict[str, Any]:
    """Once the file ``$ZEPHON_TEST_CRAWL`` exists, 50 ms a record: a call that no longer
    keeps up (in any process: the file is what the workers share with the test)."""
    marker = os.environ.get(CRAWL)
    if marker is not None and os.path.exists(marker):
        time.sleep(0.05)
    return payload


def build(runner: str, fn: Callable[[Any], Any] = crawl, **options: Any) -> Pipeline:
    docs = [{"id": i, "text": f"doc {i} " * (1 + i % 7)} for i in range(400)]
    ds = Dataset.from_records("docs", docs, shard_size=50)
    return (
        Pipeline(RangeSource([ds], chunk_size=20))
        .fetch()
        .decode_text()
        .map_transform(fn)
        .batch(4)
        .options(runner=runner, canonical_replicas=2, queue_size=1, **options)
    )


def key(batch: Any) -> Any:
    assert isinstance(batch, SampleBatch)
    return [(r.meta.sample_id, r.payload) for r in batch]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("runner", "options"),
    [
        ("inline", {}),
        ("threads", {}),
        ("process", {}),
        ("inline", {"engine_process": True}),
        ("threads", {"engine_process": True}),
    ],
)
def test_interrupt_when_stops_a_slow_wait_and_the_checkpoint_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runner: str, options: dict[str, Any]
) -> None:
    marker = tmp_path / "crawl"
    monkeypatch.setenv(CRAWL, str(marker))
    expected = [key(b) for b in build(runner, **options)]
    pipe = build(runner, **options).interrupt_when(marker.exists)
    got = []
    with pytest.raises(WaitInterrupted, match="interrupt_when"):
        for batch in pipe:
            got.append(key(batch))
            if len(got) == 3:
                marker.touch()  # from now on the operator is slow: the consumer waits
    assert 3 <= len(got) < len(expected)
    state = pipe.checkpoint()
    marker.unlink()
    resumed = build(runner, **options).restore(state)
    assert got + [key(b) for b in resumed] == expected


def test_without_a_check_a_slow_operator_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "crawl"
    monkeypatch.setenv(CRAWL, str(marker))
    expected = [key(b) for b in build("inline")]
    pipe = build("inline").interrupt_when(lambda: False)
    got = []
    for batch in pipe:
        got.append(key(batch))
        if len(got) == len(expected) - 5:
            marker.touch()  # the last 20 records take a second: more than a wait's slice
    assert got == expected


_RELEASE = threading.Event()
_SEEN = [0]
_SEEN_LOCK = threading.Lock()


def block_after_200(payload: dict[str, Any]) -> dict[str, Any]:
    """Never returns after 200 records, until the test sets ``_RELEASE`` (a thread cannot be
    killed: the test lets it go once the run has left it behind)."""
    with _SEEN_LOCK:
        _SEEN[0] += 1
        blocked = _SEEN[0] > 200
    if blocked:
        _RELEASE.wait()
    return payload


@pytest.mark.timeout(300)
def test_a_stop_leaves_a_thread_that_never_returns_behind_and_names_its_operator() -> None:
    expected = [key(b) for b in build("threads")]
    _SEEN[0] = 0
    _RELEASE.clear()
    stop = threading.Event()
    pipe = build("threads", fn=block_after_200).interrupt_when(stop.is_set)
    got = []
    try:
        with pytest.raises(WaitInterrupted) as info:
            for batch in pipe:
                got.append(key(batch))
                if len(got) == 3:
                    stop.set()
        notes = "\n".join(getattr(info.value, "__notes__", []))
        # the thread running it (its driver: one copy runs there) is named, and left behind
        assert "within 10 s" in notes and "operator 'map_transform'" in notes, notes
        assert 3 <= len(got) < len(expected)
        state = pipe.checkpoint()
    finally:
        _RELEASE.set()  # from now on it passes records through
    resumed = build("threads", fn=block_after_200).restore(state)
    assert got + [key(b) for b in resumed] == expected


HANG = "ZEPHON_TEST_HANG_WHEN"


def hang_when_marked(payload: dict[str, Any]) -> dict[str, Any]:
    """Never returns once the file ``$ZEPHON_TEST_HANG_WHEN`` exists (in the engine process,
    which the consumer kills when it closes)."""
    marker = os.environ.get(HANG)
    if marker is not None and os.path.exists(marker):
        threading.Event().wait()
    return payload


@pytest.mark.timeout(300)
def test_a_stop_kills_an_engine_process_stuck_in_an_operator_and_names_the_operator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "hang"
    monkeypatch.setenv(HANG, str(marker))
    expected = [key(b) for b in build("threads")]
    stop = threading.Event()
    pipe = build("threads", fn=hang_when_marked, engine_process=True).interrupt_when(stop.is_set)
    got = []
    with pytest.raises(WaitInterrupted) as info:
        for batch in pipe:
            got.append(key(batch))
            if len(got) == 3:
                pid = pipe._engine.pid  # type: ignore[union-attr]
                marker.touch()  # from now on the operator never returns
                stop.set()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "operator 'map_transform' did not return within 10 s" in notes, notes
    assert f"engine process pid {pid}, thread zephon-engine-" in notes, notes
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(pid, 0)
    assert 3 <= len(got) < len(expected)
    state = pipe.checkpoint()
    marker.unlink()
    resumed = build("threads", fn=hang_when_marked, engine_process=True).restore(state)
    assert got + [key(b) for b in resumed] == expected
