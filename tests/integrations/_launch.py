"""Start a real ``torchrun`` (or ``accelerate launch``) job on loopback and read what it did."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests._ports import free_port
from zephon.distributed import exit_rank

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 240  # a quiet job takes about 10 s here


def job_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT))),  # this checkout's zephon
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "TOKENIZERS_PARALLELISM": "false",
    }


def torchrun_argv(script: str, *args: object, nproc: int = 2) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", str(nproc),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        str(ROOT / "tests" / "integrations" / script), *map(str, args),
    ]  # fmt: skip


def run_job(
    argv: list[str], out: Path, timeout: float = JOB_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run a job to its end; fail with its output if it did not exit 0."""
    try:
        done = subprocess.run(
            argv, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=timeout
        )
    finally:
        kill_ranks(out)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done


def kill_ranks(out: Path) -> list[int]:
    """SIGKILL every rank process the job under ``out`` started that is still alive.

    torchrun starts its ranks in sessions of their own, so they outlive a killed launcher;
    each rank writes ``out/pids/<pid>`` first thing.
    """
    killed = []
    for entry in sorted((out / "pids").glob("*")):
        try:
            os.kill(int(entry.name), signal.SIGKILL)
            killed.append(int(entry.name))
        except ProcessLookupError:
            pass
        entry.unlink()  # handled: a later job's cleanup must not signal a reused pid
    return killed


def run_until_parked_then_kill(argv: list[str], out: Path, ranks: int = 2) -> None:
    """Run a job whose ranks print ``parked RANK PID`` and wait; SIGKILL them all there."""
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    parked: set[str] = set()
    seen: list[str] = []
    try:
        for line in proc.stdout:  # ranks share the launcher's stdout: lines may interleave
            seen.append(line)
            parked.update(re.findall(r"parked (\d+) \d+", line))
            if len(parked) == ranks:
                break
        assert len(parked) == ranks, "".join(seen[-250:])
        assert len(kill_ranks(out)) == ranks
        proc.stdout.read()  # torchrun reports the dead ranks and exits
        assert proc.wait(timeout=JOB_TIMEOUT_S) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        kill_ranks(out)


def record_pid(out: Path) -> None:
    """Called by each rank first thing, so that :func:`kill_ranks` can find it."""
    (out / "pids").mkdir(parents=True, exist_ok=True)
    (out / "pids" / str(os.getpid())).touch()


@contextmanager
def rank_exit() -> Iterator[None]:
    """Wrap the body of the function that holds a rank's model: the process ends through
    :func:`zephon.distributed.exit_rank` when the body ends (its exit code when it raises
    ``SystemExit``, 1 with the traceback for any other error).

    It ends inside the body's frame, while the model is still referenced: freeing a DDP model
    joins PyTorch's gloo threads while holding the GIL, and one of those threads may still be
    waiting for the GIL to release the last collective (a deadlock seen in 5 of 8 loaded runs).
    A bare gloo DDP job that simply returned aborted at exit in 13 of 40 loaded runs.
    Outside a launched rank (no ``RANK`` in the environment: a test calling the job's function
    in its own process) it does nothing.
    """
    if "RANK" not in os.environ:
        yield
        return
    code = 0
    try:
        yield
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_rank(code)


def json_lines(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def delivered(out: Path, mode: str, rank: int) -> list[list[str]]:
    """The row digests of every batch the rank's pipelines delivered (all its processes)."""
    batches: list[list[str]] = []
    for name in sorted(glob.glob(str(out / f"delivered-{mode}-r{rank}-*.jsonl"))):
        batches.extend(json_lines(Path(name)))
    return batches
