"""Shared-memory segments belong to the run that made them: another PID namespace never sweeps
a live run's segments, a graceful SIGTERM keeps them for the work still in flight, and an
interpreter that exits while a worker is being respawned does not hang on it."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.engine._sources import RangeSource
from tests.runners._faulty import KillWorkerOp
from tests.runners._leaks import descendants_of, process_gone
from tests.runners._pipes import add_stats, big_array, key
from tests.runners._shm_child import CHILD, dead_pid
from zephon import Dataset, Pipeline
from zephon._engine.handoff import shm

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

# Runs the child in a new PID namespace as process ``PID`` there (``ns_last_pid``).
IN_NAMESPACE = textwrap.dedent(
    """
    import subprocess, sys
    with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
        fh.write(str(int(sys.argv[1]) - 1))
    sys.exit(subprocess.run([sys.executable, sys.argv[2]]).returncode)
    """
)


# root makes the namespace itself; anyone else does it inside a user namespace of their own
UNSHARE = [
    "unshare",
    *([] if os.geteuid() == 0 else ["--user", "--map-root-user"]),
    "--pid",
    "--fork",
    "--mount-proc",
]


@pytest.mark.timeout(120)
def test_a_sweep_from_another_pid_namespace_keeps_a_live_runs_segments(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    pid = dead_pid()  # free here, so a check by pid would call the run dead
    command = [*UNSHARE, sys.executable, "-c", IN_NAMESPACE]
    proc = subprocess.Popen(
        [*command, str(pid), str(script)], cwd=ROOT, env=ENV, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "READY", proc.communicate(timeout=60)[1]
    theirs = set(shm.segment_files(f"{shm.NAME_PREFIX}{pid}-"))
    assert theirs  # the run in the other namespace holds records in /dev/shm, named by pid
    shm.ShmSession().close()  # an engine starting here sweeps stale segments
    assert theirs <= set(shm.segment_files(f"{shm.NAME_PREFIX}{pid}-"))
    _out, err = proc.communicate("go\n", timeout=90)
    assert proc.returncode == 0, err  # it read every payload to the end
    assert shm.segment_files(f"{shm.NAME_PREFIX}{pid}-") == []  # and cleaned up


GRACEFUL = textwrap.dedent(
    """
    import signal, sys
    from tests.runners._pipes import describe, heavy

    if __name__ == "__main__":
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))  # like `zephon run`
        expected = [describe(b.records[0].payload) for b in heavy("inline", rows=96)]
        got = []
        it = iter(heavy("process", rows=96, queue_size=2))
        got.append(describe(next(it).records[0].payload))
        print("READY", flush=True)
        while not stop:
            signal.pause()
        got.extend(describe(b.records[0].payload) for b in it)  # in flight at the signal
        sys.exit(0 if got == expected else 3)
    """
)


def _start(tmp_path: Path, source: str, first_line: str) -> subprocess.Popen[str]:
    """Run ``source`` as a script; return once it has printed ``first_line``."""
    script = tmp_path / "script.py"
    script.write_text(source)
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == first_line, proc.communicate(timeout=60)[1]
    return proc


@pytest.mark.timeout(120)
def test_a_sigterm_turned_into_a_graceful_stop_keeps_the_segments_in_flight(tmp_path):
    proc = _start(tmp_path, GRACEFUL, "READY")
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    assert "respawned" not in err and "FileNotFoundError" not in err


EXIT_DURING_RESPAWN = textwrap.dedent(
    """
    import os, signal
    from tests.runners._pipes import heavy

    if __name__ == "__main__":
        pipe = heavy("process", rows=120, queue_size=2)
        it = iter(pipe)
        next(it)
        pids = [p for pool in pipe._engine.resources.pools for p in pool.fleet.pids()]
        os.kill(pids[0], signal.SIGKILL)  # its slot respawns while the interpreter exits
        print("EXITING", flush=True)
    """
)


@pytest.mark.timeout(120)
def test_the_interpreter_exits_while_a_worker_is_respawned(tmp_path):
    proc = _start(tmp_path, EXIT_DURING_RESPAWN, "EXITING")
    below = descendants_of(proc.pid)  # the forkserver and the workers
    _out, err = proc.communicate(timeout=90)  # before: joined a respawned worker forever
    assert proc.returncode == 0, err
    deadline = time.monotonic() + 60
    while not all(process_gone(pid) for pid in below):
        assert time.monotonic() < deadline, f"{below} outlived the run"
        time.sleep(0.05)


def _big_array_or_die(marker: str, payload: dict[str, Any]) -> dict[str, Any]:
    """``big_array``, except that the worker SIGKILLs itself on record 21 (once)."""
    if payload["id"] == 21 and not os.path.exists(marker):
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return big_array(payload)


def _payloads_through_a_killer(runner: str, marker: Path, *, killer: str) -> Pipeline:
    """Records carrying a 1 MiB array (in ``/dev/shm`` between processes) through a worker
    that SIGKILLs itself on record 21.

    ``killer="reader"``: the dying worker had mapped its input arrays, which another worker
    made; ``"writer"``: the dying worker made the arrays of the records before, which the next
    stage still reads after its death.
    """
    rows = [{"id": i} for i in range(48)]
    head = Pipeline(RangeSource([Dataset.from_records("rows", rows, shard_size=16)], 8))
    if killer == "reader":
        head = head.map_transform(big_array, parallelism=2).add_op(
            KillWorkerOp(marker, victim=21), parallelism=2
        )
    else:
        head = head.map_transform(partial(_big_array_or_die, str(marker)), parallelism=2)
    return (
        head.map_transform(add_stats, parallelism=2)
        .batch(4)
        .options(runner=runner, canonical_replicas=2, queue_size=2, fuse=False)
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("killer", ["reader", "writer"])
def test_a_worker_killed_mid_item_is_retried_from_the_original_payload(tmp_path, caplog, killer):
    marker = tmp_path / "killed"
    marker.touch()  # inline must not kill the test process
    expected = [key(b) for b in _payloads_through_a_killer("inline", marker, killer=killer)]
    marker.unlink()
    pipe = _payloads_through_a_killer("process", marker, killer=killer)
    with caplog.at_level(logging.WARNING, logger="zephon"):
        got = []
        for batch in pipe:
            assert shm.segment_files(f"{shm.NAME_PREFIX}{os.getpid()}-")  # payloads in /dev/shm
            got.append(key(batch))
    assert marker.exists()  # the worker holding record 21 really died mid-item
    assert "worker process" in caplog.text and "SIGKILL" in caplog.text
    assert "FileNotFoundError" not in caplog.text and "No such file" not in caplog.text
    assert got == expected
