"""``to_torch_dataset(endless=True, accumulation_steps=n)`` under real ``torchrun`` DDP ranks
whose passes differ in length: no hang, and every optimizer step within one pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrations._launch import json_lines, run_job, torchrun_argv
from tests.integrations._trainer_job import uneven_plan
from tests.integrations.test_transformers import assert_uneven_passes


@pytest.mark.timeout(600)
def test_uneven_ranks_train_whole_accumulation_groups_of_one_pass_without_a_hang(
    tmp_path: Path,
) -> None:
    accumulation = 4
    steps, _ = uneven_plan(accumulation)  # rank 0 goes through 3 passes, rank 1 through 4
    run_job(torchrun_argv("_dataset_job.py", tmp_path, accumulation, steps), tmp_path)
    ranks = [json_lines(tmp_path / f"fresh-r{rank}.jsonl") for rank in (0, 1)]
    assert_uneven_passes(ranks, accumulation, steps)
