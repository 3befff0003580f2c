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


@pytest.mark.timeout(400)
# Lightning's own use of a torch pytree API torch deprecates (raised in the test's process)
@pytest.mark.filterwarnings("ignore:`isinstance.treespec, LeafSpec.` is deprecated:FutureWarning")
# the resume writes its checkpoints to a folder of its own
@pytest.mark.filterwarnings("ignore:The dirpath has changed:UserWarning")
def test_each_training_epoch_is_the_next_pass_and_a_resume_mid_epoch_continues_it(
    tmp_path: Path,
) -> None:
    from tests.integrations._corpus import epoch_rows
    from tests.integrations._lightning_job import fit

    docs = 24  # 10 batches an epoch: 25 steps end in the third epoch
    epochs = [epoch_rows(docs, epoch) for epoch in range(3)]
    assert epochs[0] != epochs[1] != epochs[2]
    fresh, resumed = tmp_path / "fresh", tmp_path / "resumed"
    fresh.mkdir(), resumed.mkdir()
    fit(fresh, "fresh", 0, steps=25, docs=docs)
    reference = json_lines(fresh / "fresh.jsonl")
    assert [line["rows"] for line in reference] == [b for e in epochs for b in e][:25]
    fit(resumed, "resume", 0, steps=25, docs=docs, ckpt=str(fresh / "ckpt" / "step=15.ckpt"))
    assert json_lines(resumed / "resume.jsonl") == reference[15:]


def test_state_before_training_is_refused() -> None:
    from tests.integrations._corpus import build_pipeline

    with pytest.raises(ConfigError, match="before training started"):
        ZephonDataModule(build_pipeline()).state_dict()
