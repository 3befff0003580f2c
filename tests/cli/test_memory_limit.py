"""``zephon run`` with the process runner under a memory limit (``ulimit -v``, a real
``RLIMIT_AS`` on the command and every process it starts) that a leaking operator exhausts
part-way through: each run fails with a message naming the operator, none hangs or dies of a
signal, and resuming without the limit gives exactly the uninterrupted run's output."""

from __future__ import annotations

import resource
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli._preempt import env
from tests.cli.conftest import PIPELINE_YAML, ZEPHON

LIMIT_KB = 700_000
"""Room to start the engine and its two workers, and for a few hundred of the operator's
2 MiB allocations in each worker (which asks for about 300 of them: more than the limit)."""

HOARD_OP = "  - op: map_transform\n    fn: 'tests.cli._custom_ops:hoard'\n"
HOARD_YAML = PIPELINE_YAML.replace("  - pack_flat:", f"{HOARD_OP}  - pack_flat:").replace(
    "runner: threads", "runner: process"
)


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_KB * 1024, LIMIT_KB * 1024))


def _zephon(folder: Path, *args: str, limited: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ZEPHON, "run", "hoard.yaml", "--quiet", *args], cwd=folder, env=env(),
        capture_output=True, text=True, timeout=120, preexec_fn=_limit if limited else None,
    )  # fmt: skip


def _fail_then_resume(workdir: Path, runs: int) -> None:
    (workdir / "hoard.yaml").write_text(HOARD_YAML)
    full = _zephon(workdir, "--record", "full.jsonl", limited=False)
    assert full.returncode == 0, full.stderr
    expected = (workdir / "full.jsonl").read_bytes()
    seen = []
    for run in range(runs):
        common = ("--checkpoint-dir", f"ck{run}", "--checkpoint-every", "10")
        record = ("--record", f"got{run}.jsonl")
        start = time.monotonic()
        failed = _zephon(workdir, *common, *record, limited=True)
        took = time.monotonic() - start
        error = failed.stderr.strip().splitlines()[-1] if failed.stderr.strip() else ""
        assert failed.returncode == 1, failed.stderr  # an error, not a signal (139) or a hang
        assert "Traceback" not in failed.stderr
        assert error.startswith("zephon run: error: operator 'map_transform': MemoryError: ")
        assert "lower the operator's parallelism" in error
        resumed = _zephon(workdir, *common, *record, "--resume", limited=False)
        assert resumed.returncode == 0, resumed.stderr
        assert (workdir / f"got{run}.jsonl").read_bytes() == expected
        seen.append((round(took, 1), failed.stdout.split(",")[0]))
    print("limited runs (seconds, summary):", seen)


@pytest.mark.timeout(900)
def test_runs_that_run_out_of_memory_name_the_operator_and_resume_exactly(workdir: Path):
    _fail_then_resume(workdir, runs=2)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_six_runs_that_run_out_of_memory_name_the_operator_and_resume_exactly(workdir: Path):
    _fail_then_resume(workdir, runs=6)
