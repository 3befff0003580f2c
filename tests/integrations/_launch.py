"""Start a real ``torchrun`` (or ``accelerate launch``) job on loopback and read what it did."""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 240  # a quiet job takes about 10 s here


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "TOKENIZERS_PARALLELISM": "false",
    }


def torchrun_argv(script: str, *args: object) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        str(ROOT / "tests" / "integrations" / script), *map(str, args),
    ]  # fmt: skip


def run_job(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a job to its end; fail with its output if it did not exit 0."""
    done = subprocess.run(
        argv, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=JOB_TIMEOUT_S
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done


def run_until_parked_then_kill(argv: list[str], ranks: int = 2) -> None:
    """Run a job whose ranks print ``parked RANK PID`` and wait; SIGKILL them all there."""
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    pids: dict[str, int] = {}
    seen: list[str] = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("parked "):
                _, rank, pid = line.split()
                pids[rank] = int(pid)
                if len(pids) == ranks:
                    break
        assert len(pids) == ranks, "".join(seen[-60:])
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        proc.stdout.read()  # torchrun reports the dead ranks and exits
        assert proc.wait(timeout=JOB_TIMEOUT_S) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def json_lines(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def delivered(out: Path, mode: str, rank: int) -> list[list[str]]:
    """The row digests of every batch the rank's pipelines delivered (all its processes)."""
    batches: list[list[str]] = []
    for name in sorted(glob.glob(str(out / f"delivered-{mode}-r{rank}-*.jsonl"))):
        batches.extend(json_lines(Path(name)))
    return batches
