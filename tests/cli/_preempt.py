"""What the ``zephon run`` kill-and-resume tests share: a slow pipeline over a small corpus, a
way to start it in its own process group, and a poll for "the run has got that far"."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.cli.conftest import ZEPHON

REPO = Path(__file__).resolve().parents[2]

# shuffle + pack + batch over three shards, with an operator that does about 1 ms of work per
# record so that a run lasts long enough to be preempted at many points, and about 3 ms per
# batch after it (short queues), so that the engine's read-ahead cannot finish a run's last
# batches before a signal sent after a given batch arrives
PREEMPT_YAML = """\
datasets:
  - name: web
    path: my-data
source:
  chunk_size: 64
  seed: 7
operators:
  - decode_text
  - op: tokenize
    tokenizer: bytes
    max_length: 256
    truncation: true
  - op: map_transform
    fn: 'tests.cli._custom_ops:slow_identity'
  - op: shuffle
    buffer_size: 64
    seed: 3
  - pack_flat: {max_length: 256, pad_token_id: 0}
  - op: batch
    microbatch_size: 4
  - op: map_batch
    fn: 'tests.cli._custom_ops:slow_step'
runner: threads
options:
  canonical_replicas: 2
  flush_every_k_chunks: 2
  queue_size: 2
"""


def env() -> dict[str, str]:
    # this checkout's zephon, and tests.cli._custom_ops importable
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll ``condition`` until it holds (the run has got that far), failing after timeout."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def start(folder: Path, *args: str) -> subprocess.Popen[str]:
    command = [ZEPHON, "run", "p.yaml", "--quiet", *args]
    return subprocess.Popen(
        command, cwd=folder, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip


def uninterrupted(folder: Path, runner: str) -> bytes:
    record = folder / f"full-{runner}.jsonl"
    record.unlink(missing_ok=True)
    proc = start(folder, "--runner", runner, "--record", record.name)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return record.read_bytes()


def catches_sigterm(pid: int) -> bool:
    """Whether ``pid`` is Python with a handler for SIGTERM installed (``SigCgt`` in /proc);
    the ``zephon`` script's sh traps stop signals too, but only to hand them on to Python."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True  # gone: let the caller see how it ended
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if not fields.get("Name", "").strip().startswith("python"):
        return False
    mask = fields["SigCgt"].split()[0]
    return bool(int(mask, 16) >> (signal.SIGTERM - 1) & 1)
