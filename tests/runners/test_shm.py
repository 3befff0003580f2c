"""Shared-memory segments: handles, passthrough, lifetime, stale sweep, signals, kill -9."""

from __future__ import annotations

import gc
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.runners._leaks import descendants_of, our_segments, process_gone
from tests.runners._shm_child import CHILD, dead_pid
from zephon._engine.handoff import shm
from zephon._engine.handoff.messages import REPLIES, Failed
from zephon._engine.workers import worker
from zephon.types import ContributorRef, SampleCursor, SampleMeta, SampleRecord

ROOT = Path(__file__).resolve().parents[2]


def test_handles_resolve_lazily_pass_through_without_copy_and_unlink_when_dropped():
    session = shm.ShmSession(min_bytes=1024)
    try:
        enc = session.encoder("t")
        big = np.arange(4096, dtype=np.int64).reshape(64, 64)
        data, keep = enc.dumps({"big": big, "small": np.arange(3), "nested": [(big[::2],)]})
        assert len(session.files()) == 1  # one segment per message
        msg = shm.loads(data)
        ref = msg["big"]
        assert isinstance(ref, shm.ShmArrayRef) and ref.shape == (64, 64)
        assert isinstance(msg["small"], np.ndarray)  # below the threshold: pickled
        view = ref.resolve()
        assert np.array_equal(view, big)
        assert np.array_equal(np.asarray(msg["nested"][0][0]), big[::2])
        # Shipping the resolved view on reuses its segment: no new file, no copy.
        data2, keep2 = enc.dumps({"again": view})
        assert len(session.files()) == 1
        assert shm.loads(data2)["again"].args == ref.args
        # Foreign picklers get a plain array.
        import pickle

        assert np.array_equal(pickle.loads(pickle.dumps(ref)), big)
        del data, keep, msg, ref, view, data2, keep2
        gc.collect()
        assert session.files() == []  # the last mapping went away: the file is unlinked
    finally:
        session.close()


def test_stale_segments_of_a_dead_owner_are_removed_at_start_live_ones_kept():
    directory = shm.shm_dir()
    stale = directory / f"{shm.NAME_PREFIX}{dead_pid()}-0badc0de-w1-0"
    alive = directory / f"{shm.NAME_PREFIX}{os.getpid()}-feedf00d-p0-0"
    stale.write_bytes(b"x" * 10)
    alive.write_bytes(b"y" * 10)
    try:
        session = shm.ShmSession()
        session.close()
        assert not stale.exists()
        assert alive.exists()
    finally:
        alive.unlink(missing_ok=True)
        stale.unlink(missing_ok=True)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start_child(
    tmp_path: Path, *, own_group: bool = False, sigint_ignored: bool = False
) -> tuple[subprocess.Popen[str], list[int]]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=own_group,  # its own process group, as a job under a scheduler
        preexec_fn=_ignore_sigint if sigint_ignored else None,  # as nohup, or a parent's state
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "READY", proc.stderr.read() if proc.stderr else ""
    assert our_segments(proc.pid)  # the child holds records whose arrays live in /dev/shm
    return proc, [int(p) for p in line[1:]]


def _wait_gone(pids: list[int], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not all(process_gone(p) for p in pids):
        assert time.monotonic() < deadline, f"worker processes {pids} did not exit"
        time.sleep(0.05)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_remove_every_segment(tmp_path, signum):
    proc, workers = _start_child(tmp_path)
    proc.send_signal(signum)
    proc.communicate(timeout=30)
    assert proc.returncode != 0
    if signum == signal.SIGTERM:
        assert proc.returncode == -signal.SIGTERM  # killed by the signal, after cleaning up
    _wait_gone(workers)
    assert our_segments(proc.pid) == []


@pytest.mark.timeout(60)
def test_sigint_ends_the_script_even_when_it_started_with_sigint_ignored(tmp_path):
    """The script sets its own SIGINT handler: what it inherits cannot turn the test of its
    segments into a run to the end (exit 0)."""
    proc, workers = _start_child(tmp_path, sigint_ignored=True)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGINT and err.rstrip().endswith("KeyboardInterrupt")
    _wait_gone(workers)
    assert our_segments(proc.pid) == []


@pytest.mark.timeout(60)
def test_kill_9_of_the_engine_alone_workers_remove_their_segments(tmp_path):
    proc, workers = _start_child(tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    _wait_gone(workers)  # they see the engine's end of the pipe close and clean up
    assert our_segments(proc.pid) == []


@pytest.mark.timeout(60)
def test_segments_of_a_run_killed_whole_are_swept_by_the_next_engine(tmp_path):
    proc, workers = _start_child(tmp_path, own_group=True)
    group = descendants_of(proc.pid)  # the forkserver and the workers
    assert set(workers) <= set(group)
    os.killpg(proc.pid, signal.SIGKILL)  # the OOM killer or a scheduler killing the job
    proc.communicate(timeout=30)
    _wait_gone(group)
    assert our_segments(proc.pid)  # nobody could clean up...
    shm.ShmSession().close()  # ...until the next engine starts: the documented answer
    assert our_segments(proc.pid) == []


def test_encoders_of_one_session_never_reuse_a_segment_name():
    session = shm.ShmSession(min_bytes=8)
    try:
        a, b = session.encoder("p0"), session.encoder("p0")  # e.g. slot 0 of two fleets
        kept = [a.dumps(np.ones(64))[1], b.dumps(np.ones(64))[1]]
        assert len(session.files()) == 2
        del kept
    finally:
        session.close()
    assert session.files() == []


ARRAYS = [
    np.arange(600, dtype=np.float64).reshape(20, 30),
    np.asfortranarray(np.arange(600, dtype=np.int16).reshape(20, 30)),  # not C-contiguous
    np.arange(2000, dtype=np.int32)[::3],  # strided view
    np.arange(500, dtype=">u4"),  # big-endian
    np.array(["2024-01-01", "2025-06-30"] * 100, dtype="datetime64[D]"),
    np.zeros(100, dtype=[("a", "<i4"), ("b", "<f8", (2,))]),  # structured
    np.array(7.5),  # 0-d, below the threshold
    np.array([{"x": 1}] * 50, dtype=object),  # object arrays are always pickled
]


def test_every_dtype_layout_and_nesting_round_trips_bit_exact():
    session = shm.ShmSession(min_bytes=64)
    try:
        payload = {"arrays": ARRAYS, "nested": {"t": tuple(ARRAYS[:3])}, "text": "keep"}
        data, keep = session.encoder("t").dumps(payload)
        got = shm.loads(data)
        item = SampleRecord(None, got)  # type: ignore[arg-type]
        shm.resolve_items([item])
        out = item.payload
        assert out["text"] == "keep"
        backs = out["arrays"] + list(out["nested"]["t"])
        for original, back in zip(ARRAYS + list(ARRAYS[:3]), backs, strict=True):
            assert isinstance(back, np.ndarray)
            assert back.dtype == original.dtype and back.shape == original.shape
            if original.dtype.hasobject:
                assert back.tolist() == original.tolist()
            else:
                assert back.tobytes() == np.ascontiguousarray(original).tobytes()
        del data, keep, got, item, out
        gc.collect()
    finally:
        session.close()


def test_cursors_and_contributor_refs_come_back_equal_typed_and_shared():
    cursor = SampleCursor(3, 7, (1, 0), (0, 2, 9))
    refs = (ContributorRef(cursor, True), ContributorRef(SampleCursor(3, 8, (), (0, 2, 10)), False))
    meta = SampleMeta((0, 2, 9), 1, 3, 7, tags={"_contributors": refs})
    session = shm.ShmSession()
    try:
        data, _keep = session.encoder("c").dumps([meta, cursor, refs])
    finally:
        session.close()
    got_meta, got_cursor, got_refs = shm.loads(data)
    assert got_meta == meta and got_refs == refs and got_cursor == cursor
    assert [type(r) for r in got_refs] == [ContributorRef, ContributorRef]
    assert type(got_refs[0].cursor) is SampleCursor and type(got_cursor) is SampleCursor
    assert got_refs[0].cursor is got_cursor  # one object sent once stays one object
    assert got_cursor.sample_id == (0, 2, 9) and got_refs[1].is_last_child is False


def test_a_micro_batch_whose_segment_was_removed_is_one_clear_error_not_a_crash():
    session = shm.ShmSession(min_bytes=8)
    try:
        data, keep = session.encoder("p0").dumps((0, [np.arange(64)]))
        (name,) = session.files()
        os.unlink(shm.shm_dir() / name)  # e.g. a cleanup job sweeping /dev/shm
        del keep  # as in a worker: no mapping of it yet
        gc.collect()
        reply = worker.decode_request(data)
        assert isinstance(reply, bytes)
        failed = REPLIES.read(pickle.loads(reply))
        assert isinstance(failed, Failed)
        error = failed.error
        assert isinstance(error, shm.SegmentLostError)
        assert name in str(error) and "did not crash" in str(error) and "\n" not in str(error)
    finally:
        session.close()
