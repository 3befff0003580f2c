"""``zephon run`` preempted (SIGTERM), asked for a checkpoint (SIGUSR1) or killed: the items it
delivers over all its runs are exactly those of an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.conftest import ZEPHON
from zephon.demo import make_corpus

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


@pytest.fixture(scope="module")
def preempt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("preempt")
    make_corpus(folder / "my-data", docs=1500, shards=3)
    (folder / "p.yaml").write_text(PREEMPT_YAML)
    return folder


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}  # tests.cli._custom_ops is importable


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


@pytest.mark.timeout(300)
@pytest.mark.parametrize("runner", ["threads", "process"])
def test_sigterm_at_random_moments_then_resume_records_every_item_once(preempt_dir, runner):
    expected = uninterrupted(preempt_dir, runner)
    total = expected.count(b"\n")
    assert total > 300
    rng = random.Random(f"preempt-{runner}")
    targets = sorted(rng.sample(range(0, int(total * 0.85)), 6))
    record = preempt_dir / f"preempted-{runner}.jsonl"
    ckpt = preempt_dir / f"ckpt-{runner}"
    common = ("--runner", runner, "--record", record.name, "--checkpoint-dir", ckpt.name)
    for i, target in enumerate(targets):
        before = lines(record)  # the resume cuts the record back to the checkpoint, no lower
        proc = start(preempt_dir, *common, "--resume")
        # once this run has recorded an item of its own and `target` items are on record
        goal = max(target, before + 1)
        wait_for(lambda g=goal, p=proc: lines(record) >= g or p.poll() is not None)
        if runner == "process" and i % 2:
            os.killpg(proc.pid, signal.SIGTERM)  # Slurm: the whole job, workers included
        else:
            proc.send_signal(signal.SIGTERM)  # Kubernetes: the main process
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 143, err
        assert out.startswith("terminated: ") and "checkpoint: " in out
    proc = start(preempt_dir, *common, "--resume")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert record.read_bytes() == expected


@pytest.mark.timeout(120)
def test_sigusr1_checkpoints_and_the_run_goes_on(preempt_dir):
    ckpt = preempt_dir / "ckpt-usr1"
    record = preempt_dir / "usr1.jsonl"
    proc = start(preempt_dir, "--record", record.name, "--checkpoint-dir", ckpt.name)
    wait_for(lambda: lines(record) >= 20 or proc.poll() is not None)
    proc.send_signal(signal.SIGUSR1)
    wait_for(lambda: any(ckpt.glob("ckpt-*.json")) or proc.poll() is not None)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.startswith("completed: ")
    names = sorted(p.name for p in ckpt.glob("ckpt-*.json"))
    assert len(names) == 2  # the one SIGUSR1 asked for, mid-run, and the final one
    mid = int(names[0][5:15])
    assert 20 <= mid < lines(record)


@pytest.mark.timeout(120)
def test_a_kill_after_a_checkpoint_leaves_no_duplicate_in_the_record(preempt_dir):
    expected = uninterrupted(preempt_dir, "threads")
    ckpt = preempt_dir / "ckpt-kill"
    record = preempt_dir / "killed.jsonl"
    args = ("--record", record.name, "--checkpoint-dir", ckpt.name, "--checkpoint-every", "50")
    proc = start(preempt_dir, *args, "--resume")
    wait_for(lambda: lines(record) >= 130 or proc.poll() is not None)
    proc.kill()  # no handler runs: items 101..130+ are on record but after the last checkpoint
    proc.communicate(timeout=60)
    assert lines(record) > 100
    proc = start(preempt_dir, *args, "--resume")
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert record.read_bytes() == expected


def test_the_summary_of_a_terminated_run_is_json_too(preempt_dir):
    ckpt = preempt_dir / "ckpt-json"
    proc = start(preempt_dir, "--checkpoint-dir", ckpt.name, "--json", "--record", "j.jsonl")
    wait_for(lambda: lines(preempt_dir / "j.jsonl") >= 5 or proc.poll() is not None)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    summary = json.loads(out)
    assert summary["status"] == "interrupted" and summary["items"] >= 5
    assert Path(preempt_dir / summary["checkpoint"]).exists()
