"""``zephon run`` preempted (SIGTERM), asked for a checkpoint (SIGUSR1) or killed: the items it
delivers over all its runs are exactly those of an uninterrupted run."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest

from tests.cli._preempt import lines, start, uninterrupted, wait_for


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
