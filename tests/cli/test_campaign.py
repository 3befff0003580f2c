"""A random kill-and-resume campaign of ``zephon run --resume --record``: SIGKILL, SIGTERM and
SIGINT of the main process or of its whole process group, a worker SIGKILLed as the OOM killer
does (numpy payloads through shared memory), and a second instance started on the same
checkpoint directory, with the runner switched every cycle. Whatever happens, the record of
each pass ends byte-identical to an uninterrupted run's: no line missing, none twice.

The full campaign (120 cycles) is ``-m slow``; CI runs a small one of the same cycles.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.cli._preempt import (
    PREEMPT_YAML,
    catches_sigterm,
    lines,
    start,
    uninterrupted,
    wait_for,
)
from tests.runners._leaks import comm_of, descendants_of

CAMPAIGN_YAML = PREEMPT_YAML.replace("  queue_size: 2\n", "  queue_size: 2\n  shm_min_bytes: 64\n")
ACTIONS = ("term", "int", "kill", "term_group", "kill_group", "kill_worker", "double_start")
# what the main process may end with after each action (it may also have finished first: 0;
# after a double start it may be the one refused: 2)
EXITS = {
    "term": {143, 0}, "int": {130, 0}, "kill": {-9, 0}, "term_group": {143, 0},
    "kill_group": {-9, 0}, "kill_worker": {143, 0}, "double_start": {143, 0, 2},
}  # fmt: skip


@pytest.fixture(scope="module")
def campaign_dir(preempt_dir: Path) -> Path:
    (preempt_dir / "p.yaml").write_text(CAMPAIGN_YAML)
    return preempt_dir


def _kill_a_worker(proc: subprocess.Popen[str]) -> bool:
    """SIGKILL one process-runner worker of ``proc``; False when it has none (threads)."""
    workers = [p for p in descendants_of(proc.pid) if comm_of(p).startswith("zephon-worker")]
    if not workers:
        return False
    os.kill(workers[0], signal.SIGKILL)
    return True


def _second_instance(
    first: subprocess.Popen[str], folder: Path, common: tuple[str, ...]
) -> str | None:
    """Start a second run on the same checkpoint directory: one of the two is refused (the
    second, or the first when the second took the lock before the first got to it), or the
    first had finished its run. Returns the first's stderr when this reaped it."""
    second = start(folder, *common)
    _out, err = second.communicate(timeout=120)
    if second.returncode == 2:
        assert "in use by another zephon run" in err, err
        return None
    assert second.returncode == 0, err
    _out, first_err = first.communicate(timeout=120)
    refused = first.returncode == 2 and "in use by another zephon run" in first_err
    assert first.returncode == 0 or refused, f"two instances ran at once: {first_err}"
    return first_err


def _act(
    action: str, proc: subprocess.Popen[str], folder: Path, common: tuple[str, ...]
) -> str | None:
    """Do ``action`` to the run ``proc``; its stderr when it was reaped here."""
    if action == "double_start":
        reaped = _second_instance(proc, folder, common)
        if reaped is not None:
            return reaped
    elif action == "kill_worker" and not _kill_a_worker(proc):
        pass  # the threads runner has no worker process: the SIGTERM below still comes
    if action in ("double_start", "kill_worker", "term"):
        proc.send_signal(signal.SIGTERM)
    elif action == "int":
        proc.send_signal(signal.SIGINT)
    elif action == "kill":
        proc.kill()
    elif action in ("term_group", "kill_group"):
        os.killpg(proc.pid, signal.SIGTERM if action == "term_group" else signal.SIGKILL)


def _campaign(folder: Path, cycles: int, seed: str) -> dict[str, int]:
    expected = uninterrupted(folder, "threads")
    total = expected.count(b"\n")
    rng = random.Random(seed)
    record, ckpt = folder / f"camp-{seed}.jsonl", folder / f"camp-{seed}"
    passes, done = 0, {a: 0 for a in ACTIONS}
    for _cycle in range(cycles):
        runner = rng.choice(["threads", "process"])
        common = ("--runner", runner, "--record", record.name, "--checkpoint-dir", ckpt.name,
                  "--resume", "--checkpoint-every", str(rng.choice([0, 7, 25])))  # fmt: skip
        proc = start(folder, *common)
        goal = min(total, lines(record) + rng.randint(1, 60))
        wait_for(lambda g=goal, p=proc: lines(record) >= g or p.poll() is not None, 120)
        # a signal before the interpreter runs our first line kills any Python program
        wait_for(lambda p=proc: catches_sigterm(p.pid) or p.poll() is not None)
        action = rng.choice(ACTIONS)
        reaped = None
        if proc.poll() is None:
            reaped = _act(action, proc, folder, common)
            done[action] += 1
        err = reaped if reaped is not None else proc.communicate(timeout=120)[1]
        assert proc.returncode in EXITS[action], (action, proc.returncode, err[-2000:])
        if proc.returncode == 0:  # the pass is complete: it must be the uninterrupted one
            assert record.read_bytes() == expected, f"pass {passes}, cycle {_cycle}"
            passes += 1
            record.unlink()
            shutil.rmtree(ckpt)
    proc = start(folder, "--record", record.name, "--checkpoint-dir", ckpt.name, "--resume")
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert record.read_bytes() == expected
    return {"passes": passes + 1, **done}


@pytest.mark.timeout(600)
def test_a_small_random_campaign_records_every_item_once(campaign_dir):
    done = _campaign(campaign_dir, 8, "ci")
    assert sum(done[a] for a in ACTIONS) >= 4


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_random_campaign_of_120_cycles_records_every_item_once(campaign_dir):
    done = _campaign(campaign_dir, 120, "full")
    print("campaign:", done)
    assert all(done[a] for a in ACTIONS)
