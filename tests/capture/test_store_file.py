"""The file store: conformance, torn-tail recovery, corruption, caches, compaction, ids."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.capture._procs import REPO, read_acks, spawn_writer
from tests.capture._workload import make_entry
from zephon.capture.conformance import run_conformance
from zephon.capture.protocols import TokenCaptureRetiredError
from zephon.capture.stores import _file as file_mod
from zephon.capture.stores import open_store
from zephon.capture.stores._events import Put, encode_event
from zephon.capture.stores._file import FileStore, reset_process_cache
from zephon.capture.stores._filelog import read_log
from zephon.capture.stores._fsutil import LogCorruptionError, frame_parts
from zephon.capture.testing import Mutation, assert_mutation_caught


@pytest.fixture(autouse=True)
def _cold_cache() -> None:
    reset_process_cache()


T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.mark.parametrize("offload", ["thread", "inline"])
def test_file_store_passes_conformance(tmp_path: Path, offload: str) -> None:
    url = f"file://{tmp_path}/cap?offload={offload}"
    report = _run(run_conformance(*(lambda: open_store(url),) * 4))
    failed = [r for r in report.results if r.status == "failed"]
    assert not failed
    assert sum(r.status == "passed" for r in report.results) >= 25


def _flip(path: Path, offset: int) -> None:
    """Damage one byte in place (size unchanged) behind the store's back."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def _line_offsets(path: Path) -> list[int]:
    """Where the head (0) and each record start."""
    return [0] + [r.offset for r in read_log(path.read_bytes())[1].records]


def test_torn_final_record_is_ignored_then_cut_off(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    rid = "torn"
    _run(store.put(make_entry(rid, "c1")))
    _run(store.put(make_entry(rid, "c2")))
    log = Path(store.log_path(rid))
    valid = log.stat().st_size
    # What a writer killed in the middle of its append leaves behind.
    c3 = make_entry(rid, "c3")
    line = b"".join(
        frame_parts(
            b"p", encode_event(Put(call_id="c3", key="0" * 64)), b"\t", c3.canonical_bytes()
        )
    )
    with open(log, "ab") as f:
        f.write(line[: len(line) // 2])
    reset_process_cache()  # a restarted process
    assert {*FileStore(str(tmp_path)).state_of(rid).entry_keys} == {"c1", "c2"}
    assert log.stat().st_size > valid  # a reader leaves the torn bytes alone
    _run(store.put(c3))  # the next writer cuts them off and appends cleanly
    result = read_log(log.read_bytes())[1]
    assert result.torn == 0
    assert len(result.records) == 3  # three puts after the head
    snap = _run(FileStore(str(tmp_path)).freeze(rid))
    assert sorted(e.model_call_id for e in snap.entries) == ["c1", "c2", "c3"]
    assert snap.version == 4 and not snap.incomplete


def test_corruption_before_the_last_line_is_refused_with_file_and_offset(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    rid = "corrupt"
    for cid in ("c1", "c2", "c3"):
        _run(store.put(make_entry(rid, cid)))
    log = Path(store.log_path(rid))
    first_put = _line_offsets(log)[1]
    _flip(log, first_put + 40)
    reset_process_cache()
    cold = FileStore(str(tmp_path))
    with pytest.raises(LogCorruptionError, match=rf"{log} is damaged at byte {first_put}:"):
        _run(cold.put(make_entry(rid, "c4")))
    with pytest.raises(LogCorruptionError, match=f"byte {first_put}") as info:
        _run(cold.freeze(rid))
    assert (info.value.path, info.value.offset) == (str(log), first_put)


def test_put_does_not_reparse_the_log(tmp_path: Path) -> None:
    """A warm writer only looks at the file size: damage behind its back goes unread."""
    store = FileStore(str(tmp_path))
    rid = "o1"
    for cid in ("c1", "c2"):
        _run(store.put(make_entry(rid, cid)))
    log = Path(store.log_path(rid))
    _flip(log, _line_offsets(log)[1] + 40)
    _run(store.put(make_entry(rid, "c3")))  # O(1): no re-read of earlier records
    _run(store.put(make_entry(rid, "c3")))  # identical retry: still a no-op
    with pytest.raises(ValueError, match="different bytes"):
        _run(store.put(make_entry(rid, "c3", gen=5)))  # conflict found from the cached index
    reset_process_cache()
    with pytest.raises(LogCorruptionError):
        _run(FileStore(str(tmp_path)).put(make_entry(rid, "c4")))


def test_repeated_freeze_is_served_from_the_cached_snapshot(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    rid = "refreeze"
    for cid in ("c1", "c2"):
        _run(store.put(make_entry(rid, cid)))
    first = _run(store.freeze(rid))
    log = Path(store.log_path(rid))
    _flip(log, _line_offsets(log)[2] + 40)
    again = _run(FileStore(str(tmp_path)).freeze(rid))  # another client, same process
    assert again is first
    # A change moves the version and invalidates the cache (and now the damage is read).
    _run(store.mark_incomplete(rid, "c9"))
    reset_process_cache()
    with pytest.raises(LogCorruptionError):
        _run(store.freeze(rid))


def test_writes_of_other_processes_are_read_from_the_tail(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    store = FileStore(str(tmp_path))
    rid = "shared"
    _run(store.put(make_entry(rid, "parent-1")))
    child = spawn_writer(url, {"puts": [[rid, "child-1"], [rid, "child-2"]]})
    out, _ = child.communicate(timeout=60)
    acked, errors = read_acks(out.splitlines())
    assert not errors and len(acked) == 2
    _run(store.put(make_entry(rid, "parent-2")))
    snap = _run(store.freeze(rid))
    assert {e.model_call_id for e in snap.entries} == {
        "parent-1",
        "child-1",
        "child-2",
        "parent-2",
    }
    assert snap.version == 5


def test_retire_compacts_the_log_and_delete_removes_it(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    rid = "life"
    for i in range(5):
        _run(store.put(make_entry(rid, f"c{i}", prompt=2000)))
    log = Path(store.log_path(rid))
    big = log.stat().st_size
    snap = _run(store.freeze(rid))
    assert _run(store.drop(rid, snapshot_id=snap.snapshot_id, version=snap.version))
    assert log.stat().st_size < 2000 < big  # header + one state record
    reset_process_cache()
    with pytest.raises(TokenCaptureRetiredError):
        _run(FileStore(str(tmp_path)).put(make_entry(rid, "late")))
    removal = _run(store.delete(rid))
    assert removal.changed == (rid,)
    assert not log.exists()
    _run(store.put(make_entry(rid, "fresh")))
    snap = _run(store.freeze(rid))
    assert [e.model_call_id for e in snap.entries] == ["fresh"]


def test_a_cached_handle_follows_a_log_retired_by_another_process(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    rid = "follow"
    _run(store.put(make_entry(rid, "c1")))  # this process now caches the open log
    code = (
        "import asyncio, sys; from zephon.capture.stores._file import FileStore; "
        "asyncio.run(FileStore(sys.argv[1]).retire(sys.argv[2]))"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    subprocess.run([sys.executable, "-c", code, str(tmp_path), rid], check=True, env=env)
    with pytest.raises(TokenCaptureRetiredError):
        _run(store.put(make_entry(rid, "c2")))
    assert store.state_of(rid).retired
    code = code.replace(".retire(", ".delete(")
    subprocess.run([sys.executable, "-c", code, str(tmp_path), rid], check=True, env=env)
    _run(store.put(make_entry(rid, "c2")))  # the id is unused again
    assert list(store.state_of(rid).entry_keys) == ["c2"]


@pytest.mark.parametrize("rid", ["../escape", "a/b", "", "é", ".."])
def test_unsafe_rollout_ids_are_refused(tmp_path: Path, rid: str) -> None:
    store = FileStore(str(tmp_path / "d"))
    with pytest.raises(ValueError, match="invalid"):
        _run(store.mark_incomplete(rid))
    with pytest.raises(ValueError, match="invalid"):
        _run(store.freeze(rid))
    assert os.listdir(tmp_path) == ["d"] and os.listdir(tmp_path / "d") == []


def test_a_log_renamed_to_another_rollout_is_refused(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    _run(store.put(make_entry("alpha", "c1")))
    os.rename(store.log_path("alpha"), store.log_path("beta"))
    with pytest.raises(LogCorruptionError, match="beta"):
        _run(store.freeze("beta"))


def test_handle_cache_eviction_keeps_results_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_mod, "_MAX_HANDLES", 2)
    store = FileStore(str(tmp_path))
    for i in range(6):
        _run(store.put(make_entry(f"r{i}", "c1")))
        _run(store.put(make_entry(f"r{i}", "c2")))
    assert len(file_mod._HANDLES) <= 2
    for i in range(6):
        snap = _run(store.freeze(f"r{i}"))
        assert sorted(e.model_call_id for e in snap.entries) == ["c1", "c2"]


@pytest.mark.parametrize(
    "url", ["file://host/dir", "file:", "file:///tmp/x?fsync=off", "file:///tmp/x?offload=maybe"]
)
def test_bad_file_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="file"):
        FileStore.from_url(url)


def test_file_store_mutations_are_caught(tmp_path: Path, mutation: Mutation) -> None:
    url = f"file://{tmp_path}/cap"
    assert_mutation_caught(lambda: open_store(url), mutation)


def test_cached_snapshots_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_mod, "_MAX_SNAPSHOTS", 2)
    store = FileStore(str(tmp_path))
    snaps = {}
    for rid in ("a", "b", "c"):
        _run(store.put(make_entry(rid, "c1")))
        snaps[rid] = _run(store.freeze(rid))
    assert len(file_mod._SNAPSHOT_HOLDERS) == 2
    assert _run(store.freeze("c")) is snaps["c"]  # still cached
    again = _run(store.freeze("a"))  # evicted: rebuilt from the log, identical content
    assert again is not snaps["a"] and again == snaps["a"]


def test_a_file_that_is_not_a_capture_log_is_refused(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    Path(store.log_path("alien")).write_bytes(b"".join(frame_parts(b"e", b'{"op":"retire"}')))
    before = Path(store.log_path("alien")).read_bytes()
    for attempt in (store.freeze("alien"), store.put(make_entry("alien", "c1"))):
        with pytest.raises(LogCorruptionError, match="is not a zephon capture log"):
            _run(attempt)
    with pytest.raises(LogCorruptionError, match="never modifies it"):
        _run(store.delete("alien"))
    assert Path(store.log_path("alien")).read_bytes() == before


@pytest.mark.timeout(60)
def test_concurrent_puts_from_threads_of_one_process(tmp_path: Path) -> None:
    """Many in-flight puts (thread offload) from several clients of one process."""

    async def scenario() -> None:
        clients = [FileStore(str(tmp_path)) for _ in range(3)]
        puts = [
            clients[i % 3].put(make_entry("same" if i % 2 else f"own-{i}", f"c{i}"))
            for i in range(60)
        ]
        retries = [clients[i % 3].put(make_entry("same", f"c{i}")) for i in range(1, 60, 2)]
        await asyncio.gather(*puts, *retries)
        snap = await clients[0].freeze("same")
        assert sorted(e.model_call_id for e in snap.entries) == sorted(
            f"c{i}" for i in range(1, 60, 2)
        )
        assert snap.version == 31 and not snap.incomplete
        for i in range(0, 60, 2):
            assert list(clients[1].state_of(f"own-{i}").entry_keys) == [f"c{i}"]

    asyncio.run(scenario())


def test_a_crashed_retire_leftover_is_reused_and_removed(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    _run(store.put(make_entry("t", "c1")))
    leftover = Path(store.log_path("t") + ".tmp")
    leftover.write_bytes(b"half a state record")  # what a retire killed before its rename leaves
    _run(store.retire("t"))
    assert not leftover.exists() and store.state_of("t").retired
    leftover.write_bytes(b"again")
    _run(store.delete("t"))
    assert not leftover.exists() and not Path(store.log_path("t")).exists()
