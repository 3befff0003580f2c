"""zephon's Megatron data provider under Megatron-Bridge's use of the same hook: the provider
wrapped as ``dataloader_type="external"`` does, saved by Bridge's pipeline-0 / tensor-0 save into
``iter_*/train_dataloader_dprank*.pt`` (no ``mp_rank_*`` folder), SIGKILLed and resumed through
zephon's loader on 2 and 1 DP ranks with every sample trained once; with two pipeline stages
only the first saves and both resume from its file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.integrations import _megatron_save as lm
from tests.integrations._bridge_save import rank_file
from tests.integrations._corpus import build_pipeline
from tests.integrations._launch import (
    JOB_TIMEOUT_S,
    json_lines,
    run_job,
    run_until_parked_then_kill,
    torchrun_argv,
)
from tests.integrations._megatron_corpus import GLOBAL, MICRO, batch_line
from tests.integrations._megatron_job import PARK_AT
from tests.integrations._steps import assert_each_step, reference_steps, trained
from zephon.errors import CheckpointError
from zephon.integrations.megatron import MegatronDataProvider, load_generation

SCRIPT = "_megatron_job.py"
STEPS = 8


def provider(rank: int = 0, world: int = 1) -> MegatronDataProvider:
    return MegatronDataProvider(build_pipeline(), micro_batch_size=MICRO, global_batch_size=GLOBAL,
                                dp_rank=rank, dp_world_size=world)  # fmt: skip


@pytest.mark.timeout(5 * JOB_TIMEOUT_S)
def test_bridge_save_then_sigkill_resumes_on_two_and_one_ranks_with_every_sample_once(
    tmp_path: Path,
) -> None:
    killed = tmp_path / "killed"
    run_until_parked_then_kill(torchrun_argv(SCRIPT, killed, "bridge-park", STEPS), killed)
    saved = sorted(p.relative_to(killed) for p in (killed / "ckpt").rglob("*.pt"))
    assert saved == [rank_file(Path("ckpt"), i, r)
                     for i in range(1, PARK_AT + 1) for r in range(2)]  # fmt: skip
    reference = reference_steps(STEPS)
    before = trained(killed, "bridge-park", 2)
    assert sorted(before) == list(range(1, PARK_AT + 1))
    assert_each_step(before, reference)
    for world in (2, 1):
        resumed = tmp_path / f"resumed-{world}"
        shutil.copytree(killed / "ckpt", resumed / "ckpt")
        argv = torchrun_argv(SCRIPT, resumed, "bridge-resume", STEPS, PARK_AT, nproc=world)
        run_job(argv, resumed)
        after = trained(resumed, "bridge-resume", world)
        assert sorted(after) == list(range(PARK_AT + 1, STEPS + 1)), f"resumed on {world}"
        assert_each_step(after, reference)
    for rank in range(2):  # the same DP size continues bit for bit
        lines = json_lines(killed / f"bridge-park-r{rank}.jsonl")
        lines += json_lines(tmp_path / "resumed-2" / f"bridge-resume-r{rank}.jsonl")
        expected = provider(rank, 2)
        assert [{"rows": x["rows"], "batch": x["batch"]} for x in lines] == [
            batch_line(next(expected)) for _ in lines
        ]


@pytest.mark.timeout(3 * JOB_TIMEOUT_S)
def test_only_the_first_stage_saves_and_both_stages_resume_from_its_file(tmp_path: Path) -> None:
    killed, resumed = tmp_path / "killed", tmp_path / "resumed"
    argv = torchrun_argv(SCRIPT, killed, "bridge-park", STEPS, 0, 2)  # PP = 2, DP = 1
    run_until_parked_then_kill(argv, killed)
    saved = sorted(p.relative_to(killed) for p in (killed / "ckpt").rglob("*.pt"))
    assert saved == [rank_file(Path("ckpt"), i, 0) for i in range(1, PARK_AT + 1)]
    shutil.copytree(killed / "ckpt", resumed / "ckpt")
    run_job(torchrun_argv(SCRIPT, resumed, "bridge-resume", STEPS, PARK_AT, 2), resumed)
    expected = provider()
    reference = [batch_line(next(expected)) for _ in range(STEPS * expected.accumulation_steps)]
    for stage in range(2):  # the last stage reads the same batches, restored from stage 0's file
        lines = json_lines(killed / f"bridge-park-r{stage}.jsonl")
        lines += json_lines(resumed / f"bridge-resume-r{stage}.jsonl")
        assert [{"rows": x["rows"], "batch": x["batch"]} for x in lines] == reference


def save_as(path: Path, state: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"dataloader_state_dict": state}, path)


def test_bridge_layout_loads_and_its_missing_or_doubled_rank_files_are_refused(
    tmp_path: Path,
) -> None:
    saved = provider()
    for _ in range(saved.accumulation_steps):
        next(saved)
    state = saved.save_state()
    save_as(rank_file(tmp_path / "whole", 2, 0), state)
    resumed = provider()
    assert resumed.load_state(tmp_path / "whole") == 2
    assert batch_line(next(resumed)) == batch_line(next(saved))
    save_as(rank_file(tmp_path / "gone", 2, 1), state)
    with pytest.raises(CheckpointError, match=f"{rank_file(tmp_path / 'gone', 2, 0)} is missing"):
        load_generation(tmp_path / "gone", 2)
    (tmp_path / "none" / "iter_0000002").mkdir(parents=True)  # the model's files only
    with pytest.raises(CheckpointError, match="iter_0000002 holds no train_dataloader_dprank000"):
        load_generation(tmp_path / "none", 2)
    save_as(rank_file(tmp_path / "both", 2, 0), state)
    save_as(lm.rank_file(tmp_path / "both", 2, 0), state)
    with pytest.raises(CheckpointError, match="are both DP rank 0's file; keep the one"):
        load_generation(tmp_path / "both", 2)
