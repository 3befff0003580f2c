"""A stop signal before ``zephon run`` delivers its first item (imports, config, restore, first
batch, the process runner's forkserver) ends it at once with exit 143/130 and a one-line
summary, never with the signal's own death or exit 1, from the first line the command runs."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.cli._preempt import catches_sigterm, env, start, wait_for
from tests.cli.conftest import ZEPHON
from tests.runners._leaks import descendants_of

STALL_YAML = """\
datasets:
  - name: web
    path: my-data
operators:
  - decode_text
  - op: map_transform
    fn: 'tests.cli._custom_ops:stall'
runner: threads
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("signum", "code", "status"), [
    (signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted"),
])  # fmt: skip
def test_a_stop_as_soon_as_the_command_handles_signals(preempt_dir, signum, code, status):
    proc = start(preempt_dir, "--checkpoint-dir", f"ckpt-early-{code}")
    wait_for(lambda: catches_sigterm(proc.pid))  # still importing the engine and numpy
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert out.startswith(f"{status}: 0 items while starting") and out.count("\n") == 1


@pytest.mark.timeout(120)
def test_a_sigterm_during_a_first_batch_that_takes_minutes_ends_the_run_at_once(preempt_dir):
    (preempt_dir / "stall.yaml").write_text(STALL_YAML)
    marker = preempt_dir / "stalled"
    marker.unlink(missing_ok=True)
    command = ["run", "stall.yaml", "--quiet", "--json", "--checkpoint-dir", "ckpt-stall"]
    proc = subprocess.Popen(
        [ZEPHON, *command], cwd=preempt_dir,
        env={**env(), "ZEPHON_TEST_STALLED": str(marker)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for(lambda: marker.exists() or proc.poll() is not None)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)  # the batch would take two more minutes
    took = time.monotonic() - sent
    assert proc.returncode == 143, err
    summary = json.loads(out)
    assert summary["status"] == "terminated" and summary["items"] == 0
    print(f"stopped {took:.2f} s after the SIGTERM")


@pytest.mark.timeout(120)
def test_ctrl_c_while_the_forkserver_starts_is_exit_130(preempt_dir):
    proc = start(preempt_dir, "--runner", "process", "--checkpoint-dir", "ckpt-fork")
    wait_for(lambda: bool(descendants_of(proc.pid)) or proc.poll() is not None)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert out.startswith("interrupted: ") and "Traceback" not in err, err


def _stop_at(preempt_dir, delay: float, signum: int, module: bool) -> tuple[int, str, str]:
    """Start ``zephon run`` (or ``python -m zephon run``), send ``signum`` ``delay`` seconds
    after its entry point's first line installed the handlers (SigCgt shows SIGTERM caught:
    before that, the interpreter itself is starting and no Python code can run)."""
    head = [sys.executable, "-m", "zephon"] if module else [ZEPHON]
    proc = subprocess.Popen(
        [*head, "run", "p.yaml", "--quiet"], cwd=preempt_dir, env=env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for(lambda: proc.poll() is not None or catches_sigterm(proc.pid))
    time.sleep(delay)  # the moment under test, not a wait for anything
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def _check_stops(preempt_dir, delays: list[float]) -> None:
    bad = []
    for i, delay in enumerate(delays):
        signum = (signal.SIGINT, signal.SIGTERM)[i % 2]
        code, out, err = _stop_at(preempt_dir, delay, signum, module=i % 3 == 2)
        expected = 130 if signum == signal.SIGINT else 143
        if code != expected or "Traceback" in err or not out.strip():
            bad.append((round(delay, 3), signum.name, code, err[-400:]))
    assert bad == []


@pytest.mark.timeout(600)
def test_stop_signals_spread_over_the_first_half_second_all_exit_130_or_143(preempt_dir):
    """16 moments over the imports, the config and the first batch; one in three through
    ``python -m zephon``: each exits 130 (SIGINT) or 143 (SIGTERM) with its summary line."""
    _check_stops(preempt_dir, [i * 0.5 / 16 for i in range(16)])


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_fifty_random_stop_signals_in_the_first_half_second_all_exit_130_or_143(preempt_dir):
    rng = random.Random(2026)
    _check_stops(preempt_dir, [rng.uniform(0.0, 0.5) for _ in range(50)])
