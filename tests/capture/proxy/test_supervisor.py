"""The supervisor of `zephon capture serve --workers N` and the lifetime of its workers."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.capture.proxy._procs import Proc, start_proxy, wait_for_workers

pytestmark = pytest.mark.timeout(90)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_workers_stop_when_their_supervisor_is_killed(
    engine: Proc, logs: Path, tmp_path: Path
) -> None:
    """A SIGKILLed supervisor cannot stop its workers itself; they notice and stop, so no
    unsupervised worker keeps serving the port and the proxy can be restarted on it."""
    url = f"file://{tmp_path / 'capture'}"
    proxy = start_proxy(engine.url, url, logs, "--workers", "2")
    pids = wait_for_workers(proxy, 2)
    os.kill(proxy.popen.pid, signal.SIGKILL)  # only the supervisor
    proxy.stop()  # already dead: reaps it and closes its pipe
    deadline = time.monotonic() + 30
    while not all(_gone(pid) for pid in pids):
        assert time.monotonic() < deadline, f"workers {pids} outlived their supervisor"
        time.sleep(0.02)  # polling other processes' exit, not synchronising on time
    port = proxy.url.rsplit(":", 1)[1]
    again = start_proxy(engine.url, url, logs, "--workers", "2", "--port", port)
    try:
        assert again.url == proxy.url
        assert not wait_for_workers(again, 2) & pids  # served by new workers only
        with httpx.Client(timeout=30) as client:
            health = client.get(f"{again.url}/training-token-capture/control/health")
        assert health.status_code == 200
    finally:
        again.stop()
    assert "supervisor exited" in proxy.log.read_text()
