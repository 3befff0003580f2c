"""``--record`` holds every delivered item exactly once, whatever happened before the resume: a
kill before the first checkpoint, a second instance started on the same checkpoint directory,
the run folder moved between the kill and the resume."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

from tests.cli._preempt import lines, start, uninterrupted, wait_for


@pytest.fixture(scope="module")
def expected(preempt_dir: Path) -> bytes:
    return uninterrupted(preempt_dir, "threads")


@pytest.fixture
def run_dir(preempt_dir: Path, tmp_path: Path) -> Path:
    """A run folder of its own (corpus, config), so a test may move it."""
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copytree(preempt_dir / "my-data", folder / "my-data")
    shutil.copy(preempt_dir / "p.yaml", folder / "p.yaml")
    return folder


ARGS = ("--record", "rec.jsonl", "--checkpoint-dir", "ckpt", "--resume")


@pytest.mark.timeout(180)
def test_a_resume_without_any_checkpoint_starts_the_record_afresh(run_dir, expected):
    proc = start(run_dir, *ARGS)  # the default: a checkpoint only when the run stops
    wait_for(lambda: lines(run_dir / "rec.jsonl") >= 40 or proc.poll() is not None)
    proc.kill()  # the OOM killer: no checkpoint was ever written
    proc.communicate(timeout=60)
    assert not list((run_dir / "ckpt").glob("ckpt-*.json"))
    proc = start(run_dir, *ARGS)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "starts empty" in err
    assert (run_dir / "rec.jsonl").read_bytes() == expected


@pytest.mark.timeout(180)
def test_a_second_instance_is_refused_naming_the_first_and_the_lock_outlives_a_sigkill(
    run_dir, expected
):
    first = start(run_dir, *ARGS)
    wait_for(lambda: lines(run_dir / "rec.jsonl") >= 20 or first.poll() is not None)
    assert first.poll() is None, "the first run ended before the second could start"
    first.send_signal(signal.SIGSTOP)  # holds its lock, but cannot finish while the second starts
    second = start(run_dir, *ARGS)
    _out, err = second.communicate(timeout=60)
    assert second.returncode == 2, err
    assert f"in use by another zephon run (pid {first.pid} on " in err
    assert len(err.strip().splitlines()) == 1
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    third = start(run_dir, *ARGS)  # the kernel dropped the dead holder's lock
    _out, err = third.communicate(timeout=120)
    assert third.returncode == 0, err
    assert (run_dir / "rec.jsonl").read_bytes() == expected


@pytest.mark.timeout(180)
def test_a_run_folder_moved_between_kill_and_resume_still_cuts_the_record(
    run_dir, expected, tmp_path
):
    args = (*ARGS, "--checkpoint-every", "50")
    proc = start(run_dir, *args)
    wait_for(lambda: lines(run_dir / "rec.jsonl") >= 130 or proc.poll() is not None)
    proc.kill()  # items after the last checkpoint are on record
    proc.communicate(timeout=60)
    moved = tmp_path / "elsewhere"
    run_dir.rename(moved)  # another mount point, a renamed job folder
    proc = start(moved, *args)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert (moved / "rec.jsonl").read_bytes() == expected
