"""ZephonDataModule with a real ``lightning.Trainer`` on the CPU: SIGKILL after a checkpoint,
``ckpt_path=`` resume, every later step's batch and loss bit for bit equal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integrations._launch import ROOT, json_lines, run_job, run_until_parked_then_kill
from zephon.errors import ConfigError
from zephon.integrations.lightning import ZephonDataModule

CHECKPOINT, PARKED = 10, 12


def job(out: Path, mode: str, workers: int) -> list[str]:
    script = ROOT / "tests" / "integrations" / "_lightning_job.py"
    return [sys.executable, str(script), str(out), mode, str(workers)]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("workers", [2, pytest.param(0, marks=pytest.mark.slow)])
def test_sigkill_after_a_checkpoint_then_ckpt_path_resumes_bitwise(
    tmp_path: Path, workers: int
) -> None:
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    run_job(job(reference, "fresh", workers), reference)
    run_until_parked_then_kill(job(killed, "park", workers), killed, ranks=1)
    run_job(job(killed, "resume", workers), killed)
    ref = json_lines(reference / "fresh.jsonl")
    assert [line["step"] for line in ref] == list(range(1, 21))
    assert json_lines(killed / "park.jsonl") == ref[:PARKED]
    # Lightning read a batch ahead of step 10; the resume starts with step 11's batch anyway
    assert json_lines(killed / "resume.jsonl") == ref[CHECKPOINT:]


def test_state_before_training_is_refused() -> None:
    from tests.integrations._corpus import build_pipeline

    with pytest.raises(ConfigError, match="before training started"):
        ZephonDataModule(build_pipeline()).state_dict()
