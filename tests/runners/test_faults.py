"""kill -9 a worker mid-run: it is respawned, its micro-batch retried, the output unchanged."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import pytest

from tests.engine._sources import GatedSource, RangeSource
from tests.runners._faulty import KillWorkerOp
from tests.runners._leaks import children_of, cmdline_of, wait_gone
from tests.runners._pipes import digest, key
from zephon import Dataset, Pipeline
from zephon._engine.workers.pools import WorkerCrashedError
from zephon._engine.workers.process_pool import ProcessWorkerPool

CHUNK = 40


def faulty(
    docs: list[dict[str, Any]],
    op: KillWorkerOp,
    runner: str,
    gate: threading.Event | None = None,
    **opts: Any,
) -> Pipeline:
    """decode -> ``op`` -> tokenize -> batch, two lanes; with ``gate``, the source holds the
    last chunk of lane 0 back until the gate opens (what comes before it makes the first
    items: an earlier hold could starve them)."""
    ds = Dataset.from_records("docs", docs, shard_size=50)
    last = (len(docs) - 1) // CHUNK // 2 * 2  # lane 0 deals the even chunks
    source = RangeSource([ds], CHUNK) if gate is None else GatedSource(gate, last, [ds], CHUNK)
    return (
        Pipeline(source)
        .decode_text(parallelism=2)
        .add_op(op, parallelism=2)
        .tokenize("bytes", max_length=40, parallelism=2)
        .batch(8)
        .options(runner=runner, canonical_replicas=2, shm_min_bytes=1, **opts)
    )


@pytest.mark.timeout(90)
def test_killed_process_worker_is_respawned_and_output_identical(docs, tmp_path, caplog):
    marker = tmp_path / "killed"
    marker.touch()  # the inline reference must not kill the test process
    expected = digest(faulty(docs, KillWorkerOp(marker, victim=301), "inline"))
    marker.unlink()
    with caplog.at_level(logging.WARNING, logger="zephon"):
        got = digest(faulty(docs, KillWorkerOp(marker, victim=301), "process"))
    assert marker.exists()  # a worker really died on record 301
    assert "'kill_worker': worker process" in caplog.text and "SIGKILL" in caplog.text
    assert got == expected


def kill_every_worker(pipe: Pipeline) -> set[Any]:
    """SIGKILL every process worker of ``pipe``'s running engine; returns its fleets."""
    engine = pipe._engine
    assert engine is not None
    fleets = {p.fleet for p in engine.resources.pools if isinstance(p, ProcessWorkerPool)}
    killed = [pid for fleet in fleets for pid in fleet.pids()]
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    assert killed
    return fleets


def killed_from_outside(
    docs: list[dict[str, Any]], tmp_path: Any, gate: threading.Event
) -> tuple[list[Any], Pipeline]:
    """The inline reference and a process pipeline whose operator kills nothing itself, the
    rest of its lane 0 held back until ``gate`` opens (the workers killed mid-run then have
    work left, however far the engine ran ahead of the test)."""
    op = KillWorkerOp(tmp_path / "unused", victim=-1)
    expected = digest(faulty(docs, op, "inline"))
    return expected, faulty(docs, op, "process", gate, queue_size=2)


@pytest.mark.timeout(90)
def test_kill_9_of_every_worker_from_outside_mid_run(docs, tmp_path):
    gate = threading.Event()
    expected, pipe = killed_from_outside(docs, tmp_path, gate)
    got = []
    fleets: set[Any] = set()
    try:
        for item in pipe:
            got.append(key(item))
            if not fleets:
                fleets = kill_every_worker(pipe)
                gate.set()
    finally:
        gate.set()
    assert got == expected
    assert sum(f.respawns for f in fleets) >= 1


def forkservers() -> list[int]:
    """This process's forkservers (the parents of its process workers)."""
    return [pid for pid in children_of(os.getpid()) if "forkserver" in cmdline_of(pid)]


@pytest.mark.timeout(90)
def test_kill_9_of_the_forkserver_then_of_every_worker_mid_run(docs, tmp_path):
    """Running workers outlive their forkserver; the respawns start a new one."""
    gate = threading.Event()
    expected, pipe = killed_from_outside(docs, tmp_path, gate)
    got = []
    servers: list[int] = []
    fleets: set[Any] = set()
    try:
        for item in pipe:
            got.append(key(item))
            if len(got) == 1:
                servers = forkservers()
                assert len(servers) == 1
                os.kill(servers[0], signal.SIGKILL)
                assert wait_gone(servers, timeout=30) == []
            if len(got) == 3:  # the workers went on serving without their server
                fleets = kill_every_worker(pipe)
                gate.set()
    finally:
        gate.set()
    assert got == expected
    assert sum(f.respawns for f in fleets) >= 1
    assert len(forkservers()) == 1 and forkservers() != servers


@pytest.mark.timeout(60)
def test_worker_that_always_dies_fails_after_max_retries_naming_the_operator(docs, tmp_path):
    op = KillWorkerOp(tmp_path / "m", victim=5, always=True)
    pipe = faulty(docs[:80], op, "process", max_worker_retries=1)
    with pytest.raises(WorkerCrashedError, match=r"operator 'kill_worker'.*killed by SIGKILL") as e:
        list(pipe)
    assert "max_worker_retries=1" in str(e.value)
    # a SIGKILL is most often the OOM killer's: said as likely, or as a fact when the
    # kernel's OOM-kill counters rose meanwhile
    assert "out of memory" in str(e.value) and "OOM killer" in str(e.value)


class SetupFails(KillWorkerOp):
    name = "setup_fails"

    def setup(self, ctx: Any) -> None:
        raise FileNotFoundError(f"no vocabulary at /nonexistent (worker {ctx.worker_index})")


@pytest.mark.timeout(60)
def test_setup_error_in_a_worker_is_reported_not_retried_as_a_crash(docs, tmp_path):
    pipe = faulty(docs[:80], SetupFails(tmp_path / "m", victim=-1), "process")
    with pytest.raises(FileNotFoundError, match="no vocabulary") as info:
        list(pipe)
    assert "operator 'setup_fails'" in "\n".join(getattr(info.value, "__notes__", []))
