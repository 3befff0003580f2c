"""ZephonDataModule with a real ``lightning.Trainer`` on the CPU: SIGKILL after a checkpoint,
``ckpt_path=`` resume, every later step's batch and loss bit for bit equal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.integrations._launch import (
    ROOT,
    json_lines,
    run_job,
    run_until_parked_then_kill,
    torchrun_argv,
)
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


@pytest.mark.timeout(900)
@pytest.mark.parametrize("accumulation", [4, pytest.param(1, marks=pytest.mark.slow)])
def test_ddp_uneven_ranks_checkpoint_every_step_across_passes_and_resume_bitwise(
    tmp_path: Path, accumulation: int
) -> None:
    from tests.integrations._trainer_job import uneven_plan
    from tests.integrations.test_transformers import assert_uneven_passes

    steps, park_at = uneven_plan(accumulation)
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    args = [0, "uneven", accumulation]
    run_job(torchrun_argv("_lightning_job.py", reference, "fresh", *args), reference)
    ref = [json_lines(reference / f"fresh-r{rank}.jsonl") for rank in (0, 1)]
    assert_uneven_passes(ref, accumulation, steps)
    mixed = torch.load(reference / "ckpt" / f"step={park_at - 1}.ckpt", weights_only=False)
    data = next(v for k, v in mixed.items() if k.endswith("ZephonDataModule"))
    assert {lane.get("epoch", 0) for lane in data["lanes"].values()} == {0, 1}
    run_until_parked_then_kill(torchrun_argv("_lightning_job.py", killed, "park", *args), killed)
    run_job(torchrun_argv("_lightning_job.py", killed, "resume", *args), killed)
    for rank in (0, 1):
        resumed = json_lines(killed / f"resume-r{rank}.jsonl")
        assert resumed == [line for line in ref[rank] if line["step"] >= park_at]


def test_state_before_training_is_refused() -> None:
    from tests.integrations._corpus import build_pipeline

    with pytest.raises(ConfigError, match="before training started"):
        ZephonDataModule(build_pipeline()).state_dict()


# Lightning's own use of a torch pytree API torch deprecates (raised in the test's process)
@pytest.mark.filterwarnings("ignore:`isinstance.treespec, LeafSpec.` is deprecated:FutureWarning")
def test_a_trainer_without_max_steps_is_refused_naming_it(tmp_path: Path) -> None:
    import lightning.pytorch as pl

    from tests.integrations._corpus import build_pipeline
    from tests.integrations._lightning_job import TinyLlama

    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
    )  # fmt: skip
    model = TinyLlama(tmp_path / "steps.jsonl", park=False)
    with pytest.raises(ConfigError, match=r"set lightning\.Trainer\(max_steps=N\)"):
        trainer.fit(model, datamodule=ZephonDataModule(build_pipeline()))
    assert not (tmp_path / "steps.jsonl").exists()  # nothing trained
