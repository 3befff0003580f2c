"""Start the inference stub and `zephon capture serve` as real processes on 127.0.0.1."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

__all__ = [
    "REPO",
    "Proc",
    "child_env",
    "start_inference_stub",
    "start_proxy",
    "wait_for_workers",
    "wait_group_gone",
]


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    url: str
    log: Path

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        return int(self.popen.returncode)

    def kill(self) -> None:
        """SIGKILL (a crash): no graceful shutdown."""
        self.popen.kill()
        self.popen.wait(10)

    def kill_group(self, timeout: float = 20.0) -> None:
        """SIGKILL the process and every process it started (a proxy's workers): the whole
        server crashes at once. Returns once none of them is left."""
        os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout)
        wait_group_gone(self.popen.pid, timeout)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


def wait_group_gone(pgid: int, timeout: float = 20.0) -> None:
    """Until no process of group ``pgid`` is left (a condition polled with a deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"processes of group {pgid} are still running"
        time.sleep(0.02)  # polling a condition of other processes, not synchronising on time


def child_env() -> dict[str, str]:
    """The environment of test children: this checkout on the path, and spill journals in a
    temporary folder rather than the user's state directory."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "src")]))
    env.setdefault("ZEPHON_CAPTURE_SPILL_DIR", os.path.join(tempfile.gettempdir(), "zephon-spill"))
    return env


def _spawn(
    cmd: list[str], marker: str, log: Path, timeout: float = 30.0
) -> tuple[subprocess.Popen[str], str]:
    err = open(log, "w")  # noqa: SIM115 - the child owns it
    # A session (and process group) of its own: kill_group reaches every process it starts.
    popen = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
        cwd=REPO,
        env=child_env(),
        start_new_session=True,
    )
    err.close()
    assert popen.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([popen.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        line = popen.stdout.readline()
        if not line:
            break
        if marker in line:
            return popen, line.strip()
    popen.kill()
    popen.wait()
    raise RuntimeError(f"{cmd[:4]} did not start: {log.read_text()[-2000:]}")


def start_inference_stub(tokenizer: Path, log_dir: Path, *extra: str) -> Proc:
    log = log_dir / f"engine-{time.monotonic_ns()}.log"
    cmd = [
        sys.executable,
        "-m",
        "tests.capture.proxy.inference_stub",
        "--tokenizer",
        str(tokenizer),
    ]
    popen, line = _spawn([*cmd, *extra], "ENGINE_PORT", log)
    return Proc(popen, f"http://127.0.0.1:{line.split()[-1]}", log)


def start_proxy(engine_url: str, store_url: str, log_dir: Path, *extra: str) -> Proc:
    """`zephon capture serve` through the CLI's capture group, on a free loopback port."""
    log = log_dir / f"proxy-{time.monotonic_ns()}.log"
    cmd = [
        sys.executable,
        "-c",
        # The `zephon capture` command group (zephon.cli registers the same group).
        "import sys; from zephon.cli._capture import main; sys.exit(main())",
        "serve",
        "--inference-server",
        engine_url,
        "--store",
        store_url,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *extra,
    ]
    popen, line = _spawn(cmd, "listening on", log)
    url = line.split("listening on ")[1].split()[0]
    return Proc(popen, url, log)


def wait_for_workers(proxy: Proc, count: int, timeout: float = 60.0) -> set[int]:
    """Until ``count`` distinct worker pids have answered the health route (each probe on a
    new connection); the supervisor prints its line before the workers finish starting."""
    import httpx

    pids: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(pids) < count:
        assert time.monotonic() < deadline, f"only workers {pids} answered"
        with httpx.Client(timeout=30) as client:
            resp = client.get(f"{proxy.url}/training-token-capture/control/health")
        pids.add(int(resp.json()["pid"]))
    return pids
