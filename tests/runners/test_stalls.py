"""A process worker that is alive but silent (SIGSTOP): reported, killed, respawned, and the
micro-batch sent again; the output is the uninterrupted one."""

from __future__ import annotations

import logging
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.runners._faulty import StopWorkerOp
from tests.runners._pipes import digest, key
from tests.runners.test_faults import faulty
from zephon import Pipeline
from zephon._engine.workers.pools import WorkerCrashedError
from zephon._engine.workers.process_pool import ProcessWorkerPool
from zephon.errors import ConfigError

DEADLINE_S = 3.0

STALL_LINE = re.compile(
    r"operator 'stop_worker': worker process \d+ \(pid (\d+)\) did not answer within "
    r"3\.0 s .*; it was killed; respawned it and retrying the micro-batch \(attempt 2 of 4\)"
)


def stopped_run(docs: list[dict[str, Any]], marker: Path, victim: int, caplog: Any) -> list[Any]:
    op = StopWorkerOp(marker, victim=victim)
    with caplog.at_level(logging.WARNING, logger="zephon"):
        return digest(faulty(docs, op, "process", worker_deadline_s=DEADLINE_S))


def check_stopped_runs(docs: list[dict[str, Any]], tmp_path: Path, caplog: Any, n: int) -> None:
    """``n`` runs, each with one worker SIGSTOPped on another record: every one is reported
    (operator and pid) and replaced, and every output equals the inline one."""
    expected = digest(faulty(docs, StopWorkerOp(tmp_path / "never", victim=-1), "inline"))
    for run in range(n):
        victim = 17 + run * (560 // n)
        marker = tmp_path / f"stopped-{run}"
        caplog.clear()
        got = stopped_run(docs, marker, victim, caplog)
        assert marker.exists(), f"run {run}: no worker stopped on record {victim}"
        found = STALL_LINE.search(caplog.text)
        assert found is not None, caplog.text
        with pytest.raises(ProcessLookupError):  # the stopped worker was killed, not left
            os.kill(int(found.group(1)), 0)
        assert got == expected, f"run {run}: output differs"


@pytest.mark.timeout(300)
def test_stopped_worker_is_reported_replaced_and_output_unchanged_5_runs(docs, tmp_path, caplog):
    check_stopped_runs(docs, tmp_path, caplog, 5)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_stopped_worker_is_reported_replaced_and_output_unchanged_20_runs(docs, tmp_path, caplog):
    check_stopped_runs(docs, tmp_path, caplog, 20)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", ["small", "large"])
def test_every_worker_stopped_from_outside_mid_run(docs, tmp_path, caplog, size):
    """Stopped while idle: with large micro-batches (1.6 MB, more than a pipe holds) the next
    send blocks too, not only the wait for the reply."""
    if size == "large":
        docs = [{**d, "text": f"{d['text']} " + "x" * 200_000} for d in docs[:160]]
    op = StopWorkerOp(tmp_path / "unused", victim=-1)
    expected = digest(faulty(docs, op, "inline"))
    pipe = faulty(docs, op, "process", queue_size=2, worker_deadline_s=DEADLINE_S)
    got, stopped = [], []
    with caplog.at_level(logging.WARNING, logger="zephon"):
        for item in pipe:
            got.append(key(item))
            if not stopped:
                stopped = stop_every_worker(pipe)
    assert got == expected
    reported = {int(pid) for pid in re.findall(r"\(pid (\d+)\) did not answer", caplog.text)}
    assert reported and reported <= set(stopped)


def stop_every_worker(pipe: Pipeline) -> list[int]:
    engine = pipe._engine
    assert engine is not None
    fleets = {p.fleet for p in engine.resources.pools if isinstance(p, ProcessWorkerPool)}
    pids = [pid for fleet in fleets for pid in fleet.pids()]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    assert pids
    return pids


@pytest.mark.timeout(120)
def test_a_worker_that_always_stalls_fails_naming_the_operator_and_the_option(docs, tmp_path):
    op = StopWorkerOp(tmp_path / "m", victim=5, always=True)
    pipe = faulty(docs[:80], op, "process", max_worker_retries=1, worker_deadline_s=1.0)
    start = time.monotonic()
    with pytest.raises(WorkerCrashedError, match=r"operator 'stop_worker'.*did not answer") as e:
        list(pipe)
    assert "worker_deadline_s" in str(e.value) and "max_worker_retries=1" in str(e.value)
    assert time.monotonic() - start < 100  # two deadlines of 1 s, not for ever


def test_worker_deadline_must_be_positive_or_none(docs):
    pipe = faulty(docs[:10], StopWorkerOp(Path("unused"), victim=-1), "process")
    with pytest.raises(ConfigError, match="worker_deadline_s must be positive"):
        pipe.options(worker_deadline_s=0)
    pipe.options(worker_deadline_s=None)
